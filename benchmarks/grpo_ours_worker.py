r"""One `grpo_step` measurement of our GRPO iteration, in a fresh process.

Started by `benchmarks.grpo_step`. The same work per iteration as Tunix's `GRPOLearner` step
with one iteration per batch: sample `G` completions for each of `B` prompts (`sampler.sample`,
temperature 1, EOS stops a row), score them (random rewards, drawn on the host like a reward
function would), group advantages (`core.advantages.group_advantages`), and one update
(`learner.make_update_step`, AdamW, clipped policy loss, KL penalty `beta` 0.04 to the frozen
reference, whose log-probs the update computes). Model: a random Qwen3-shaped model of ours
(q/k norm, tied embeddings, byte vocabulary 269), parameters placed on a `(data, 1, 1)` mesh
of `--devices` devices, prompt rows split over `data`, as Tunix's `fsdp` mesh of the same size.

The reward step stamps the time at each iteration; the spacing of consecutive stamps after
`--warmup` iterations is the steady-state iteration time.

Prints one JSON line: `{"times": [...], "compile_s": ...}`.
"""

import argparse
import dataclasses
import json
import time

import jax

_EOS = 257


def main():
  parser = argparse.ArgumentParser()
  for name in ("group", "prompts", "prompt_len", "new_tokens", "iterations", "warmup",
               "devices"):
    parser.add_argument(f"--{name}", type=int, required=True)
  for name in ("layers", "d_model", "heads", "kv_heads", "head_dim", "mlp"):
    parser.add_argument(f"--{name}", type=int, default=0)
  parser.add_argument("--preset", default="",
                      help="A model preset (e.g. qwen2_0_5b, bfloat16) instead of the shape flags.")
  a = parser.parse_args()
  jax.config.update("jax_num_cpu_devices", a.devices)
  # Imported after the device count is set.
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from agentic_grpo import config as config_lib  # pylint: disable=g-import-not-at-top
  from agentic_grpo import learner  # pylint: disable=g-import-not-at-top
  from agentic_grpo import parallel  # pylint: disable=g-import-not-at-top
  from agentic_grpo.core import advantages  # pylint: disable=g-import-not-at-top
  from agentic_grpo.core import types as core_types  # pylint: disable=g-import-not-at-top
  from agentic_grpo.models import placement  # pylint: disable=g-import-not-at-top
  from agentic_grpo.models import sampler  # pylint: disable=g-import-not-at-top
  from agentic_grpo.models import presets  # pylint: disable=g-import-not-at-top
  from agentic_grpo.models import transformer  # pylint: disable=g-import-not-at-top

  if a.preset:
    model_config = presets.get_model_config(a.preset)
  else:
    model_config = presets.get_model_config(
        "tiny", d_model=a.d_model, n_layers=a.layers, n_heads=a.heads, n_kv_heads=a.kv_heads,
        head_dim=a.head_dim, mlp_dim=a.mlp, qk_norm=True,
        max_seq_len=max(512, a.prompt_len + a.new_tokens))
  vocab = model_config.vocab_size
  n = a.prompts * a.group
  cfg = config_lib.TrainConfig()
  cfg = dataclasses.replace(
      cfg, rl=dataclasses.replace(cfg.rl, rows_per_update=n),
      loss=dataclasses.replace(cfg.loss, kl_beta=0.04, aggregation="seq_mean_token_mean"))
  mesh = parallel.make_mesh((a.devices, 1, 1))
  opt = learner.make_optimizer(cfg.optim)
  sm, shardings = learner.learner_shardings(model_config, mesh, opt)
  graphdef, params = transformer.init_model(model_config, 0)
  params = placement.device_put_params(params, sm)
  # A copy: the update donates the state, whose parameters must not alias the reference.
  ref_params = placement.device_put_params(jax.tree.map(np.array, params), sm)
  state = jax.device_put(learner.init_state(params, opt, 0), shardings.state)
  update = learner.make_update_step(graphdef, cfg, opt, shardings=shardings)
  sample_shardings = sampler.sampler_shardings(model_config, mesh)
  group_adv = jax.jit(advantages.group_advantages)
  rng = np.random.default_rng(0)
  p, t = a.prompt_len, a.new_tokens
  lengths = np.full((n,), p, np.int32)
  stamps, cpu_stamps = [], []
  start = time.perf_counter()
  for it in range(a.warmup + a.iterations + 1):
    prompts = rng.integers(97, 123, (a.prompts, p)).astype(np.int32) % vocab
    rows = np.repeat(prompts, a.group, axis=0)
    out = sampler.sample(graphdef, state.params, rows, lengths, jax.random.key(it),
                         max_new_tokens=t, stop_token_ids=[_EOS], prompt_buckets=(p,),
                         shardings=sample_shardings)
    tokens, _, _, loss_mask = sampler.join_prompt_completion(
        jnp.asarray(rows), jnp.asarray(lengths), out.tokens, out.lengths)
    # The reward function reads the completions on the host, as Tunix's does.
    completions = np.asarray(out.tokens)
    stamps.append(time.perf_counter())
    cpu_stamps.append(time.process_time())
    del completions
    rewards = rng.random((a.prompts, a.group)).astype(np.float32)
    adv = group_adv(jnp.asarray(rewards)).reshape(n)
    behaviour = jnp.concatenate([jnp.zeros((n, p), jnp.float32), out.logprobs], axis=1)
    batch = core_types.UpdateBatch(
        tokens=tokens, loss_mask=loss_mask, behaviour_logprobs=behaviour,
        advantages=jnp.where(loss_mask, adv[:, None], 0.0).astype(jnp.float32),
        sample_weights=jnp.ones((n,), jnp.float32))
    batch = parallel.put_batch(batch, mesh)
    state, metrics = update(state, batch, ref_params)
  jax.block_until_ready(metrics)
  total = time.perf_counter() - start
  gaps = np.diff(np.asarray(stamps)).tolist()
  cpu = np.diff(np.asarray(cpu_stamps)).tolist()
  print(json.dumps({"times": gaps[a.warmup - 1:], "cpu_times": cpu[a.warmup - 1:],
                    "compile_s": stamps[a.warmup - 1] - start,
                    "total_s": total, "iterations_seen": len(stamps), "versions": {}}))


if __name__ == "__main__":
  main()
