"""Tests for agentic_grpo.sharding on 8 simulated CPU devices (see conftest.py).

Each mesh shape (8,1,1), (2,4,1), (2,2,2), (1,1,8) must give the results of
one device. Tolerances: parameters initialised under `jit(out_shardings=)` are
bit-identical; log-probs and update-step outputs differ only by the order of
float32 reductions that XLA splits across devices, bounded by 2e-5 absolute
(log-probs of ~|4|) and 1e-5 relative-to-scale for updated parameters;
greedy sampling must produce the same tokens (behaviour log-probs within 2e-5
absolute), with its KV cache sharded as the rules say.
"""

import functools
import os
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
import chex
from flax import nnx
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P
import ml_collections
import numpy as np
import optax

from agentic_grpo import sharding
from agentic_grpo.models import sampler
from agentic_grpo.models import transformer

# Widths chosen so that every mesh axis size used below divides vocab, embed,
# mlp and heads, while kv_heads (2) does not divide a tensor axis of 8: that
# dimension must fall back to replication.
_CONFIG = transformer.ModelConfig(
    vocab_size=64, d_model=32, n_layers=1, n_heads=8, n_kv_heads=2, head_dim=8, mlp_dim=64,
    qkv_bias=True, tie_embeddings=False, max_seq_len=32)

MESHES = (
    ("data8", (8, 1, 1)),
    ("data2_fsdp4", (2, 4, 1)),
    ("data2_fsdp2_tensor2", (2, 2, 2)),
    ("tensor8", (1, 1, 8)),
)

_N, _T = 8, 12


def _randomise(params, seed):
  """Random values for every parameter (NumPy: no per-shape compilation)."""
  rng = np.random.default_rng(seed)
  return jax.tree.map(
      lambda x: np.asarray(x) + 0.2 * rng.standard_normal(x.shape).astype(x.dtype), params)


_INITIAL = []  # parameters as initialised from key 0, filled by `_reference`


@functools.lru_cache(maxsize=None)
def _reference():
  """One-device parameters and log-probs."""
  graphdef, _ = transformer.abstract_model(_CONFIG)
  params = jax.jit(transformer.init_params, static_argnums=0)(_CONFIG, jax.random.key(0))
  _INITIAL.append(params)
  params = _randomise(params, 1)
  tokens = jax.random.randint(jax.random.key(2), (_N, _T), 0, _CONFIG.vocab_size, jnp.int32)
  positions = jnp.broadcast_to(jnp.arange(_T, dtype=jnp.int32), (_N, _T))
  mask = jnp.arange(_T)[None, :] < jnp.array([12, 9, 12, 5, 12, 7, 11, 12])[:, None]
  lp = jax.jit(transformer.sequence_logprobs, static_argnums=0)(
      graphdef, params, tokens, positions, mask)
  return graphdef, params, (np.asarray(tokens), np.asarray(positions), np.asarray(mask)), lp


_NEW = 6


def _prompts(variant=0):
  rng = np.random.default_rng(3 + variant)
  lengths = np.array([[5, 3, 8, 1, 6, 8, 2, 4], [2, 7, 7, 3, 1, 5, 8, 6]][variant], np.int32)
  prompts = rng.integers(0, _CONFIG.vocab_size, (_N, 8)).astype(np.int32)
  prompts[np.arange(8)[None, :] >= lengths[:, None]] = 0
  return prompts, lengths


@functools.lru_cache(maxsize=None)
def _reference_samples():
  """One-device greedy samples of both prompt variants."""
  graphdef, params, _, _ = _reference()
  return [jax.device_get(sampler.sample(graphdef, params, *_prompts(v), jax.random.key(5 + v),
                                        max_new_tokens=_NEW, greedy=True)) for v in (0, 1)]


class MeshTest(parameterized.TestCase):

  @parameterized.named_parameters(*MESHES)
  def test_make_mesh_shape_and_axis_types(self, shape):
    mesh = sharding.make_mesh(shape)
    self.assertEqual(mesh.axis_names, sharding.MESH_AXES)
    self.assertEqual(tuple(mesh.shape.values()), shape)
    self.assertTrue(all(t == jax.sharding.AxisType.Auto for t in mesh.axis_types))
    self.assertLen(set(mesh.devices.flat), 8)

  @parameterized.parameters(
      ((-1, 1, 1), (8, 1, 1)),
      ((2, -1, 1), (2, 4, 1)),
      ((1, 2, -1), (1, 2, 4)),
      ((2, 2, 2), (2, 2, 2)),
  )
  def test_minus_one_takes_the_rest(self, sizes, expected):
    self.assertEqual(sharding.resolve_mesh_shape(sizes, 8), expected)

  def test_fixed_sizes_may_use_fewer_devices_in_one_process(self):
    mesh = sharding.make_mesh((1, 2, 1))
    self.assertEqual(list(mesh.devices.flat), jax.devices()[:2])
    with self.assertRaisesRegex(ValueError, "do not divide"):
      sharding.make_mesh((3, -1, 1))

  def test_mesh_from_config_objects(self):
    cd = ml_collections.ConfigDict({"mesh": {"data": 2, "fsdp": -1, "tensor": 2}})
    self.assertEqual(tuple(sharding.make_mesh(cd).shape.values()), (2, 2, 2))
    self.assertEqual(tuple(sharding.make_mesh({"data": 1, "fsdp": 8, "tensor": 1})
                           .shape.values()), (1, 8, 1))
    devices = jax.devices()[:4]
    self.assertEqual(tuple(sharding.make_mesh((-1, 1, 2), devices).shape.values()), (2, 1, 2))

  @parameterized.parameters(
      ((3, 3, 1), "cover 9 devices"),
      ((-1, -1, 1), "at most one"),
      ((3, -1, 1), "do not divide"),
      ((0, 1, 1), "positive int or -1"),
      ((2, 4), "3 entries"),
  )
  def test_bad_mesh_sizes_raise(self, sizes, message):
    with self.assertRaisesRegex(ValueError, message):
      sharding.make_mesh(sizes)


class RulesTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    self.mesh = jax.sharding.AbstractMesh((2, 2, 2), sharding.MESH_AXES)

  def test_rules_map_names_to_axes(self):
    spec = sharding.logical_to_spec(("vocab", "embed"), (64, 32), self.mesh)
    self.assertEqual(spec, P("tensor", "fsdp"))
    spec = sharding.logical_to_spec(("batch", "length"), (8, 5), self.mesh)
    self.assertEqual(spec, P(("data", "fsdp"), None))

  def test_indivisible_dimension_keeps_dividing_prefix(self):
    # 6 rows: data (2) divides, data*fsdp (4) does not.
    self.assertEqual(sharding.logical_to_spec(("batch",), (6,), self.mesh), P("data"))
    self.assertEqual(sharding.logical_to_spec(("heads",), (3,), self.mesh), P(None))

  def test_mesh_axis_used_once_per_array(self):
    rules = (("a", "tensor"), ("b", ("tensor", "fsdp")))
    self.assertEqual(sharding.logical_to_spec(("a", "b"), (4, 4), self.mesh, rules),
                     P("tensor", None))

  def test_custom_rules_from_config(self):
    cfg = ml_collections.ConfigDict(
        {"mesh": {"data": 2, "fsdp": 2, "tensor": 2,
                  "logical_axis_rules": [["embed", ["fsdp", "tensor"]], ["vocab", None]]}})
    rules = sharding.rules_from_config(cfg)
    self.assertEqual(rules, (("embed", ("fsdp", "tensor")), ("vocab", None)))
    self.assertEqual(sharding.logical_to_spec(("vocab", "embed"), (64, 32), self.mesh, rules),
                     P(None, ("fsdp", "tensor")))
    self.assertEqual(sharding.rules_from_config({"mesh": {"data": -1}}),
                     sharding.DEFAULT_RULES)

  @parameterized.parameters(
      ((("embed", "model"),), "unknown mesh axis"),
      ((("embed", "fsdp"), ("embed", None)), "appears twice"),
      ((("embed",),), "pairs"),
      ((("embed", 3),), "must map to"),
  )
  def test_bad_rules_raise(self, rules, message):
    with self.assertRaisesRegex(ValueError, message):
      sharding.logical_to_spec(("embed",), (32,), self.mesh, rules)

  def test_unknown_logical_name_raises(self):
    with self.assertRaisesRegex(ValueError, "no entry"):
      sharding.logical_to_spec(("experts",), (4,), self.mesh)


def _expected_spec(logical, shape, sizes):
  """The default rules, written out for the arrays of this model."""
  table = {"vocab": "tensor", "embed": "fsdp", "mlp": "tensor", "heads": "tensor",
           "kv_heads": "tensor", "head_dim": None}
  out = []
  for name, dim in zip(logical, shape):
    axis = table[name]
    out.append(axis if axis is not None and dim % sizes[axis] == 0 else None)
  return P(*out)


class ShardedModelTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    # Compilation dominates these tiny programs; XLA's backend optimisations
    # (not the SPMD partitioner) are switched off for this class.
    cls._saved_opt = jax.config.read("jax_disable_most_optimizations")
    jax.config.update("jax_disable_most_optimizations", True)

  @classmethod
  def tearDownClass(cls):
    jax.config.update("jax_disable_most_optimizations", cls._saved_opt)
    super().tearDownClass()

  @parameterized.named_parameters(*MESHES)
  def test_params_sharded_as_rules_say(self, shape):
    _, ref, _, _ = _reference()
    mesh = sharding.make_mesh(shape)
    sizes = dict(mesh.shape)
    sm = sharding.shard_model(_CONFIG, mesh)
    params = sharding.device_put_params(ref, sm)
    variables = jax.tree.leaves(params, is_leaf=lambda x: isinstance(x, nnx.Variable))
    self.assertNotEmpty(variables)
    for var in variables:
      x = var.get_value()
      logical = var.get_metadata()["out_sharding"]
      expected = _expected_spec(logical, x.shape, sizes)
      self.assertEqual(x.sharding.spec, expected, (logical, x.shape))
      shard_shape = tuple(d // (sizes[a] if a else 1) for d, a in zip(x.shape, expected))
      self.assertEqual(x.addressable_shards[0].data.shape, shard_shape)
    # The named cases, spelled out.
    embed = params["embed"].get_value()
    wq = params["layers"][0]["attn"]["q"].get_value()
    wk = params["layers"][0]["attn"]["k"].get_value()
    self.assertEqual(embed.sharding.spec, P("tensor", "fsdp"))
    self.assertEqual(wq.sharding.spec, P("fsdp", "tensor", None))
    self.assertEqual(wk.sharding.spec,
                     P("fsdp", None if shape[2] == 8 else "tensor", None))
    # Abstract params carry the same shardings (an Orbax restore target).
    for a, s in zip(jax.tree.leaves(sm.abstract_params), jax.tree.leaves(sm.param_shardings)):
      self.assertEqual(a.sharding, s)

  @parameterized.named_parameters(*MESHES)
  def test_logprobs_equal_one_device(self, shape):
    graphdef, ref_params, (tokens, positions, mask), ref_lp = _reference()
    mesh = sharding.make_mesh(shape)
    sm = sharding.shard_model(_CONFIG, mesh)
    params = sharding.device_put_params(ref_params, sm)
    batch = sharding.shard_batch({"tokens": tokens, "positions": positions, "mask": mask}, mesh)
    self.assertEqual(batch["tokens"].sharding.spec, P(("data", "fsdp"), None))
    lp_fn = sharding.jit_sequence_logprobs(sm)
    lp = lp_fn(params, batch["tokens"], batch["positions"], batch["mask"])
    self.assertEqual(lp.sharding.spec, P(("data", "fsdp")))
    np.testing.assert_allclose(np.asarray(lp), np.asarray(ref_lp), atol=2e-5, rtol=0)
    self.assertGreater(float(np.abs(ref_lp).max()), 1.0)  # a non-trivial comparison

  def test_optimizer_state_shardings_follow_params(self):
    mesh = sharding.make_mesh((2, 2, 2))
    sm = sharding.shard_model(_CONFIG, mesh)
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-3))
    abstract, shardings = sharding.optimizer_state_shardings(tx, sm)
    adam = shardings[1][0]
    self.assertEqual(adam.count.spec, P())
    self.assertEqual(adam.mu["embed"].get_value().spec, P("tensor", "fsdp"))
    self.assertEqual(adam.nu["layers"][0]["mlp"]["down"].get_value().spec, P("tensor", "fsdp"))
    self.assertEqual(jax.tree.structure(abstract), jax.tree.structure(shardings))
    # Plain-array parameters (no metadata) are matched by tree path.
    pure = nnx.to_pure_dict(jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype),
                                         sm.abstract_params))
    plain = sharding.tree_shardings_like(jax.eval_shape(optax.adam(1e-3).init, pure), sm)
    self.assertEqual(plain[0].mu["layers"][0]["attn"]["o"].spec, P("tensor", None, "fsdp"))
    self.assertEqual(plain[0].count.spec, P())

  def test_init_sharded_state_is_created_in_shards(self):
    _reference()
    mesh = sharding.make_mesh((1, 4, 2))
    sm = sharding.shard_model(_CONFIG, mesh)
    tx = optax.adam(1e-3)

    def init_fn(key):
      params = transformer.init_params(_CONFIG, key)
      return {"params": params, "opt": tx.init(params), "step": jnp.zeros((), jnp.int32)}

    state, shardings = sharding.init_sharded(init_fn, sm, jax.random.key(0))
    self.assertEqual(state["opt"][0].nu["embed"].get_value().sharding.spec, P("tensor", "fsdp"))
    self.assertEqual(state["opt"][0].count.sharding.spec, P())
    self.assertEqual(state["step"].sharding.spec, P())
    self.assertEqual(state["params"]["layers"][0]["mlp"]["up"].get_value().sharding,
                     shardings["params"]["layers"][0]["mlp"]["up"].get_value())
    # Same values as the one-device initialiser, bit for bit.
    chex.assert_trees_all_equal(jax.tree.map(np.asarray, state["params"]),
                                jax.tree.map(np.asarray, _INITIAL[0]))

  def test_init_params_in_shards_and_cached(self):
    _reference()
    mesh = sharding.make_mesh((2, 2, 2))
    sm = sharding.shard_model(_CONFIG, mesh)
    params = sharding.init_params(sm, _CONFIG, 0)
    hits = sharding._jitted_init.cache_info().hits
    again = sharding.init_params(sharding.shard_model(_CONFIG, mesh), _CONFIG, 0)
    self.assertEqual(sharding._jitted_init.cache_info().hits, hits + 1)  # no recompilation
    chex.assert_trees_all_equal(jax.tree.map(np.asarray, again),
                                jax.tree.map(np.asarray, _INITIAL[0]))
    self.assertEqual(params["embed"].get_value().sharding.spec, P("tensor", "fsdp"))

  @parameterized.named_parameters(*MESHES)
  def test_greedy_sampling_equals_one_device_with_cache_sharded_by_rules(self, shape):
    graphdef, ref_params, _, _ = _reference()
    want = _reference_samples()
    mesh = sharding.make_mesh(shape)
    sizes = dict(mesh.shape)
    shardings = sharding.sampler_shardings(_CONFIG, mesh)
    self.assertIs(sharding.sampler_shardings(_CONFIG, mesh), shardings)  # cached by value
    params = sharding.device_put_params(ref_params, sharding.shard_model(_CONFIG, mesh))
    # The rules: cache rows over data*fsdp, the 2 kv heads over tensor where it divides them.
    kv = "tensor" if _CONFIG.n_kv_heads % sizes["tensor"] == 0 else None
    self.assertEqual(shardings.cache(_N, 16 + _NEW).k[0].spec,
                     P(("data", "fsdp"), kv, None, None))
    self.assertEqual(shardings.cache(_N, 16).valid.spec, P(("data", "fsdp"), None))
    # What the compiled program holds (mesh axes of size 1 do not show).
    rows = tuple(a for a in ("data", "fsdp") if sizes[a] > 1)
    effective = [rows[0] if len(rows) == 1 else rows or None,
                 kv if kv and sizes[kv] > 1 else None]
    while effective and effective[-1] is None:
      effective.pop()

    seen = []
    real_apply = transformer.apply

    def spy(graphdef, params, tokens, positions, cache=None, *args, **kwargs):
      slots = cache.k[0].shape[2]
      jax.debug.inspect_array_sharding(cache.k[0], callback=lambda s: seen.append((slots, s)))
      return real_apply(graphdef, params, tokens, positions, cache, *args, **kwargs)

    sampler._sharded_jit.cache_clear()
    counted = chex.assert_max_traces(sampler._sample_impl, n=1)
    with mock.patch.object(transformer, "apply", spy), \
         mock.patch.object(sampler, "_sample_impl", counted):
      for v in (0, 1):  # other lengths and key, same bucket: no recompilation
        out = sampler.sample(graphdef, params, *_prompts(v), jax.random.key(5 + v),
                             max_new_tokens=_NEW, greedy=True, shardings=shardings)
        np.testing.assert_array_equal(np.asarray(out.tokens), want[v].tokens)
        np.testing.assert_array_equal(np.asarray(out.lengths), want[v].lengths)
        np.testing.assert_allclose(np.asarray(out.logprobs), want[v].logprobs, atol=2e-5,
                                   rtol=0)
        for field in out:
          self.assertEqual(field.sharding.spec, P(("data", "fsdp")))
    chex.clear_trace_counter()
    self.assertEqual(sorted(s for s, _ in seen), [16, 16 + _NEW])  # prefill, decode
    for slots, got in seen:
      self.assertEqual(got.spec, P(*effective), slots)
      self.assertTrue(got.is_equivalent_to(shardings.cache(_N, slots).k[0], 4), slots)
    self.assertGreater(float(np.abs(want[0].logprobs).max()), 0.1)  # non-trivial log-probs

  def test_kv_cache_shardings(self):
    mesh = sharding.make_mesh((2, 2, 2))
    cache_sh = sharding.kv_cache_shardings(_CONFIG, mesh, batch_size=8, max_len=16)
    self.assertLen(cache_sh.k, _CONFIG.n_layers)
    self.assertEqual(cache_sh.valid.spec, P(("data", "fsdp"), None))
    self.assertEqual(cache_sh.index.spec, P())
    cache = jax.jit(lambda: transformer.init_cache(_CONFIG, 8, 16), out_shardings=cache_sh)()
    # Whatever the model's layout, rows are split 4 ways and kv heads 2 ways.
    shape = cache.v[0].shape
    n_axis, kv_axis = shape.index(8), shape.index(_CONFIG.n_kv_heads)
    spec = [None] * 4
    spec[n_axis], spec[kv_axis] = ("data", "fsdp"), "tensor"
    self.assertEqual(cache_sh.k[0].spec, P(*spec))
    shard = list(shape)
    shard[n_axis], shard[kv_axis] = 2, 1
    self.assertEqual(cache.v[0].addressable_shards[0].data.shape, tuple(shard))
    # 6 rows: only `data` divides them.
    odd = sharding.kv_cache_shardings(_CONFIG, mesh, batch_size=6, max_len=16)
    self.assertEqual(odd.k[0].spec[n_axis], "data")


class BatchTest(absltest.TestCase):

  def test_shard_batch_rows_and_scalars(self):
    mesh = sharding.make_mesh((2, 4, 1))
    batch = {"x": np.arange(16 * 3).reshape(16, 3), "w": np.ones(16, np.float32),
             "step": np.int32(5)}
    out = sharding.shard_batch(batch, mesh)
    self.assertEqual(out["x"].sharding.spec, P(("data", "fsdp"), None))
    self.assertEqual(out["x"].addressable_shards[0].data.shape, (2, 3))
    self.assertEqual(out["step"].sharding.spec, P())
    np.testing.assert_array_equal(np.asarray(out["x"]), batch["x"])
    self.assertEqual(sharding.batch_devices(mesh), 8)
    self.assertEqual(sharding.row_sharding(mesh).spec, P(("data", "fsdp")))

  def test_put_batch_splits_rows_as_far_as_they_divide(self):
    mesh = sharding.make_mesh((2, 4, 1))
    out = sharding.put_batch({"a": np.ones((16, 3)), "b": np.ones((4, 3)), "c": np.int32(1)},
                             mesh)
    self.assertEqual(out["a"].sharding.spec, P(("data", "fsdp"), None))
    self.assertEqual(out["b"].sharding.spec, P("data", None))  # 4 rows: data (2) divides
    self.assertEqual(out["c"].sharding.spec, P())
    np.testing.assert_array_equal(np.asarray(out["b"]), np.ones((4, 3)))

  def test_fetch_returns_host_arrays(self):
    mesh = sharding.make_mesh((2, 2, 2))
    x = sharding.shard_batch({"x": np.arange(24.0).reshape(8, 3)}, mesh)["x"]
    got = sharding.fetch({"x": x, "n": jnp.int32(3)})
    self.assertIsInstance(got["x"], np.ndarray)
    np.testing.assert_array_equal(got["x"], np.arange(24.0).reshape(8, 3))
    self.assertEqual(int(got["n"]), 3)

  def test_local_rows_inverts_shard_batch(self):
    mesh = sharding.make_mesh((2, 2, 2))
    batch = {"x": np.arange(8 * 3).reshape(8, 3), "y": np.arange(8.0), "n": np.int32(4)}
    back = sharding.local_rows(sharding.shard_batch(batch, mesh))
    for k, v in batch.items():
      np.testing.assert_array_equal(back[k], v)
      self.assertIsInstance(back[k], np.ndarray)

  def test_gathers_in_one_process(self):
    np.testing.assert_array_equal(sharding.host_allgather(np.array([3, 5])), [[3, 5]])
    self.assertEqual(sharding.allgather_json({"a": [1, 2.5]}), [{"a": [1, 2.5]}])

  def test_logprobs_reject_rows_not_divisible(self):
    _, ref_params, (tokens, positions, mask), _ = _reference()
    mesh = sharding.make_mesh((8, 1, 1))
    sm = sharding.shard_model(_CONFIG, mesh)
    fn = sharding.jit_sequence_logprobs(sm)
    with self.assertRaisesRegex(ValueError, "multiple of"):
      fn(ref_params, tokens[:6], positions[:6], mask[:6])


class MultiProcessHelpersTest(parameterized.TestCase):

  @parameterized.parameters((10, 3), (3, 4), (0, 2), (8, 2))
  def test_process_slice_partitions(self, n, count):
    slices = [sharding.process_slice(n, p, count) for p in range(count)]
    covered = [i for s in slices for i in range(n)[s]]
    self.assertEqual(covered, list(range(n)))
    sizes = [len(range(n)[s]) for s in slices]
    self.assertLessEqual(max(sizes) - min(sizes), 1)

  def test_process_slice_single_process_is_everything(self):
    self.assertEqual(sharding.process_slice(7), slice(0, 7))
    with self.assertRaisesRegex(ValueError, "process_index"):
      sharding.process_slice(4, 2, 2)

  def test_initialize_distributed_off_without_environment(self):
    env = {k: os.environ.pop(k) for k in (sharding.ENV_DISTRIBUTED, sharding.ENV_COORDINATOR)
           if k in os.environ}
    try:
      self.assertFalse(sharding.initialize_distributed())
      self.assertFalse(sharding.initialize_distributed("off"))
      os.environ[sharding.ENV_DISTRIBUTED] = "0"
      os.environ[sharding.ENV_COORDINATOR] = "127.0.0.1:1"
      self.assertFalse(sharding.initialize_distributed())  # explicit 0 wins
    finally:
      os.environ.pop(sharding.ENV_DISTRIBUTED, None)
      os.environ.pop(sharding.ENV_COORDINATOR, None)
      os.environ.update(env)
    self.assertTrue(sharding.is_primary())

  def test_initialize_distributed_validates(self):
    with self.assertRaisesRegex(ValueError, "enabled"):
      sharding.initialize_distributed("maybe")
    with self.assertRaisesRegex(ValueError, "process_id"):
      sharding.initialize_distributed("on", "127.0.0.1:1", num_processes=2, process_id=2)
    os.environ[sharding.ENV_DISTRIBUTED] = "perhaps"
    try:
      with self.assertRaisesRegex(ValueError, sharding.ENV_DISTRIBUTED):
        sharding.initialize_distributed()
    finally:
      del os.environ[sharding.ENV_DISTRIBUTED]


if __name__ == "__main__":
  absltest.main()
