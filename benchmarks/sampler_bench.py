r"""Generated tokens per second: our jitted KV-cache sampler vs `transformers` `generate`.

Both run the same random Llama model with the shape of the `tiny` preset
(byte vocabulary, d_model 128, 4 layers, GQA 4/2 heads, tied embeddings),
float32 on CPU: the model is created in PyTorch, saved with `save_pretrained`
and loaded into ours with `load_hf_checkpoint`, so the weights are identical.
Same batch, same prompts (all of one length), same number of new tokens,
greedy decoding without stop tokens (every row generates exactly
`--new_tokens`). Compilation / warm-up is excluded and reported separately;
each side is timed over `--repeats` runs and the median is used. Wall time
and this process's CPU time are both reported: on a shared machine the CPU
time ratio is the steadier one.

Needs the `hf` extra (torch, transformers).

Usage:
  python -m benchmarks.sampler_bench --batch=16 --prompt_len=64 --new_tokens=128
"""

import dataclasses
import os
import statistics
import tempfile
import time

from absl import app
from absl import flags
import jax
import numpy as np
import torch
import transformers

from agentic_grpo.models import hf_import
from agentic_grpo.models import presets
from agentic_grpo.models import sampler
from agentic_grpo.models import transformer
from benchmarks import hf_generate_worker

_BATCH = flags.DEFINE_integer("batch", 16, "Rows generated at once (N).")
_PROMPT_LEN = flags.DEFINE_integer("prompt_len", 64, "Prompt tokens per row.")
_NEW_TOKENS = flags.DEFINE_integer("new_tokens", 128, "Generated tokens per row.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed runs per side (median reported).")
_THREADS = flags.DEFINE_integer("torch_threads", 0, "torch.set_num_threads (0: all cores).")


def _time(fn, repeats):
  """Median wall seconds, median CPU seconds of this process, last output."""
  wall, cpu = [], []
  out = None
  for _ in range(repeats):
    start, start_cpu = time.perf_counter(), time.process_time()
    out = fn()
    wall.append(time.perf_counter() - start)
    cpu.append(time.process_time() - start_cpu)
  return statistics.median(wall), statistics.median(cpu), out


def main(argv):
  del argv
  os.environ.setdefault("HF_HUB_OFFLINE", "1")
  if _THREADS.value:
    torch.set_num_threads(_THREADS.value)
  n, p, t = _BATCH.value, _PROMPT_LEN.value, _NEW_TOKENS.value
  config = presets.get_model_config("tiny")
  model = hf_generate_worker.hf_model(dataclasses.asdict(config))
  with tempfile.TemporaryDirectory() as tmp:
    model.save_pretrained(tmp)
    loaded_config, params = hf_import.load_hf_checkpoint(tmp)
  graphdef, _ = transformer.abstract_model(loaded_config)
  prompts = np.random.RandomState(1).randint(0, 256, (n, p)).astype(np.int32)
  lengths = np.full((n,), p, np.int32)

  def ours():
    out = sampler.sample(graphdef, params, prompts, lengths, jax.random.key(0),
                         max_new_tokens=t, greedy=True)
    return np.asarray(jax.block_until_ready(out.tokens))

  start = time.perf_counter()
  ours()
  ours_compile = time.perf_counter() - start
  ours_s, ours_cpu, ours_tokens = _time(ours, _REPEATS.value)

  input_ids = torch.from_numpy(prompts).long()
  attention_mask = torch.ones_like(input_ids)

  def theirs():
    with torch.inference_mode():
      out = model.generate(input_ids=input_ids, attention_mask=attention_mask,
                           max_new_tokens=t, min_new_tokens=t, do_sample=False,
                           eos_token_id=None, pad_token_id=0)
    return out[:, p:].numpy()

  start = time.perf_counter()
  theirs()
  theirs_warm = time.perf_counter() - start
  theirs_s, theirs_cpu, theirs_tokens = _time(theirs, _REPEATS.value)

  generated = n * t
  agree = float(np.mean(ours_tokens == theirs_tokens))
  first_diff = [int(np.argmax(a != b)) if np.any(a != b) else t
                for a, b in zip(ours_tokens, theirs_tokens)]
  print(f"model: tiny-shaped Llama, {transformer.param_count(params):,} params, float32, CPU "
        f"({os.cpu_count()} cores, torch threads {torch.get_num_threads()})")
  print(f"batch {n}, prompt {p}, new tokens {t}, greedy; median of {_REPEATS.value} runs")
  print(f"ours:         {generated / ours_s:10.1f} tokens/s wall, {generated / ours_cpu:10.1f} "
        f"per CPU-second  (first call with compilation {ours_compile:.2f} s)")
  print(f"transformers: {generated / theirs_s:10.1f} tokens/s wall, {generated / theirs_cpu:10.1f} "
        f"per CPU-second  (first call {theirs_warm:.2f} s)")
  print(f"ratio:        {theirs_s / ours_s:10.2f}x wall, {theirs_cpu / ours_cpu:.2f}x CPU time")
  print(f"greedy tokens identical: {agree:.1%}; median first divergence at step "
        f"{int(np.median(first_diff))} of {t}")


if __name__ == "__main__":
  app.run(main)
