"""THE door between host and device: `DeviceSide` (update, sft, sample, state) and the model.

Everything the run does on the accelerator goes through this module (the sampler's programs
through `train.sampling`, which `DeviceSide.sampler` and evaluation call): building the model
structure and its shardings (`build_model`), the learner state (fresh, restored, handed over
from the warm-start to the RL phase, written to checkpoints), the jitted update and warm-start
steps, and the sampler (`train.sampling`). Host code passes NumPy in (`core.types.UpdateBatch`,
`core.types.SFTBatch`, prompt arrays) and gets NumPy out (`fetch`, the sampler's rows); it holds
device values only as opaque handles (`Pending` metrics, `DeviceSide.policy`), never reads them.

Every host-device copy here is explicit (`jax.device_put`, `parallel.shard_batch`,
`parallel.local_rows`, `jax.device_get`), so that the hot loop runs under
`jax.transfer_guard("disallow")` (`run(..., transfer_guard="disallow")` in tests): a hidden
copy fails loudly.

Batch rows: each process places its own rows of the global batch (`parallel.shard_batch`; with
one process the whole batch) and reads its own rows of the sampler's output back
(`parallel.local_rows`).
"""

import dataclasses
import math
import threading
from typing import Any, Optional, Sequence

from absl import logging

import jax
import jax.numpy as jnp
import numpy as np

from agentic_grpo import config as config_lib
from agentic_grpo import learner
from agentic_grpo import parallel
from agentic_grpo.checkpoint import checkpointer
from agentic_grpo.core import losses as losses_lib
from agentic_grpo.core import types as core_types
from agentic_grpo.models import placement
from agentic_grpo.models import sources
from agentic_grpo.models import transformer
from agentic_grpo.replay import batching
from agentic_grpo.train import sampling


NonFiniteUpdatesError = learner.NonFiniteUpdatesError


@dataclasses.dataclass(frozen=True)
class ModelParts:
  """The model side of `Components`: tokenizer, structure, mesh, shardings and the source the
  parameters come from (`models.sources.ModelSource`: a preset's random init or a checkpoint)."""
  tokenizer: Any
  model_config: transformer.ModelConfig
  graphdef: Any
  mesh: jax.sharding.Mesh
  sharded_model: placement.ShardedModel
  shardings: learner.Shardings
  source: sources.ModelSource


def rl_optimizer(cfg: config_lib.TrainConfig):
  """The RL phase's optimizer: `optim`, with its schedule spanning `rl.num_steps` updates of
  `rl.ppo_epochs` optimizer steps each (the warm-up too: `optim.warmup_steps` updates)."""
  epochs = cfg.rl.ppo_epochs
  return learner.make_optimizer(
      cfg.optim, warmup_steps=cfg.optim.warmup_steps * epochs,
      decay_steps=cfg.rl.num_steps * epochs if cfg.optim.schedule == "cosine" else 0,
      final_lr_fraction=cfg.optim.final_lr_fraction)


def warmstart_optimizer(cfg: config_lib.TrainConfig):
  """The warm-start's optimizer: `optim` at `warmstart.learning_rate`, over `warmstart.steps`."""
  return learner.make_optimizer(
      cfg.optim, learning_rate=cfg.warmstart.learning_rate,
      warmup_steps=cfg.warmstart.warmup_steps, decay_steps=cfg.warmstart.steps,
      final_lr_fraction=cfg.warmstart.final_lr_fraction)


def build_model(cfg: config_lib.TrainConfig) -> ModelParts:
  """Tokenizer, model structure (no parameters yet), mesh and learner shardings.

  The model comes from `config.model.source` (`models.sources.open_model`: a preset with the
  byte tokenizer, or a Hugging Face directory with its own tokenizer), checked before any device
  memory is spent.

  Raises:
    ValueError: a bad model source (naming the field or file), or a model shorter than
      `rl.buckets[-1] + workflow.max_new_tokens`.
  """
  needed = cfg.rl.buckets[-1] + cfg.workflow.max_new_tokens
  source = sources.open_model(cfg.model, min_seq_len=needed)
  mesh = parallel.make_mesh(cfg)
  sharded_model, shardings = learner.learner_shardings(
      source.model_config, mesh, rl_optimizer(cfg), cfg.mesh.rules(),
      with_reference=cfg.loss.kl_beta > 0)
  return ModelParts(source.tokenizer, source.model_config, source.graphdef, mesh, sharded_model,
                    shardings, source)


def packs_prefixes(cfg: config_lib.TrainConfig) -> bool:
  """Whether the RL phase's update batches are packed (`rl.pack_prefix`, and a loss additive
  over a row's tokens: `core.losses.segments_additive`)."""
  return cfg.rl.pack_prefix and losses_lib.segments_additive(cfg.loss.ratio_level,
                                                              cfg.loss.aggregation)


def prefix_packing(comp, row_granule: int) -> Optional[batching.PrefixPacking]:
  """The replay's shared-prefix packing (`replay.batching.PrefixPacking`: `rl.packed_buckets`)
  of a run built as `comp`, its update rows multiples of `row_granule`; None when
  `packs_prefixes` is False."""
  if not packs_prefixes(comp.cfg):
    return None
  return batching.PrefixPacking(comp.cfg.rl.packed_lengths(), row_granule)


def _pad_batch(batch: core_types.UpdateBatch, rows: int, length: int) -> core_types.UpdateBatch:
  """`batch` (a packed one) padded with padding rows and slots to `[rows, length]`."""
  n, t = batch.tokens.shape
  if (n, t) == (rows, length):
    return batch
  out = core_types.UpdateBatch.padding(rows, length, packed=True)
  for name in ("tokens", "loss_mask", "behaviour_logprobs", "advantages", "branches"):
    getattr(out, name)[:n, :t] = getattr(batch, name)
  out.positions[:n, :t] = batch.positions
  out.sample_weights[:n] = batch.sample_weights
  return out


def initial_policy(comp) -> Any:
  """The parameters a run starts from (`config.model.source`: a preset's random init from
  `seed`, or the checkpoint's weights), in the learner's shardings; an opaque handle for
  `sampling.make_sample_fn`."""
  return comp.model_source.params(comp.sharded_model, jax.random.key(comp.cfg.seed))


def restore_policy(comp, ckpt: checkpointer.Checkpointer, step: int) -> tuple[Any, dict]:
  """The policy parameters of checkpoint `step` of a run built as `comp`, and its meta.

  Reads only the parameters of the saved learner state into an abstract target of `comp`'s
  shardings, without first materialising a fresh state: the optimizer's moments, the float32
  master and the KL reference stay on disk (`Checkpointer.restore(only=...)`), so evaluating
  a checkpoint needs the memory of the parameters alone. Returns an opaque handle for
  `sampling.make_sample_fn`.

  Raises:
    FileNotFoundError, checkpointer.CheckpointIntegrityError: as `Checkpointer.restore`.
    ValueError: the checkpoint's tree does not match `comp.cfg` (another model shape).
  """
  return learner.restore_field(ckpt, step, comp.sharded_model.abstract_params,
                               rl_optimizer(comp.cfg), comp.shardings.state,
                               reference_in_rl=comp.cfg.loss.kl_beta > 0)


@dataclasses.dataclass(frozen=True)
class Pending:
  """Metrics of a dispatched step, still on the device (read them with `DeviceSide.fetch`).

  Attributes:
    metrics: the step's metrics (device scalars; opaque to host code).
    tokens: token slots of the global batch (`rows * T`), for tokens/s.
    row_slots: this process's rows computed, when not the batch's (`rl.update_chunk_rows`:
      its real rows padded to whole chunks); None otherwise.
  """
  metrics: Any
  tokens: int
  row_slots: Optional[int] = None


class DeviceSide:
  """The learner state on the device and every step that changes it. See module docstring.

  Args:
    comp: the run's `Components`.
    transfer_guard: `jax.transfer_guard` level of the hot loop's device calls (`sft`,
      `update`, `fetch`, the sampler): "allow" (default), or "disallow" / "log" (tests: a
      hidden host-device copy fails loudly).
  """

  def __init__(self, comp, *, transfer_guard: str = "allow"):
    cfg = comp.cfg
    self._comp = comp
    self._cfg = cfg
    self._transfer_guard = transfer_guard
    self._ws_opt = warmstart_optimizer(cfg)
    self._rl_opt = rl_optimizer(cfg)
    self._use_kl = cfg.loss.kl_beta > 0
    # A preset's random init from `seed`, or the checkpoint's weights, in the learner's shardings.
    self._params0 = initial_policy(comp)
    self._state = jax.device_put(
        learner.init_state(self._params0, self._ws_opt if cfg.warmstart.steps else self._rl_opt,
                           cfg.seed), comp.shardings.state)
    self._ref = None
    self._sft_step = self._update_step = None
    self._chunked: Optional[learner.ChunkedUpdate] = None
    # `rl.update_chunk_rows`, this process's rows of a chunk: rounded up so that a global
    # chunk (every process's) splits over the mesh's batch shards as a full update's rows do.
    self._chunk_rows = cfg.rl.update_chunk_rows
    if self._chunk_rows:
      self._chunk_rows = math.lcm(self._chunk_rows, self.row_granule(comp.coord.process_count))
    # The RL update step's compilations running ahead (`compile_rl_updates`), joined by the
    # first `update`.
    self._compiling: Optional[threading.Thread] = None

  @property
  def policy(self) -> Any:
    """The current parameters, an opaque handle for the agent loop's `sample_fn`."""
    return self._state.params

  @property
  def state(self) -> learner.TrainState:
    """The learner state (for results and tests)."""
    return self._state

  def sampler(self, seed: int, temperature: Optional[float] = None):
    """`sampling.make_sample_fn` under this run's transfer guard."""
    return sampling.make_sample_fn(self._comp, seed, temperature=temperature,
                                   transfer_guard=self._transfer_guard)

  def restore(self, ckpt: checkpointer.Checkpointer) -> tuple[dict, dict]:
    """Loads the latest intact checkpoint into the device state; returns its `(host, meta)`.

    Raises:
      ValueError: the checkpoint's tree does not match this config (e.g. a reference policy).
    """
    # The reference policy exists (and is saved) from the start of the RL phase on.
    with_ref = self._use_kl and ckpt.read_meta()["phase"] == "rl"
    abstract = {"state": self._state, "ref": self._params0} if with_ref else {"state": self._state}
    try:
      restored, host, meta = ckpt.restore(None, abstract,
                                          derivations=learner.STATE_DERIVATIONS)
    except ValueError as e:  # Orbax: the saved tree differs from `abstract`.
      raise ValueError(f"cannot resume from {ckpt.directory}: the checkpoint does not match "
                       f"this config (e.g. loss.kl_beta > 0 now but the RL phase was saved "
                       f"without a reference policy): {e}") from e
    sh = self._comp.shardings
    self._state = jax.device_put(restored["state"], sh.state)
    if with_ref:
      self._ref = jax.device_put(restored["ref"], sh.ref_params)
    return host, meta

  def checkpoint_tree(self) -> dict[str, Any]:
    """The device state a checkpoint holds: `{"state"[, "ref"]}`."""
    return {"state": self._state, "ref": self._ref} if self._ref is not None else {
        "state": self._state}

  def _rl_update_step(self):
    if self._update_step is None:
      self._update_step = learner.make_update_step(self._comp.graphdef, self._cfg,
                                                   self._rl_opt, shardings=self._comp.shardings,
                                                   vocab_limit=sampling.vocab_limit(self._comp))
    return self._update_step

  def _rl_chunked(self) -> learner.ChunkedUpdate:
    if self._chunked is None:
      self._chunked = learner.make_chunked_update(self._comp.graphdef, self._cfg, self._rl_opt,
                                                  shardings=self._comp.shardings,
                                                  vocab_limit=sampling.vocab_limit(self._comp))
    return self._chunked

  def rl_update_shapes(self) -> list[tuple[int, int]]:
    """The global `(rows, length)` update batch shapes `rl.precompile_rows` names: each row
    count (this process's rows, times the process count) at each packed row length
    (`rl.packed_buckets`) or, unpacked, at each of `rl.buckets`. With `rl.update_chunk_rows`
    the one chunk's rows at each length (when `rl.precompile_rows` is not empty)."""
    cfg = self._cfg
    lengths = (sorted(set(cfg.rl.packed_lengths().values())) if packs_prefixes(cfg)
               else list(cfg.rl.buckets))
    n = self._comp.coord.process_count
    counts = cfg.rl.precompile_rows
    if self._chunk_rows and counts:
      counts = (self._chunk_rows,)
    return [(int(r) * n, int(t)) for r in counts for t in lengths]

  def compile_rl_updates(self) -> None:
    """Starts compiling the RL update step for `rl_update_shapes()` (with
    `rl.loss_slot_fractions`, at each loss-slot width too) in a background thread, then the
    sampler's prefills for a training stage's rows (`sampling.compile_rl_prefills`) in
    another (ahead-of-time lowering: `jax.jit(...).lower(...).compile()` fills the program's
    cache, so that the RL phase's first call of each shape runs at once). Called when the
    warm-start's last evaluation starts, whose decode steps leave a core to spare; the RL
    phase's first `update` waits for the update programs (the RL phase's first samples
    overlap them too), no call waits for the prefills.
    Compiling changes nothing a step computes. No-op without shapes or when already started.
    """
    shapes = self.rl_update_shapes()
    if (not shapes or self._compiling is not None or self._update_step is not None
        or self._chunked is not None):
      return
    chunked = self._rl_chunked() if self._chunk_rows else None
    step = None if chunked else self._rl_update_step()
    sh = self._comp.shardings
    mesh, rules = self._comp.mesh, self._cfg.mesh.rules()
    master = self._state.master
    abstract = jax.eval_shape(
        lambda p, m: learner.init_state(p, self._rl_opt, self._cfg.seed + 1, master=m),
        self._state.params, master)
    state = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                         abstract, sh.state)
    ref = None
    if self._use_kl:
      ref = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                         jax.eval_shape(lambda p: p, self._state.params), sh.ref_params)
    packed = packs_prefixes(self._cfg)

    fractions = self._cfg.rl.loss_slot_fractions

    def abstract_batches(rows, length):
      """The update batches of this shape: every slot scored, and each loss-slot width."""
      host = core_types.UpdateBatch.padding(rows, length, packed=packed)
      for width in (0,) + learner.slot_widths(length, fractions):
        b = host if not width else host._replace(loss_slots=np.zeros((rows, width), np.int32))
        yield jax.tree.map(lambda x: jax.ShapeDtypeStruct(
            x.shape, x.dtype, sharding=parallel.batch_sharding(mesh, x.shape, rules)), b)

    def prefill_work():
      try:
        sampling.compile_rl_prefills(self._comp, state.params)
      except Exception as e:  # pylint: disable=broad-except (they compile when used)
        logging.warning("compiling the RL sampler's prefills ahead failed (they compile when "
                        "first used): %s", e)

    def work():
      update_work()
      # Then the sampler's prefills, in a thread of their own that no update waits for (the
      # RL phase's later stages use them first). Not a daemon, as below.
      threading.Thread(target=prefill_work, name="compile_rl_prefills", daemon=False).start()

    def update_work():
      if chunked is not None:  # `learner.make_chunked_update`'s three programs
        try:
          params = state.params
          lowered = chunked.init.lower(params)
          acc = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                             lowered.out_info, lowered.compile().output_shardings)
          weight = jax.ShapeDtypeStruct((2,), jnp.float32, sharding=acc[1].sharding)
          for rows, length in shapes:
            for batch in abstract_batches(rows, length):
              chunked.grad.lower(params, acc, batch, ref, weight).compile()
          chunked.apply.lower(state, acc).compile()
        except Exception as e:  # pylint: disable=broad-except (they compile when used)
          logging.warning("compiling the chunked RL update ahead failed (it compiles when "
                          "first used): %s", e)
        return
      for rows, length in shapes:
        try:
          for batch in abstract_batches(rows, length):
            step.lower(state, batch, ref).compile()
        except Exception as e:  # pylint: disable=broad-except (the step compiles when used)
          logging.warning("compiling the RL update for [%d, %d] ahead failed (it compiles "
                          "when first used): %s", rows, length, e)

    # Not a daemon: a run that ends before its first update (stopped, refused, no signal) waits
    # for the compilations at exit instead of tearing XLA down under a compiling thread.
    self._compiling = threading.Thread(target=work, name="compile_rl_updates", daemon=False)
    self._compiling.start()

  def start_rl(self) -> None:
    """Hands the warm-start's parameters (and float32 master, if any) to a fresh RL state, and
    the parameters to the frozen reference."""
    params = self._state.params
    sh = self._comp.shardings
    if self._use_kl:
      self._ref = jax.device_put(jax.tree.map(jnp.copy, params), sh.ref_params)
    self._state = jax.device_put(
        learner.init_state(params, self._rl_opt, self._cfg.seed + 1, master=self._state.master),
        sh.state)

  def _put(self, batch):
    return parallel.shard_batch(batch.check(), self._comp.mesh, self._cfg.mesh.rules())

  def sft(self, batch: core_types.SFTBatch) -> Pending:
    """Dispatches one warm-start step on this process's rows `[n, warmstart.seq_len]`."""
    if self._sft_step is None:
      self._sft_step = learner.make_sft_step(self._comp.graphdef, self._cfg, self._ws_opt,
                                             shardings=self._comp.shardings,
                                             vocab_limit=sampling.vocab_limit(self._comp))
    with jax.transfer_guard(self._transfer_guard):
      placed = self._put(batch)
      self._state, metrics = self._sft_step(self._state, placed)
    return Pending(metrics, int(placed.loss_mask.size))

  def row_granule(self, process_count: int) -> int:
    """The multiple of which every process's update rows are (`replay.batching.row_buckets`):
    the global rows (`process_count` times as many) split into `rl.micro_batches` and over
    the mesh's batch axes as a full update's do."""
    rows = self._cfg.rl.rows_per_update
    sharding = parallel.batch_sharding(self._comp.mesh, (rows,), self._cfg.mesh.rules())
    granule = math.lcm(self._cfg.rl.micro_batches, rows // sharding.shard_shape((rows,))[0])
    return granule // math.gcd(granule, process_count)

  def update(self, batch: Optional[core_types.UpdateBatch], rows: int,
             buckets: Sequence[int]) -> Pending:
    """Dispatches one policy update on this process's rows (`[rows, T]`).

    `rows` is this process's row bucket of this update (`replay.batching.row_bucket`; every
    process passes the same). `batch` None (this process had no row while another had): an
    all-padding batch of `rows` rows of `buckets[0]` tokens, so that every process runs the
    same program. With shared-prefix packing (`packs_prefixes`) each process's packed batch
    has its own shape: with several processes they agree on the largest row count and row
    length (`Coordinator.agree_max`) and pad to it.
    """
    if not self._chunk_rows:
      self._rl_update_step()
    if self._compiling is not None:  # `compile_rl_updates`: its programs first
      self._compiling.join()
      self._compiling = None
    if packs_prefixes(self._cfg):
      batch = self._packed_share(batch, rows, buckets)
    if self._chunk_rows:
      return self._chunked_update(batch if batch is not None
                                  else core_types.UpdateBatch.padding(rows, buckets[0]))
    batch = batch if batch is not None else core_types.UpdateBatch.padding(rows, buckets[0])
    batch = self._loss_slots([batch])[0]
    with jax.transfer_guard(self._transfer_guard):
      placed = self._put(batch)
      for _ in range(self._cfg.rl.ppo_epochs):  # GRPO's μ passes over the same rows
        self._state, metrics = self._update_step(self._state, placed, self._ref)
    return Pending(metrics, int(placed.loss_mask.size))

  def _chunked_update(self, batch: core_types.UpdateBatch) -> Pending:
    """`update` with `rl.update_chunk_rows` (`learner.make_chunked_update`): this process's
    real rows padded to whole chunks, each chunk's gradient added with its
    `learner.chunk_weights` weights, then one optimizer step; `rl.ppo_epochs` times. The
    batch's trailing padding rows (its row bucket's) are dropped first; every process runs as
    many chunks as the one with the most real rows."""
    cfg = self._cfg
    chunked = self._rl_chunked()
    coord = self._comp.coord
    c = self._chunk_rows
    k = learner.real_chunks(batch, c)
    combine = None
    if coord.process_count > 1:
      k = coord.agree_max(k)
      combine = lambda d: np.sum(coord.gather(d.tolist()), axis=0)  # pylint: disable=unnecessary-lambda-assignment
    host_chunks = learner.split_chunks(batch, c, k)
    mask = np.concatenate([chunk.loss_mask for chunk in host_chunks])
    host_chunks = self._loss_slots(host_chunks)
    weights = np.stack([learner.chunk_weights(mask, mode, c, combine)
                        for mode in (cfg.loss.aggregation, "token_mean")], axis=1)
    scalar = jax.sharding.NamedSharding(self._comp.mesh, jax.sharding.PartitionSpec())
    with jax.transfer_guard(self._transfer_guard):
      chunks = [self._put(chunk) for chunk in host_chunks]
      placed_weights = [jax.device_put(w, scalar) for w in weights]
      for _ in range(cfg.rl.ppo_epochs):  # GRPO's μ passes over the same rows
        acc = chunked.init(self._state.params)
        for chunk, w in zip(chunks, placed_weights):
          acc = chunked.grad(self._state.params, acc, chunk, self._ref, w)
        self._state, metrics = chunked.apply(self._state, acc)
    return Pending(metrics, sum(int(chunk.loss_mask.size) for chunk in chunks), k * c)

  def _loss_slots(self, batches: list[core_types.UpdateBatch]) -> list[core_types.UpdateBatch]:
    """`batches` (this process's chunks, or its one batch) with `rl.loss_slot_fractions`'
    loss slots (`learner.with_loss_slots`): each at the smallest width that holds its rows'
    loss tokens, and with several processes the widest any process's same chunk needs (they
    run one program). Unchanged when the option is off."""
    fractions = self._cfg.rl.loss_slot_fractions
    if not fractions:
      return batches
    length = batches[0].tokens.shape[1]
    # Every slot scored (width 0) is the widest: compared as the row length.
    widths = [learner.slot_width(b.loss_mask, fractions) or length for b in batches]
    coord = self._comp.coord
    if coord.process_count > 1:
      widths = [int(w) for w in np.max(np.asarray(coord.gather(widths)), axis=0)]
    return [learner.with_loss_slots(b, 0 if w >= length else w)
            for b, w in zip(batches, widths, strict=True)]

  def _packed_share(self, batch: Optional[core_types.UpdateBatch], rows: int,
                    buckets: Sequence[int]) -> core_types.UpdateBatch:
    """This process's packed batch in the shape every process agrees on (`update`)."""
    coord = self._comp.coord
    if coord.process_count == 1:
      return batch if batch is not None else core_types.UpdateBatch.padding(
          rows, buckets[0], packed=True)
    n = coord.agree_max(0 if batch is None else int(batch.tokens.shape[0]))
    t = coord.agree_max(0 if batch is None else int(batch.tokens.shape[1]))
    if batch is None:
      return core_types.UpdateBatch.padding(n, t, packed=True)
    return _pad_batch(batch, n, t)

  def wait(self) -> None:
    """Blocks until every dispatched step has updated the parameters (no transfer).

    The sampler would wait for them anyway; waiting here first lets the caller time the
    learner apart from the sampler.
    """
    jax.block_until_ready(self._state.params)

  def fetch(self, pending: Sequence[Pending], *, step: Optional[int] = None
            ) -> list[dict[str, Any]]:
    """Host copies of dispatched steps' metrics (one transfer; waits for the steps).

    Entries already on the host (restored from a checkpoint) pass through. Given `step` (the
    global step of the last entry), also checks `rl.max_skipped_updates`.

    Raises:
      NonFiniteUpdatesError: `rl.max_skipped_updates` updates in a row were skipped as
        non-finite (`learner.check_skipped_updates`).
    """
    with jax.transfer_guard(self._transfer_guard):
      metrics = jax.device_get([p.metrics for p in pending])
    if step is not None:
      learner.check_skipped_updates(metrics, self._cfg.rl.max_skipped_updates, step)
    return metrics

  @property
  def num_traces(self) -> dict[str, int]:
    """Compilations of the update and warm-start steps so far (`learner.CountedJit`)."""
    update = self._chunked.grad if self._chunked is not None else self._update_step
    return {name: step.num_traces for name, step in (("update", update),
                                                     ("sft", self._sft_step)) if step}
