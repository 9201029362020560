r"""The `transformers` side of the sampler benchmark, run in the `hf` environment.

Imports nothing of ours (torch, transformers, numpy only), so that it runs in the virtual
environment built from `requirements-hf.txt`. Two commands:

  make DIR --config='{...}'   a random Llama of that shape (norms and weights randomised,
                              seed 0), written with `save_pretrained` to DIR
  time DIR --batch=N ...      greedy `generate` of `--new_tokens` tokens (no stop token) for
                              DIR/prompts.npy; writes DIR/hf_tokens.npy and prints one JSON
                              line with the median wall and CPU seconds and the warm-up time
  longtail DIR --batch=N ...  the long-tailed workload of `continuous_bench`: DIR/lt_prompts.npy
                              (right-padded), DIR/lt_lengths.npy (prompt lengths) and
                              DIR/lt_drawn.npy (each request's completion length), greedy
                              `generate` over chunks of `--batch` requests, left-padded, each row
                              stopped at its drawn length by a per-row stopping criterion (the
                              chunk decodes until its longest row stops, as static batching
                              does); writes DIR/hf_lengths.npy and prints the same JSON line
"""

import argparse
import json
import os
import pathlib
import statistics
import time

import numpy as np
import torch
import transformers


def hf_model(c: dict):
  """A random HF Llama with the shape of `c` (our `ModelConfig` fields as a dict)."""
  hf_config = transformers.LlamaConfig(
      vocab_size=c["vocab_size"], hidden_size=c["d_model"], intermediate_size=c["mlp_dim"],
      num_hidden_layers=c["n_layers"], num_attention_heads=c["n_heads"],
      num_key_value_heads=c["n_kv_heads"], head_dim=c["head_dim"], rms_norm_eps=c["norm_eps"],
      max_position_embeddings=c["max_seq_len"], tie_word_embeddings=c["tie_embeddings"],
      rope_parameters={"rope_type": "default", "rope_theta": c["rope_theta"]},
      bos_token_id=None, eos_token_id=None, pad_token_id=None)
  torch.manual_seed(0)
  model = transformers.LlamaForCausalLM(hf_config).eval()
  gen = torch.Generator().manual_seed(0)
  with torch.no_grad():
    for name, p in model.named_parameters():
      noise = torch.randn(p.shape, generator=gen)
      p.copy_(1.0 + 0.1 * noise if name.endswith("norm.weight") else noise / p.shape[-1] ** 0.5)
  return model


def _timed(generate, repeats: int, name: str) -> dict:
  """One untimed call of `generate`, then `repeats` timed ones: median wall and CPU seconds,
  the first call's seconds, and the last call's result under `name`."""
  start = time.perf_counter()
  generate()
  warm = time.perf_counter() - start
  wall, cpu = [], []
  for _ in range(repeats):
    start, start_cpu = time.perf_counter(), time.process_time()
    result = generate()
    wall.append(time.perf_counter() - start)
    cpu.append(time.process_time() - start_cpu)
  return {"wall_s": statistics.median(wall), "cpu_s": statistics.median(cpu), "warm_s": warm,
          name: result}


def _time(model, prompts: np.ndarray, new_tokens: int, repeats: int) -> dict:
  input_ids = torch.from_numpy(prompts).long()
  attention_mask = torch.ones_like(input_ids)

  def generate():
    with torch.inference_mode():
      out = model.generate(input_ids=input_ids, attention_mask=attention_mask,
                           max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                           do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[:, prompts.shape[1]:].numpy()

  return _timed(generate, repeats, "tokens")


class _StopAtLength(transformers.StoppingCriteria):
  """Row i of a chunk is done once it has generated `drawn[i]` tokens (a `[batch]` verdict per
  step: `generate` pads a finished row from then on and stops when every row is done)."""

  def __init__(self, prompt_len: int, drawn: np.ndarray):
    self.prompt_len = prompt_len
    self.drawn = torch.from_numpy(drawn).long()

  def __call__(self, input_ids, scores, **kwargs):
    return (input_ids.shape[1] - self.prompt_len) >= self.drawn


def _chunk_inputs(prompts: np.ndarray, lengths: np.ndarray):
  """Left-padded `input_ids` and `attention_mask` `[b, max(lengths)]` of right-padded prompts."""
  width = int(lengths.max())
  ids = np.zeros((prompts.shape[0], width), np.int64)
  mask = np.zeros_like(ids)
  for i, n in enumerate(lengths):
    ids[i, width - n:] = prompts[i, :n]
    mask[i, width - n:] = 1
  return torch.from_numpy(ids), torch.from_numpy(mask)


def _time_long_tail(model, prompts, lengths, drawn, batch: int, new_tokens: int,
                    repeats: int) -> dict:
  chunks = [(*_chunk_inputs(prompts[s:s + batch], lengths[s:s + batch]), drawn[s:s + batch])
            for s in range(0, prompts.shape[0], batch)]

  def generate():
    out = []
    for ids, mask, d in chunks:
      with torch.inference_mode():
        seq = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens,
                             do_sample=False, eos_token_id=None, pad_token_id=0,
                             stopping_criteria=transformers.StoppingCriteriaList(
                                 [_StopAtLength(ids.shape[1], d)]))
      generated = seq.shape[1] - ids.shape[1]
      out.append(np.minimum(d, generated))  # a row stops at its drawn length (or the cap)
    return np.concatenate(out)

  return _timed(generate, repeats, "lengths")


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("command", choices=("make", "time", "longtail"))
  parser.add_argument("dir")
  parser.add_argument("--config", default="{}")
  parser.add_argument("--new_tokens", type=int, default=128)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--threads", type=int, default=1)
  parser.add_argument("--batch", type=int, default=64)
  a = parser.parse_args()
  os.environ.setdefault("HF_HUB_OFFLINE", "1")
  d = pathlib.Path(a.dir)
  if a.command == "make":
    hf_model(json.loads(a.config)).save_pretrained(d)
    return
  torch.set_num_threads(a.threads)
  model = transformers.LlamaForCausalLM.from_pretrained(d).eval()
  if a.command == "longtail":
    out = _time_long_tail(model, np.load(d / "lt_prompts.npy"), np.load(d / "lt_lengths.npy"),
                          np.load(d / "lt_drawn.npy"), a.batch, a.new_tokens, a.repeats)
    np.save(d / "hf_lengths.npy", out.pop("lengths"))
  else:
    out = _time(model, np.load(d / "prompts.npy"), a.new_tokens, a.repeats)
    np.save(d / "hf_tokens.npy", out.pop("tokens"))
  print(json.dumps(dict(out, versions={"torch": torch.__version__,
                                       "transformers": transformers.__version__})))


if __name__ == "__main__":
  main()
