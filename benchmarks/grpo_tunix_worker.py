r"""One `grpo_step` measurement of Tunix's `GRPOLearner`, run in the Tunix environment.

Started by `benchmarks.grpo_step` in a fresh process of the virtual environment built from
`requirements-tunix.txt` (it imports nothing of ours). A random Qwen3 (Tunix's own model code)
of the requested shape, a byte-level tokenizer (256 bytes + BOS/EOS/PAD, vocabulary 269 as our
`tiny` preset), the vanilla rollout engine, actor, reference and rollout on one mesh, AdamW,
`beta` 0.04, one iteration per batch. An iteration is rollout + reference log-probs + advantages
+ update; the reward function stamps the time at each call, and the spacing of consecutive stamps
after the warm-up is the steady-state iteration time (the first spacing includes compilation).

Prints one JSON line: `{"times": [...], "compile_s": ..., "versions": {...}}`.
"""

import argparse
import importlib.metadata
import json
import time

import jax

_BOS, _EOS, _PAD, _VOCAB = 256, 257, 258, 269


class ByteTokenizer:
  """Bytes as ids; what Tunix's `TokenizerAdapter` needs of a custom tokenizer."""

  def encode(self, text, **kwargs):
    del kwargs
    return list(text.encode("utf-8"))

  def decode(self, ids, **kwargs):
    del kwargs
    return bytes(int(i) for i in ids if int(i) < 256).decode("utf-8", "replace")

  def bos_id(self):
    return _BOS

  def eos_id(self):
    return _EOS

  def pad_id(self):
    return _PAD


def main():
  parser = argparse.ArgumentParser()
  for name in ("layers", "d_model", "heads", "kv_heads", "head_dim", "mlp", "group", "prompts",
               "prompt_len", "new_tokens", "iterations", "warmup", "devices"):
    parser.add_argument(f"--{name}", type=int, required=True)
  a = parser.parse_args()
  jax.config.update("jax_num_cpu_devices", a.devices)
  # Imported after the device count is set.
  from flax import nnx  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  import optax  # pylint: disable=g-import-not-at-top
  from tunix.models.qwen3 import model as qwen3  # pylint: disable=g-import-not-at-top
  from tunix.rl import rl_cluster as rl_cluster_lib  # pylint: disable=g-import-not-at-top
  from tunix.rl.grpo import grpo_learner  # pylint: disable=g-import-not-at-top
  from tunix.rl.rollout import base_rollout  # pylint: disable=g-import-not-at-top

  mesh = jax.make_mesh((a.devices, 1), ("fsdp", "tp"),
                       axis_types=(jax.sharding.AxisType.Auto,) * 2)
  config = qwen3.ModelConfig(
      num_layers=a.layers, vocab_size=_VOCAB, embed_dim=a.d_model, hidden_dim=a.mlp,
      num_heads=a.heads, head_dim=a.head_dim, num_kv_heads=a.kv_heads, rope_theta=10_000,
      norm_eps=1e-6, use_tied_embedding=True)
  with jax.set_mesh(mesh):  # Tunix creates its optimizer state on the active mesh
    actor = qwen3.Qwen3(config, rngs=nnx.Rngs(0))
    reference = qwen3.Qwen3(config, rngs=nnx.Rngs(0))
    steps = a.warmup + a.iterations
    cluster_config = rl_cluster_lib.ClusterConfig(
        role_to_mesh={rl_cluster_lib.Role.ACTOR: mesh, rl_cluster_lib.Role.REFERENCE: mesh,
                      rl_cluster_lib.Role.ROLLOUT: mesh},
        rollout_engine="vanilla", offload_to_cpu=False,
        training_config=rl_cluster_lib.RLTrainingConfig(
            actor_optimizer=optax.adamw(1e-5), eval_every_n_steps=10 ** 9, max_steps=steps),
        rollout_config=base_rollout.RolloutConfig(
            max_tokens_to_generate=a.new_tokens, max_prompt_length=a.prompt_len,
            kv_cache_size=a.prompt_len + a.new_tokens + 8, temperature=1.0, top_p=1.0,
            top_k=None))
    cluster = rl_cluster_lib.RLCluster(actor=actor, reference=reference, tokenizer=ByteTokenizer(),
                                       cluster_config=cluster_config)
    stamps, cpu_stamps = [], []
    rng = np.random.default_rng(0)

    def reward(prompts, completions, **kwargs):
      del kwargs
      stamps.append(time.perf_counter())
      cpu_stamps.append(time.process_time())
      del prompts
      return list(rng.random(len(completions)))

    learner = grpo_learner.GRPOLearner(
        rl_cluster=cluster,
        algo_config=grpo_learner.GRPOConfig(num_generations=a.group, num_iterations=1, beta=0.04,
                                            epsilon=0.2),
        reward_fns=reward)
    letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz ", np.uint8)
    # An array, not a list: Tunix repeats each leaf of a batch G times along axis 0.
    data = [{"prompts": np.array([bytes(rng.choice(letters, a.prompt_len - 1)).decode()
                                  for _ in range(a.prompts)])} for _ in range(steps + 1)]
    start = time.perf_counter()
    learner.train(data)
    total = time.perf_counter() - start
  gaps = np.diff(np.asarray(stamps)).tolist()
  cpu = np.diff(np.asarray(cpu_stamps)).tolist()
  print(json.dumps({
      "times": gaps[a.warmup - 1:], "cpu_times": cpu[a.warmup - 1:], "compile_s": stamps[a.warmup - 1] - start if stamps else None,
      "total_s": total, "iterations_seen": len(stamps),
      "versions": {"google-tunix": importlib.metadata.version("google-tunix")}}))


if __name__ == "__main__":
  main()
