"""CPU end to end: a tiny random Qwen2-style chat checkpoint trained with Agentic GRPO on
HumanEval problems, and on competitive-programming problems judged on stdin/stdout (the
`stdio` source, a JSONL in two layouts written here), in the `chat` prompt format, through
`train.run`.

The checkpoint is written here (`tests/fixtures/chat_checkpoint.py`): random parameters through
`hf_export`, a byte-level BPE tokenizer trained in the test on the problems' text, a ChatML chat
template and a generation config whose end-of-generation ids are `<|im_end|>` and
`<|endoftext|>`. The run takes RL updates, evaluates (pass@k), checkpoints, stops, and
resumes. Recorded on the way: every call of the sampler (prompt ids in, generated ids out) and
every stage row the learner gets from the replay (ids and loss mask), to check token in, token
out: the learner trains on exactly the ids the sampler saw and produced, turn by turn, and its
loss mask covers the assistant's tokens only.
"""

import json
import os
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
import jax
import numpy as np

from agentic_grpo import config as config_lib
from agentic_grpo import exporting
from agentic_grpo import replay as replay_lib
from agentic_grpo import sandbox
from agentic_grpo import train
from agentic_grpo.models import hf_import
from agentic_grpo.train import sampling as sampling_lib
from tests.fixtures import chat_checkpoint


def _stdio_rows() -> list[dict]:
  """Eight small stdin/stdout problems, four in the CodeContests layout and four in APPS'."""
  return chat_checkpoint.stdio_rows()


class ChatRunTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("one_device", {"data": 1}),
      # A Hugging Face checkpoint loaded into a (2, 2, 2) mesh of 8 devices, trained, exported.
      ("mesh_2x2x2", {"data": 2, "fsdp": 2, "tensor": 2}))
  def test_humaneval_chat_run_is_token_in_token_out_and_resumes(self, mesh):
    tmp = self.create_tempdir().full_path
    problems = chat_checkpoint.humaneval_problems()
    data = os.path.join(tmp, "humaneval.jsonl")
    with open(data, "w") as f:
      f.writelines(json.dumps(p) + "\n" for p in problems)
    ckpt = os.path.join(tmp, "ckpt")
    ids = chat_checkpoint.write_checkpoint(
        ckpt, [p["prompt"] + p["canonical_solution"] for p in problems])
    workdir = self._run_and_check(ckpt, ids, {"source": "humaneval", "path": data},
                                  ("code", "debug"), mesh)

    # The trained run exports as a Hugging Face directory that imports back exactly.
    _, _, step, params = exporting.restore_params(workdir)
    self.assertEqual(step, 2)
    out = exporting.export_run(workdir, os.path.join(tmp, "exported"))
    reloaded = hf_import.load_hf_checkpoint(out)[1]
    for x, y in zip(jax.tree.leaves(params), jax.tree.leaves(reloaded), strict=True):
      np.testing.assert_array_equal(np.asarray(x), np.asarray(y))

  @parameterized.named_parameters(
      ("static", {}),
      # The real stdio run's sampler (experiments/qwen2_5_coder_1_5b_stdio.py: continuous
      # batching), here with each turn continuing from the previous turn's saved cache.
      # Six updates: saved prefixes are not checkpointed, so turns reuse only after the
      # resume's first new episode batch.
      ("continuous_reused_prefixes", {"sampler": "continuous", "sampler_slots": 1,
                                      "reuse_prefix": "always", "num_steps": 6}))
  def test_stdio_chat_run_is_token_in_token_out_and_resumes(self, rl):
    """Competitive-programming problems judged on stdin/stdout (`stdio` source, two layouts,
    references checked in the sandbox at load time), code -> tests -> debug, one device."""
    tmp = self.create_tempdir().full_path
    rows = _stdio_rows()
    data = os.path.join(tmp, "problems.jsonl")
    with open(data, "w") as f:
      f.writelines(json.dumps(r) + "\n" for r in rows)
    ckpt = os.path.join(tmp, "ckpt")
    texts = [r.get("description", r.get("question", "")) for r in rows] + [
        "Write a complete Python program that reads the input from standard input and prints "
        "the answer.\n```python\nn = int(input())\nprint(n)\n```\n'1 2\\n' -> '3\\n'"]
    ids = chat_checkpoint.write_checkpoint(ckpt, texts)
    task = {"source": "stdio", "path": data, "stdio_layout": "auto"}
    self._run_and_check(ckpt, ids, task, ("code", "tests", "debug"), {"data": 1}, rl)

  def _run_and_check(self, ckpt, ids, task, stages, mesh, rl=None) -> str:
    """RL updates in the `chat` format (two unless `rl` says; stop after one, resume),
    recording every sampler call and every row the learner gets; checks token in, token out
    turn by turn, the loss masks and pass@k in `metrics.jsonl`. Returns the workdir."""
    cfg = config_lib.from_config_dict({
        "model": {"source": "hf", "path": ckpt},
        "task": dict(task, heldout_fraction=0.5, eval_size=2),
        "workflow": {"prompt_format": "chat", "stages": stages,
                     "max_new_tokens": 12, "max_obs_chars": 80},
        "rl": {"tasks_per_batch": 1, "group_size": 2, "rows_per_update": 4,
               "buckets": (512,), "batches_in_flight": 1, "num_steps": 2, **(rl or {})},
        "warmstart": {"steps": 0},
        "eval": {"every": 0, "num_samples": 2, "k": (1, 2)},
        "replay": {"skip_zero_advantage": False},
        "checkpoint": {"every": 1}, "log": {"progress_bar": False},
        "mesh": mesh})
    samples, rows, reused = [], [], []
    make_sample_fn, add_stage = sampling_lib.make_sample_fn, replay_lib.StagedReplay.add_stage

    def recording_make_sample_fn(*args, **kwargs):
      inner = make_sample_fn(*args, **kwargs)

      def sample_fn(params, prompts, lengths, counter, greedy, **kwargs):
        out = inner(params, prompts, lengths, counter, greedy, **kwargs)
        tokens, out_len = out[:2]
        for p, n, t, m in zip(prompts, lengths, np.asarray(tokens), np.asarray(out_len),
                              strict=True):
          samples.append((tuple(p[:n].tolist()), tuple(t[:m].tolist())))
        if len(out) == 4:  # reused prefixes: the call's counts
          reused.append(out[3]["prefix_reused_tokens"])
        return out
      return sample_fn

    def recording_add_stage(replay, episode_ids, k, stage_rows, masks, *args):
      rows.extend((e, k, np.asarray(r), np.asarray(m))
                  for e, r, m in zip(episode_ids, stage_rows, masks, strict=True))
      return add_stage(replay, episode_ids, k, stage_rows, masks, *args)

    workdir = os.path.join(os.path.dirname(ckpt), "run")
    with sandbox.SandboxPool(max_workers=2) as pool, \
        mock.patch.object(sampling_lib, "make_sample_fn", recording_make_sample_fn), \
        mock.patch.object(replay_lib.StagedReplay, "add_stage", recording_add_stage):
      self.assertEqual(train.run(cfg, workdir, pool=pool, stop_after=1)["step"], 1)
      result = train.run(cfg, workdir, pool=pool)
    self.assertEqual(result["step"], cfg.rl.num_steps)

    # Token in, token out, turn by turn.
    sampled = {}  # context -> the generations sampled from it (a group shares its prompt)
    for context, gen in samples:
      sampled.setdefault(context, set()).add(gen)
    by_episode = {}
    for e, k, row, mask in rows:
      by_episode.setdefault(e, {})[k] = (row, mask)
    self.assertNotEmpty(by_episode)
    for stages in by_episode.values():
      for k, (row, mask) in sorted(stages.items()):
        n = int(np.argmax(mask)) if mask.any() else len(row)
        context, gen = tuple(row[:n].tolist()), tuple(row[n:].tolist())
        # The loss mask covers the assistant's tokens only: one run at the end of the row.
        self.assertTrue(mask[n:].all() and not mask[:n].any())
        self.assertIn(gen, sampled[context])  # what the sampler saw and produced
        self.assertNotIn(ids["<|im_start|>"], gen)
        if ids["<|im_end|>"] in gen:  # a turn ends at its end-of-turn token
          self.assertEqual(gen[-1], ids["<|im_end|>"])
        if k == 0:
          self.assertEqual(context[0], ids["<|im_start|>"])
        if k + 1 in stages:  # the next turn extends this one's ids, never re-tokenised
          nxt = stages[k + 1][0]
          np.testing.assert_array_equal(nxt[:len(row)], row)
          self.assertEqual(int(nxt[len(row) + 1]), ids["<|im_start|>"])

    with open(os.path.join(workdir, "metrics.jsonl")) as f:
      metrics = [json.loads(line) for line in f]
    evals = [m for m in metrics if "eval/pass_at_1" in m]
    self.assertNotEmpty(evals)
    if (rl or {}).get("reuse_prefix", "never") != "never":
      # Later turns started from the earlier turns' saved caches, and the ids above are still
      # the sampler's own.
      self.assertGreater(sum(reused), 0)
      self.assertGreater(sum(m.get("loop/prefix_hits", 0) for m in metrics), 0)
    self.assertTrue(any("eval/pass_at_2_sampled" in m for m in metrics), sorted(metrics[-1]))
    return workdir


if __name__ == "__main__":
  absltest.main()
