"""The run's sampler: `make_sample_fn`, the agent loop's `SampleFn` over the run's model.

It picks the sampler (`rl.sampler`: the static `models.sampler` or the continuous-batching
`models.continuous`), the sampling transform (temperature, top-k, top-p and `vocab_limit`),
the shared-prefix prefill (`rl.shared_prefill`) and the reused conversation prefixes
(`rl.reuse_prefix`, with their `models.prefix_cache.PrefixCache`), and places every host value
explicitly so that it runs under `jax.transfer_guard("disallow")`. `train.device.DeviceSide`
hands it out (`DeviceSide.sampler`) under the run's transfer guard; evaluation builds its own at
`eval.temperature`.
"""

from typing import Optional

import jax
import numpy as np

from agentic_grpo import field_checks
from agentic_grpo import parallel
from agentic_grpo.models import continuous as continuous_lib
from agentic_grpo.models import prefix_cache
from agentic_grpo.models import sampler as sampler_lib
from agentic_grpo.models import sampling_rules


def vocab_limit(comp) -> int:
  """The sampling transform's `vocab_limit` of a run built as `comp`: the tokenizer's
  vocabulary when the model's embedding has more rows (a padded checkpoint), else 0.

  The sampler (RL and evaluation), the update step and the warm-start step all use it, so that
  no id the tokenizer cannot decode is drawn and every log-prob is over the same ids.
  """
  return sampling_rules.sampleable_vocab(comp.tokenizer, comp.model_config.vocab_size)


def _prefix_group(comp) -> int:
  """The rows of a group whose shared prompt prefix the static sampler prefills once
  (`rl.shared_prefill`: `rl.group_size`), or 1 (off, the continuous sampler, or several
  processes: their prompt bucket is agreed, so a part cannot take its own smallest bucket)."""
  rl = comp.cfg.rl
  return (rl.group_size if rl.shared_prefill and rl.sampler == "static"
          and comp.coord.process_count == 1 else 1)


def compile_rl_prefills(comp, params) -> None:
  """Compiles the static sampler's prefills for a training stage's rows (every process's
  `rl.tasks_per_batch * rl.group_size`) at each of `rl.buckets`, ahead of the RL phase's first
  call of each (`models.sampler.compile_prefill`): the whole-prompt one (and at each of
  `rl.prefill_widths` the bucket takes) and, with
  `rl.shared_prefill` in one process, the shared-prefix one for each prefix bucket up to the
  prompt's. The warm-start's evaluation compiles its own calls' programs, which need not be
  these (a later stage's longer prompts). No-op with `rl.sampler='continuous'` or a prefix pool
  (their own programs). `params`: the parameters or their `jax.ShapeDtypeStruct`s."""
  cfg = comp.cfg
  if cfg.rl.sampler != "static" or cfg.rl.reuse_prefix != "never":
    return
  shardings = sampler_lib.sampler_shardings(comp.model_config, comp.mesh, cfg.mesh.rules())
  group = _prefix_group(comp)
  rows = cfg.rl.tasks_per_batch * cfg.rl.group_size * comp.coord.process_count
  for width in map(int, cfg.rl.buckets):
    for whole in sampling_rules.bucket_prefill_widths(width, cfg.rl.buckets,
                                                      cfg.rl.prefill_widths):
      sampler_lib.compile_prefill(comp.graphdef, params, shardings, rows, width,
                                  prompt_width=whole)
    for prefix in (int(b) for b in cfg.rl.buckets if b <= width and group > 1):
      sampler_lib.compile_prefill(comp.graphdef, params, shardings, rows, width, group, prefix)


def make_sample_fn(comp, seed: int, temperature: Optional[float] = None, *,
                   transfer_guard: str = "allow"):
  """The agent loop's `sample_fn`: the KV-cache sampler with the run's sampling transform.

  `sample_fn(params, prompts [n, P] int32, lengths [n] int32, counter, greedy)` returns NumPy
  `(tokens [n, max_new_tokens], lengths [n], logprobs [n, max_new_tokens])`: this process's
  rows. `temperature` defaults to `rl.temperature` (the behaviour policy's); evaluation passes
  `eval.temperature`. `rl.top_k` / `rl.top_p` apply either way, and so does `vocab_limit(comp)`:
  greedy or sampled, no id past the tokenizer's vocabulary is generated.

  `rl.sampler` picks the batching: `'static'` (`models.sampler.sample`, the call's rows padded
  to one prompt bucket and decoded together, the rows still generating alone once at most
  `rl.sampler_compact_to` are; with `rl.shared_prefill` in a single process, a
  call whose rows are a multiple of `rl.group_size` is prefilled in groups of that many
  consecutive rows, `sample`'s `prefix_group`, when its estimated work is less) or
  `'continuous'` (`models.continuous.sample`, `rl.sampler_slots` decode slots, 0 = the
  call's n rows, each refill prefilled at the smallest of `rl.buckets` that holds it). Either
  way call `counter` samples with the key `jax.random.fold_in(key(seed), counter)`, split into
  one key per row, so a run's tokens are a function of its seed (and, between the two, the
  same up to float rounding).

  Reused prefixes (`rl.reuse_prefix` not `'never'`): the function holds one
  `prefix_cache.PrefixCache` of `rl.prefix_cache_mb` MiB and takes the keywords
  `prefix_keys` (`[n]` keys or None entries: the saved conversation each row's prompt
  continues), `save_keys` (`[n]`: under which key each row's conversation is saved) and
  `params_version` (the policy version of `params`), passed to `continuous.sample` with
  `reuse_prefix=rl.reuse_prefix`. A call with any of them returns a fourth value, the call's
  counts `{"prefix_reused_tokens", "prefix_hits", "prefix_misses", "prefix_mismatches",
  "prefixes_saved", "prefix_stale_hits"}` (ints; stale: reused rows of another version); a
  reused entry is dropped from the pool (the next stage saves its own). A call without them
  (evaluation) reuses and saves nothing.

  Jitted over the run's mesh with explicit shardings (`sampler_lib.sampler_shardings`). In a
  multi-process run (static only) it is a collective: each process passes its own rows, the
  processes agree on the prompt bucket (the longest prompt of any, `comp.coord.agree_max`),
  one program samples every process's rows, and each gets its own rows back. With reused
  prefixes the mesh has one device, and the sampler runs on it unsharded (saved rows are not
  sharded). Runs under `jax.transfer_guard(transfer_guard)`.

  Raises:
    errors.InputError: `rl.sampler='continuous'` in a multi-process run (naming the field);
      `rl.reuse_prefix` other than `'never'` on a mesh of more than one device, or without
      `rl.sampler='continuous'`.
  """
  cfg = comp.cfg
  continuous = cfg.rl.sampler == "continuous"
  if continuous and comp.coord.process_count > 1:
    field_checks.fail("rl.sampler", f"runs in a single process only (its host loop needs every "
                      f"row of a call), this run has {comp.coord.process_count} processes: use "
                      f"rl.sampler='static'", cfg.rl.sampler)
  reuse = cfg.rl.reuse_prefix
  if reuse != "never":
    field_checks.check(continuous, "rl.reuse_prefix", "needs rl.sampler='continuous'", reuse)
    devices = int(comp.mesh.devices.size)
    field_checks.check(devices == 1, "rl.reuse_prefix",
                       f"runs on a mesh of one device only (saved prefix rows are not "
                       f"sharded), this run's mesh has {devices}: use rl.reuse_prefix='never' "
                       f"or a one-device mesh (mesh.data=mesh.fsdp=mesh.tensor=1)", reuse)
  transform = cfg.rl.transform(temperature, vocab_limit=vocab_limit(comp))
  tok = comp.tokenizer
  stop_ids = [tok.token_id(s) for s in comp.workflow_factory().stop_tokens()]
  base = jax.random.key(seed)
  shardings = sampler_lib.sampler_shardings(comp.model_config, comp.mesh, cfg.mesh.rules())
  pool = (prefix_cache.PrefixCache(cfg.rl.prefix_cache_mb << 20) if reuse != "never"
          else None)
  group = _prefix_group(comp)

  def sample_fn(params, prompts, lengths, counter, greedy, *, prefix_keys=None,
                save_keys=None, params_version=None):
    keyed = prefix_keys is not None or save_keys is not None or params_version is not None
    if keyed and pool is None:
      raise ValueError("prefix_keys / save_keys / params_version need rl.reuse_prefix other "
                       "than 'never'")
    version = 0 if params_version is None else int(params_version)
    # The processes agree on the static sampler's one prompt bucket (a collective).
    longest = None if continuous else comp.coord.agree_max(int(np.max(lengths)))
    # The whole-prompt prefill's width (`rl.prefill_widths`), from the agreed longest prompt.
    prefill_width = (0 if continuous else
                     sampling_rules.prefill_width(longest, cfg.rl.buckets, cfg.rl.prefill_widths))
    with jax.transfer_guard(transfer_guard):
      key = jax.random.fold_in(base, jax.device_put(np.uint32(counter % (1 << 32))))
      common = dict(max_new_tokens=cfg.workflow.max_new_tokens, transform=transform,
                    greedy=greedy, stop_token_ids=stop_ids, pad_id=tok.pad_id)
      if pool is not None:
        # One device: the sampler's programs run there, unsharded, with the saved rows.
        with jax.default_device(comp.mesh.devices.flat[0]):
          out, stats = continuous_lib.sample_with_stats(
              comp.graphdef, params, prompts, lengths, key, prompt_buckets=cfg.rl.buckets,
              slots=cfg.rl.sampler_slots or int(prompts.shape[0]), reuse_prefix=reuse,
              prefix_pool=pool, prefix_keys=prefix_keys, save_keys=save_keys,
              params_version=version, **common)
      elif continuous:
        out = continuous_lib.sample(
            comp.graphdef, params, prompts, lengths, key, prompt_buckets=cfg.rl.buckets,
            slots=cfg.rl.sampler_slots or int(prompts.shape[0]), shardings=shardings, **common)
      elif group > 1 and prompts.shape[0] % group == 0:
        out = sampler_lib.sample(comp.graphdef, params, prompts, lengths, key,
                                 shardings=shardings, prompt_buckets=cfg.rl.buckets,
                                 prefix_group=group, compact_to=cfg.rl.sampler_compact_to,
                                 prefill_width=prefill_width, **common)
      else:
        out = sampler_lib.sample(
            comp.graphdef, params, prompts, lengths, key, shardings=shardings,
            prompt_buckets=(sampling_rules.prompt_bucket(longest, cfg.rl.buckets),),
            compact_to=cfg.rl.sampler_compact_to, prefill_width=prefill_width, **common)
      rows = parallel.local_rows((out.tokens, out.lengths, out.logprobs))
    if not keyed:
      return rows
    versions = stats.prefix_versions
    counts = {"prefix_reused_tokens": stats.reused_tokens, "prefix_hits": stats.prefix_hits,
              "prefix_misses": stats.prefix_misses,
              "prefix_mismatches": stats.prefix_mismatches,
              "prefixes_saved": stats.prefixes_saved,
              "prefix_stale_hits": 0 if versions is None else int(np.sum(
                  (versions >= 0) & (versions != version)))}
    if versions is not None:
      for r in np.flatnonzero(versions >= 0):
        pool.discard(prefix_keys[r])
    return (*rows, {k: int(v) for k, v in counts.items()})

  return sample_fn
