"""Tests for agentic_grpo.models.placement on 8 simulated CPU devices (see conftest.py).

Each mesh shape (8,1,1), (2,4,1), (2,2,2), (1,1,8) must give the results of
one device. Tolerances: parameters initialised under `jit(out_shardings=)` are
bit-identical; log-probs and update-step outputs differ only by the order of
float32 reductions that XLA splits across devices, bounded by 2e-5 absolute
(log-probs of ~|4|) and 1e-5 relative-to-scale for updated parameters;
greedy sampling must produce the same tokens (behaviour log-probs within 2e-5
absolute), with its KV cache sharded as the rules say.
"""

import contextlib
import dataclasses
import functools
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
import chex
from flax import nnx
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P
import numpy as np
import optax

from agentic_grpo import parallel
from agentic_grpo.core import types as core_types
from agentic_grpo.models import placement
from agentic_grpo.models import sampler
from agentic_grpo.models import shared_prefill
from agentic_grpo.models import transformer

# Widths chosen so that every mesh axis size used below divides vocab, embed,
# mlp and heads, while kv_heads (2) does not divide a tensor axis of 8: that
# dimension must fall back to replication. Causal blocks of 4 queries: the cache-less forwards
# (`_T` = 12) run the blocked attention on every mesh.
_CONFIG = transformer.ModelConfig(
    vocab_size=64, d_model=32, n_layers=1, n_heads=8, n_kv_heads=2, head_dim=8, mlp_dim=64,
    qkv_bias=True, tie_embeddings=False, max_seq_len=32, causal_block=4)

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


def _expected_spec(logical, shape, sizes):
  """The default rules, written out for the arrays of this model."""
  table = {"vocab": "tensor", "embed": "fsdp", "mlp": "tensor", "heads": "tensor",
           "kv_heads": "tensor", "head_dim": None}
  out = []
  for name, dim in zip(logical, shape, strict=True):
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
    mesh = parallel.make_mesh(shape)
    sizes = dict(mesh.shape)
    sm = placement.shard_model(_CONFIG, mesh)
    params = placement.device_put_params(ref, sm)
    variables = jax.tree.leaves(params, is_leaf=lambda x: isinstance(x, nnx.Variable))
    self.assertNotEmpty(variables)
    for var in variables:
      x = var.get_value()
      logical = var.get_metadata()["out_sharding"]
      expected = _expected_spec(logical, x.shape, sizes)
      self.assertEqual(x.sharding.spec, expected, (logical, x.shape))
      shard_shape = tuple(d // (sizes[a] if a else 1) for d, a in zip(x.shape, expected,
                                                                      strict=True))
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
    for a, s in zip(jax.tree.leaves(sm.abstract_params), jax.tree.leaves(sm.param_shardings),
                    strict=True):
      self.assertEqual(a.sharding, s)

  @parameterized.named_parameters(*MESHES)
  def test_logprobs_equal_one_device(self, shape):
    graphdef, ref_params, (tokens, positions, mask), ref_lp = _reference()
    mesh = parallel.make_mesh(shape)
    sm = placement.shard_model(_CONFIG, mesh)
    params = placement.device_put_params(ref_params, sm)
    batch = parallel.shard_batch({"tokens": tokens, "positions": positions, "mask": mask}, mesh)
    self.assertEqual(batch["tokens"].sharding.spec, P(("data", "fsdp"), None))
    lp_fn = placement.jit_sequence_logprobs(sm)
    lp = lp_fn(params, batch["tokens"], batch["positions"], batch["mask"])
    self.assertEqual(lp.sharding.spec, P(("data", "fsdp")))
    np.testing.assert_allclose(np.asarray(lp), np.asarray(ref_lp), atol=2e-5, rtol=0)
    self.assertGreater(float(np.abs(ref_lp).max()), 1.0)  # a non-trivial comparison

  @parameterized.named_parameters(*MESHES)
  def test_causal_attention_chunks_equal_one_device(self, shape):
    """Attention in chunks of 5 queries (`attention_chunk`, the last one short), each against
    the keys up to its last slot (`causal_block` below T): the reference's log-probs."""
    _, ref_params, (tokens, positions, mask), ref_lp = _reference()
    config = dataclasses.replace(_CONFIG, attention_chunk=5)
    self.assertLess(config.query_chunk(_T), _T)
    mesh = parallel.make_mesh(shape)
    sm = placement.shard_model(config, mesh)
    params = placement.device_put_params(ref_params, sm)
    batch = parallel.shard_batch({"tokens": tokens, "positions": positions, "mask": mask}, mesh)
    lp = placement.jit_sequence_logprobs(sm)(params, batch["tokens"], batch["positions"],
                                             batch["mask"])
    np.testing.assert_allclose(np.asarray(lp), np.asarray(ref_lp), atol=2e-5, rtol=0)

  def test_optimizer_state_shardings_follow_params(self):
    mesh = parallel.make_mesh((2, 2, 2))
    sm = placement.shard_model(_CONFIG, mesh)
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-3))
    abstract, shardings = placement.optimizer_state_shardings(tx, sm)
    adam = shardings[1][0]
    self.assertEqual(adam.count.spec, P())
    self.assertEqual(adam.mu["embed"].get_value().spec, P("tensor", "fsdp"))
    self.assertEqual(adam.nu["layers"][0]["mlp"]["down"].get_value().spec, P("tensor", "fsdp"))
    self.assertEqual(jax.tree.structure(abstract), jax.tree.structure(shardings))
    # Plain-array parameters (no metadata) are matched by tree path.
    pure = nnx.to_pure_dict(jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype),
                                         sm.abstract_params))
    plain = placement.tree_shardings_like(jax.eval_shape(optax.adam(1e-3).init, pure), sm)
    self.assertEqual(plain[0].mu["layers"][0]["attn"]["o"].spec, P("tensor", None, "fsdp"))
    self.assertEqual(plain[0].count.spec, P())

  def test_init_sharded_state_is_created_in_shards(self):
    _reference()
    mesh = parallel.make_mesh((1, 4, 2))
    sm = placement.shard_model(_CONFIG, mesh)
    tx = optax.adam(1e-3)

    def init_fn(key):
      params = transformer.init_params(_CONFIG, key)
      return {"params": params, "opt": tx.init(params), "step": jnp.zeros((), jnp.int32)}

    state, shardings = placement.init_sharded(init_fn, sm, jax.random.key(0))
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
    mesh = parallel.make_mesh((2, 2, 2))
    sm = placement.shard_model(_CONFIG, mesh)
    params = placement.init_params(sm, _CONFIG, 0)
    hits = placement._jitted_init.cache_info().hits
    again = placement.init_params(placement.shard_model(_CONFIG, mesh), _CONFIG, 0)
    self.assertEqual(placement._jitted_init.cache_info().hits, hits + 1)  # no recompilation
    chex.assert_trees_all_equal(jax.tree.map(np.asarray, again),
                                jax.tree.map(np.asarray, _INITIAL[0]))
    self.assertEqual(params["embed"].get_value().sharding.spec, P("tensor", "fsdp"))

  def _sampler_on_two_devices(self):
    """`(graphdef, abstract params, shardings, sample)` on a data-2 mesh: `sample(**kwargs)`
    runs `sampler.sample` greedily on `_prompts()` with the sharded parameters; the sharded
    programs' caches are cleared."""
    graphdef, ref_params, _, _ = _reference()
    mesh = parallel.make_mesh((2, 1, 1))
    shardings = sampler.sampler_shardings(_CONFIG, mesh)
    params = placement.device_put_params(ref_params, placement.shard_model(_CONFIG, mesh))
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                            params)
    sample = functools.partial(sampler.sample, graphdef, params, *_prompts(), jax.random.key(0),
                               max_new_tokens=_NEW, greedy=True, shardings=shardings)
    sampler._sharded_prefill.cache_clear()
    sampler._sharded_decode.cache_clear()
    return graphdef, abstract, shardings, sample

  @contextlib.contextmanager
  def _counting_compiles(self):
    """Yields a list that grows by one per XLA backend compilation while the block runs."""
    compiles = []

    def count(event, seconds, **kwargs):
      del seconds, kwargs
      if event == "/jax/core/compile/backend_compile_duration":
        compiles.append(event)

    jax.monitoring.register_event_duration_secs_listener(count)
    try:
      yield compiles
    finally:
      jax.monitoring.unregister_event_duration_listener(count)

  def test_a_prefill_compiled_ahead_is_not_compiled_again(self):
    # `compile_prefill` on the parameters' shapes (a background thread's, before the RL phase)
    # fills the sharded prefill's cache: the first call at that width compiles its decode only.
    graphdef, abstract, shardings, sample = self._sampler_on_two_devices()
    with self._counting_compiles() as compiles:
      sample(prompt_buckets=(32,))  # the call's other programs, at another width
      before = len(compiles)
      sampler.compile_prefill(graphdef, abstract, shardings, _N, 16)
      self.assertLen(compiles, before + 1)
      out = sample(prompt_buckets=(16,))
      self.assertLen(compiles, before + 2)  # the decode
    self.assertEqual(np.asarray(out.tokens).shape, (_N, _NEW))

  def test_a_narrower_prefill_compiled_ahead_is_not_compiled_again(self):
    # The prefill at 8 slots for the 16 bucket (`prompt_width`, `sample`'s `prefill_width`):
    # compiled ahead, then the call compiles nothing, its decode being the bucket's; tokens
    # equal the bucket-width prefill's.
    graphdef, abstract, shardings, sample = self._sampler_on_two_devices()
    want = sample(prompt_buckets=(16,))  # the bucket's prefill and decode
    with self._counting_compiles() as compiles:
      sampler.compile_prefill(graphdef, abstract, shardings, _N, 16, prompt_width=8)
      self.assertLen(compiles, 1)
      got = sample(prompt_buckets=(16,), prefill_width=8)
      self.assertLen(compiles, 1)
    np.testing.assert_array_equal(got.tokens, want.tokens)
    np.testing.assert_allclose(got.logprobs, want.logprobs, atol=1e-5)
    with self.assertRaisesRegex(ValueError, "prompt_width must be in"):
      sampler.compile_prefill(graphdef, abstract, shardings, _N, 16, 2, 8, prompt_width=8)

  @parameterized.named_parameters(*MESHES)
  def test_greedy_sampling_equals_one_device_with_cache_sharded_by_rules(self, shape):
    graphdef, ref_params, _, _ = _reference()
    want = _reference_samples()
    mesh = parallel.make_mesh(shape)
    sizes = dict(mesh.shape)
    shardings = sampler.sampler_shardings(_CONFIG, mesh)
    self.assertIs(sampler.sampler_shardings(_CONFIG, mesh), shardings)  # cached by value
    params = placement.device_put_params(ref_params, placement.shard_model(_CONFIG, mesh))
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

    sampler._sharded_prefill.cache_clear()
    sampler._sharded_decode.cache_clear()
    counted = chex.assert_max_traces(sampler._decode_impl, n=1)
    with mock.patch.object(transformer, "apply", spy), \
         mock.patch.object(sampler, "_decode_impl", counted):
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

  def test_greedy_and_sampled_calls_share_one_sharded_program(self):
    """`greedy` is traced in the sharded sampler: a greedy and a sampled call of the same shapes
    trace (and compile) one program, and each gives the tokens of the static program of its
    kind (the one-device sampler's, `greedy` static), log-probs within float rounding."""
    graphdef, ref_params, _, _ = _reference()
    prompts, lengths = _prompts(0)
    mesh = parallel.make_mesh((8, 1, 1))
    shardings = sampler.sampler_shardings(_CONFIG, mesh)
    params = placement.device_put_params(ref_params, placement.shard_model(_CONFIG, mesh))
    transform = core_types.SamplingTransform(temperature=1.0)
    sampler._sharded_prefill.cache_clear()
    sampler._sharded_decode.cache_clear()
    counted = chex.assert_max_traces(sampler._decode_impl, n=1)
    outs = {}
    with mock.patch.object(sampler, "_decode_impl", counted):
      for greedy in (True, False):
        outs[greedy] = sampler.sample(graphdef, params, prompts, lengths, jax.random.key(5),
                                      max_new_tokens=_NEW, greedy=greedy, transform=transform,
                                      shardings=shardings)
    chex.clear_trace_counter()
    self.assertEqual(sampler._sharded_decode.cache_info().currsize, 1)
    for greedy, out in outs.items():
      want = jax.device_get(sampler.sample(graphdef, ref_params, prompts, lengths,
                                           jax.random.key(5), max_new_tokens=_NEW,
                                           greedy=greedy, transform=transform))
      np.testing.assert_array_equal(np.asarray(out.tokens), want.tokens)
      np.testing.assert_array_equal(np.asarray(out.lengths), want.lengths)
      np.testing.assert_allclose(np.asarray(out.logprobs), want.logprobs, atol=2e-5, rtol=0)
    # The two kinds differ: the sampled call drew other tokens than the argmax somewhere.
    self.assertFalse(np.array_equal(np.asarray(outs[True].tokens),
                                    np.asarray(outs[False].tokens)))

  @parameterized.named_parameters(("data8", (8, 1, 1)), ("data2_fsdp2_tensor2", (2, 2, 2)))
  def test_shared_prefill_sharded_equals_one_device(self, shape):
    """The shared-prefix prefill (`prefix_group`) on a mesh: its groups' rows (fewer than the
    batch axes hold) and the rows' suffixes placed by the rules; greedy tokens and log-probs
    are the one-device whole prefill's."""
    graphdef, ref_params, _, _ = _reference()
    rng = np.random.default_rng(7)
    lengths = np.array([16, 19, 22, 17, 14, 20, 15, 24], np.int32)
    prompts = rng.integers(2, _CONFIG.vocab_size, (_N, 24)).astype(np.int32)
    prompts[:4, :13] = prompts[0, :13]  # two groups of 4: the first shares 13 tokens
    prompts[4:, :11] = prompts[4, :11]  # the second 11
    prompts[np.arange(24)[None, :] >= lengths[:, None]] = 0
    # The shared path is the sampler's choice for these prompts (its estimate is the lower).
    self.assertIsNotNone(shared_prefill.layout(prompts, lengths, 4, 32, config=_CONFIG))
    want = jax.device_get(sampler.sample(graphdef, ref_params, prompts, lengths,
                                         jax.random.key(5), max_new_tokens=_NEW, greedy=True))
    mesh = parallel.make_mesh(shape)
    shardings = sampler.sampler_shardings(_CONFIG, mesh)
    params = placement.device_put_params(ref_params, placement.shard_model(_CONFIG, mesh))
    out = sampler.sample(graphdef, params, prompts, lengths, jax.random.key(5),
                         max_new_tokens=_NEW, greedy=True, shardings=shardings, prefix_group=4)
    np.testing.assert_array_equal(np.asarray(out.tokens), want.tokens)
    np.testing.assert_array_equal(np.asarray(out.lengths), want.lengths)
    np.testing.assert_allclose(np.asarray(out.logprobs), want.logprobs, atol=2e-5, rtol=0)
    self.assertEqual(out.tokens.sharding.spec, P(("data", "fsdp")))

  @parameterized.named_parameters(("data8_to2", (8, 1, 1), 2), ("data8_to4", (8, 1, 1), 4),
                                  ("data2_fsdp2_tensor2_to2", (2, 2, 2), 2))
  def test_compacted_decode_sharded_equals_one_device(self, shape, compact_to):
    """The decode compaction (`compact_to`) on a mesh: the rows still generating, fewer than
    (or as many as) the batch axes hold, gathered and decoded on; tokens, lengths and finish
    reasons are the one-device whole decode's, log-probs within float rounding."""
    graphdef, ref_params, _, _ = _reference()
    prompts, lengths = _prompts(0)
    kwargs = dict(max_new_tokens=12, transform=core_types.SamplingTransform(temperature=1.0),
                  stop_token_ids=list(range(0, _CONFIG.vocab_size, 4)))
    want = jax.device_get(sampler.sample(graphdef, ref_params, prompts, lengths,
                                         jax.random.key(3), **kwargs))
    longest = np.sort(want.lengths)[::-1]
    self.assertLess(longest[compact_to], longest[0])  # the call compacts
    mesh = parallel.make_mesh(shape)
    shardings = sampler.sampler_shardings(_CONFIG, mesh)
    params = placement.device_put_params(ref_params, placement.shard_model(_CONFIG, mesh))
    ran = []
    real_apply = transformer.apply

    def spy(graphdef, params, tokens, *args, **kwargs):
      if tokens.shape[1] == 1:  # a decode step's body
        width = tokens.shape[0]
        jax.debug.callback(lambda: ran.append(width))
      return real_apply(graphdef, params, tokens, *args, **kwargs)

    sampler._sharded_prefill.cache_clear()
    sampler._sharded_decode.cache_clear()
    with mock.patch.object(transformer, "apply", spy):
      out = jax.device_get(sampler.sample(graphdef, params, prompts, lengths,
                                          jax.random.key(3), shardings=shardings,
                                          compact_to=compact_to, **kwargs))
    jax.effects_barrier()
    self.assertIn(compact_to, ran)  # steps ran at the compacted width
    np.testing.assert_array_equal(out.tokens, want.tokens)
    np.testing.assert_array_equal(out.lengths, want.lengths)
    np.testing.assert_array_equal(out.finish_reason, want.finish_reason)
    np.testing.assert_allclose(out.logprobs, want.logprobs, atol=2e-5, rtol=0)

  def test_kv_cache_shardings(self):
    mesh = parallel.make_mesh((2, 2, 2))
    cache_sh = placement.kv_cache_shardings(_CONFIG, mesh, batch_size=8, max_len=16)
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
    odd = placement.kv_cache_shardings(_CONFIG, mesh, batch_size=6, max_len=16)
    self.assertEqual(odd.k[0].spec[n_axis], "data")

  def test_logprobs_reject_rows_not_divisible(self):
    _, ref_params, (tokens, positions, mask), _ = _reference()
    mesh = parallel.make_mesh((8, 1, 1))
    sm = placement.shard_model(_CONFIG, mesh)
    fn = placement.jit_sequence_logprobs(sm)
    with self.assertRaisesRegex(ValueError, "multiple of"):
      fn(ref_params, tokens[:6], positions[:6], mask[:6])


if __name__ == "__main__":
  absltest.main()
