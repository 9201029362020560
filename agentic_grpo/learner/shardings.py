"""The learner's jit shardings on a device mesh: `Shardings`, hashable `TreeShardings`, and
`learner_shardings` (from `jax.eval_shape` of the train state)."""

import dataclasses
from typing import Any, Optional

import jax
import numpy as np

from agentic_grpo import parallel
from agentic_grpo.learner.state import init_state
from agentic_grpo.models import placement
from agentic_grpo.models import transformer

@dataclasses.dataclass(frozen=True)
class Shardings:
  """In/out shardings of the jitted steps (any pytree prefix accepted by `jax.jit`).

  Attributes:
    state: sharding (prefix) of `TrainState`.
    batch: sharding (prefix) of the `UpdateBatch` / `SFTBatch`.
    ref_params: sharding (prefix) of the reference parameters.
  """
  state: Any
  batch: Any
  ref_params: Any

  @classmethod
  def replicated(cls, mesh: Optional[jax.sharding.Mesh] = None) -> "Shardings":
    """Everything replicated over `mesh` (default: a mesh of the first device)."""
    if mesh is None:
      mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("data",))
    rep = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    return cls(state=rep, batch=rep, ref_params=rep)


@dataclasses.dataclass(frozen=True, eq=False)
class TreeShardings(Shardings):
  """`Shardings` holding sharding *trees*, hashable by value.

  The learner caches its jitted steps on the shardings; `nnx.State` and
  `TrainState` trees are not hashable, so equality and hash here compare the
  flattened tree structure and its `NamedSharding` leaves.
  """

  def _key(self):
    leaves, treedef = jax.tree.flatten((self.state, self.batch, self.ref_params))
    return str(treedef), tuple(leaves)

  def __hash__(self):
    return hash(self._key())

  def __eq__(self, other):
    return isinstance(other, TreeShardings) and self._key() == other._key()


def learner_shardings(model_config: transformer.ModelConfig, mesh: jax.sharding.Mesh,
                      optimizer: Any, rules: Optional[parallel.Rules] = None, *,
                      with_reference: bool = True
                      ) -> tuple[placement.ShardedModel, Shardings]:
  """The learner's jit shardings on `mesh`, from `jax.eval_shape` of its state.

  Args:
    model_config: the model shape.
    mesh: from `parallel.make_mesh`.
    optimizer: the learner's optax transformation (`make_optimizer`); any
      optimizer with the same state structure shares these shardings.
    rules: logical axis rules; default `parallel.DEFAULT_RULES`.
    with_reference: the step takes reference parameters (KL term on); when
      False the step's `ref_params` argument may be None.

  Returns:
    `(sharded_model, TreeShardings)` (a hashable `Shardings`): `TrainState`
    parameters and parameter-shaped optimizer moments sharded by the rules,
    counters and PRNG key replicated; reference parameters like the
    parameters (or a replicated prefix that also fits None, without
    reference); batches `None`: the step takes the batch's own sharding, so
    place batches with `parallel.put_batch` / `parallel.shard_batch`, which
    split rows as far as their count allows (one compilation per batch shape).

  Raises:
    ValueError: `model_config` is not a `ModelConfig`, or bad `rules`.
  """
  sm = placement.shard_model(model_config, mesh, rules)
  plain = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), sm.abstract_params)
  abstract_state = jax.eval_shape(lambda p: init_state(p, optimizer, 0), plain)
  return sm, TreeShardings(state=placement.tree_shardings_like(abstract_state, sm),
                           batch=None,
                           ref_params=(sm.param_shardings if with_reference
                                       else jax.sharding.NamedSharding(
                                           mesh, jax.sharding.PartitionSpec())))
