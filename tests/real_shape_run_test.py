"""CPU end to end on a checkpoint of the shape real ones have: a tiny random Qwen3 chat model
whose embedding has more rows than its BPE tokenizer has ids (as Qwen2.5 / Qwen3 pad 151,665
ids to 151,936 rows), a ChatML chat template, and competitive-programming problems in the
CodeContests and APPS layouts, one of them with a float answer, in a held-out split smaller
than `task.eval_size`.

Everything is written here (`tests/fixtures/chat_checkpoint.py`: random parameters through
`hf_export`, a byte-level BPE tokenizer trained in the test); nothing is downloaded. Checked:
the float problem survives the load-time reference check (its reference prints `1.5000000000`
for `1.5`) and is judged right; RL runs and no sampled id is a padded row (the tokenizer could
not decode it), with the learner's log-probs equal to the sampler's on policy; the held-out
split is evaluated once per task, its standard errors over those tasks; and sampled evaluation
of the checkpoint and of the model as loaded runs.
"""

import json
import os
from unittest import mock

from absl.testing import absltest
import numpy as np

from agentic_grpo import config as config_lib
from agentic_grpo import sandbox
from agentic_grpo import train
from agentic_grpo.sandbox import execution
from agentic_grpo.train import components as components_lib
from agentic_grpo.train import eval_only
from agentic_grpo.train import sampling as sampling_lib
from tests.fixtures import chat_checkpoint

# The tokenizer's ids and the embedding's rows (six padded rows past the tokenizer).
BPE_IDS, ROWS = 330, 336
HALF = "a, b = map(int, input().split())\nprint(f'{a / b:.10f}')\n"


def _rows() -> list[dict]:
  """Five stdin/stdout problems, each in the CodeContests and the APPS layout; `half` prints
  a float (its tests expect `1.5`, its reference prints `1.5000000000`)."""
  half = ("half", "Print a / b.", HALF, [("3 2", "1.5"), ("1 4", "0.25"), ("10 5", "2")])
  return chat_checkpoint.stdio_rows(chat_checkpoint.STDIO_PROBLEMS + (half,))


class _Finite:
  """A finite task source of `sizes[split]` tasks per split (`task` cycles, as finite ones do)."""

  def __init__(self, **sizes):
    self.sizes = sizes

  def size(self, split):
    return self.sizes[split]


class _Endless:
  """An endless source: no `size`."""


class HeldOutCountTest(absltest.TestCase):
  """A held-out split smaller than `task.eval_size` is evaluated once per task (and said so);
  the headroom's task counts stop at the splits' sizes too."""

  def _cfg(self, eval_size, headroom=64):
    return config_lib.from_config_dict({
        "task": {"eval_size": eval_size},
        "eval": {"headroom_tasks": headroom, "headroom_train_tasks": headroom}})

  def test_small_split_is_evaluated_once_and_logged(self):
    cfg = self._cfg(1024)
    with self.assertLogs(level="WARNING") as logs:
      self.assertEqual(components_lib.eval_count(cfg, _Finite(test=3, train=9)), 3)
    self.assertIn("has 3 task(s), fewer than task.eval_size=1024: each is evaluated once",
                  "\n".join(logs.output))
    self.assertEqual(components_lib.eval_count(self._cfg(2), _Finite(test=3, train=9)), 2)
    self.assertEqual(components_lib.eval_count(self._cfg(64), _Endless()), 64)

  def test_headroom_counts_stop_at_the_splits(self):
    self.assertEqual(components_lib.headroom_sizes(self._cfg(64), _Finite(test=3, train=2)),
                     (3, 2))
    self.assertEqual(components_lib.headroom_sizes(self._cfg(64, headroom=8), _Endless()), (8, 8))
    self.assertEqual(components_lib.headroom_sizes(self._cfg(4, headroom=8)), (4, 4))

  def test_headroom_takes_the_evaluation_tasks(self):
    """The headroom's held-out tasks are the evaluation's first ones, drawn once."""
    cfg = config_lib.from_config_dict({
        "task": {"eval_size": 6},
        "eval": {"headroom_tasks": 4, "headroom_train_tasks": 3}})
    source = components_lib.task_source(cfg)
    drawn = []
    counting = mock.Mock(wraps=source)
    counting.task.side_effect = lambda split, i: drawn.append((split, i)) or source.task(split, i)
    with mock.patch.object(components_lib, "task_source", return_value=counting):
      comp = components_lib.build(cfg, pool=mock.Mock())
    self.assertEqual(sorted(d for d in drawn if d[0] == "test"), [("test", i) for i in range(6)])
    self.assertEqual([t.task_id for t in comp.headroom_tasks],
                     [t.task_id for t in comp.eval_tasks[:4]])
    self.assertEqual(comp.headroom_tasks, [source.task("test", i) for i in range(4)])
    self.assertEqual(comp.headroom_train_tasks, [source.task("train", i) for i in range(3)])


class RealShapeRunTest(absltest.TestCase):

  def test_padded_qwen3_checkpoint_on_stdio_problems(self):
    tmp = self.create_tempdir().full_path
    data = os.path.join(tmp, "problems.jsonl")
    rows = _rows()
    with open(data, "w") as f:
      f.writelines(json.dumps(r) + "\n" for r in rows)
    ckpt = os.path.join(tmp, "ckpt")
    texts = [r.get("description", r.get("question", "")) for r in rows] + [
        "Write a complete Python program that reads the input from standard input and prints "
        "the answer.\n```python\nn = int(input())\nprint(n)\n```\n'1 2\\n' -> '3\\n'"]
    ids = chat_checkpoint.write_checkpoint(ckpt, texts, family="qwen3", vocab_size=BPE_IDS,
                                           padded_rows=ROWS - BPE_IDS, max_seq_len=256)
    self.assertEqual(ids["vocab_size"], BPE_IDS)
    with open(os.path.join(ckpt, "config.json")) as f:
      hf = json.load(f)
    self.assertEqual((hf["model_type"], hf["vocab_size"]), ("qwen3", ROWS))

    cfg = config_lib.from_config_dict({
        "model": {"source": "hf", "path": ckpt},
        "task": {"source": "stdio", "path": data, "stdio_layout": "auto",
                 "heldout_fraction": 0.3, "eval_size": 64},
        "workflow": {"prompt_format": "chat", "stages": ("code", "debug"),
                     "max_new_tokens": 12, "max_obs_chars": 60},
        "rl": {"tasks_per_batch": 1, "group_size": 2, "rows_per_update": 4,
               "buckets": (128, 224), "batches_in_flight": 1, "num_steps": 2},
        "warmstart": {"steps": 0, "seq_len": 128},
        "eval": {"every": 0, "num_samples": 2, "k": (1, 2), "headroom_tasks": 0},
        "replay": {"skip_zero_advantage": False},
        "checkpoint": {"every": 1}, "log": {"progress_bar": False}})
    samples = []
    make_sample_fn = sampling_lib.make_sample_fn

    def recording_make_sample_fn(*args, **kwargs):
      inner = make_sample_fn(*args, **kwargs)

      def sample_fn(params, prompts, lengths, counter, greedy):
        tokens, out_len, logprobs = inner(params, prompts, lengths, counter, greedy)
        samples.extend(t[:m].tolist() for t, m in zip(np.asarray(tokens), np.asarray(out_len),
                                                      strict=True))
        return tokens, out_len, logprobs
      return sample_fn

    workdir = os.path.join(tmp, "run")
    with sandbox.SandboxPool(max_workers=2) as pool, \
        mock.patch.object(sampling_lib, "make_sample_fn", recording_make_sample_fn):
      # The float problem is kept in both layouts (its reference passes its own tests) and a
      # correct program is judged right, a wrong one wrong.
      comp = components_lib.build(cfg, pool=pool)
      tasks = comp.tasks.train + comp.tasks.heldout
      self.assertLen(tasks, len(rows))
      halves = [t for t in tasks if t.task_id in ("codecontests/half", "apps/half2")]
      self.assertLen(halves, 2)
      self.assertEqual(execution.reference_failures(halves, pool), [None, None])
      for task in halves:
        [good, plain, wrong] = pool.map([execution.hidden_program(task, s, pool) for s in (
            HALF, "a, b = map(int, input().split())\nprint(a / b)\n",
            "a, b = map(int, input().split())\nprint(a // b)\n")])
        self.assertEqual([good.verdict, plain.verdict, wrong.verdict],
                         [sandbox.StdioVerdict.PASSED] * 2 + [sandbox.StdioVerdict.WRONG_ANSWER])
      # The sampler draws only ids the tokenizer has.
      self.assertEqual(sampling_lib.vocab_limit(comp), BPE_IDS)
      self.assertEqual((comp.tokenizer.vocab_size, comp.model_config.vocab_size),
                       (BPE_IDS, ROWS))
      heldout = len(comp.tasks.heldout)
      self.assertLess(heldout, cfg.task.eval_size)

      # RL runs (stop after one update, resume), then evaluates with sampling.
      self.assertEqual(train.run(cfg, workdir, pool=pool, stop_after=1)["step"], 1)
      self.assertEqual(train.run(cfg, workdir, pool=pool)["step"], 2)
      # Sampled evaluation of the run's checkpoint and of the model as loaded.
      ckpt_eval = eval_only.evaluate_checkpoint(workdir, None, pool=pool)
      model_eval = eval_only.evaluate_model(cfg, os.path.join(tmp, "as_loaded"), pool=pool)

    self.assertNotEmpty(samples)
    self.assertLess(max(max(s) for s in samples if s), BPE_IDS)
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
      metrics = [json.loads(line) for line in f]
    updates = [m for m in metrics if "loss/ratio_mean" in m]
    self.assertNotEmpty(updates)
    # The first update is on policy: the learner's log-probs (over the tokenizer's ids, as the
    # sampler's) give ratio 1; over all 336 rows they would be off by the padded rows' mass.
    np.testing.assert_allclose(updates[0]["loss/ratio_mean"], 1.0, atol=1e-4)
    evals = [m for m in metrics if "eval/pass_at_1" in m]
    self.assertNotEmpty(evals)
    self.assertIn("eval/pass_at_2_sampled", evals[-1])
    # The held-out split is smaller than eval_size: each task once, the s.e. over those tasks.
    self.assertEqual(comp.eval_count, heldout)
    for m in evals:
      self.assertEqual(m["eval/num_tasks"], heldout)
      p = m["eval/pass_at_1"]
      self.assertAlmostEqual(m["eval/pass_at_1_stderr"], np.sqrt(p * (1 - p) / heldout))
    for record in (ckpt_eval, model_eval):
      self.assertIn("eval/pass_at_2_sampled", record["metrics"])
      self.assertIn(f"on {heldout} held-out stdio tasks (the whole held-out split, fewer than "
                    f"eval_size=64: each once)", eval_only.summary(record))
      self.assertLen(record["task_ids"], heldout)  # each held-out task once
      self.assertLen(set(record["task_ids"]), heldout)


if __name__ == "__main__":
  absltest.main()
