"""The supervised warm-start phase (docs/design.md §1): token cross-entropy on reference episodes.

A small model from scratch first learns to write well-formed stages from the workflow's
reference episodes of training tasks (`agent.references`); its final parameters
start the RL phase and are the frozen reference policy of its KL term. The phase ends with a
held-out evaluation (greedy and sampled), the baseline of the paired gain.
"""

import time

import numpy as np

from agentic_grpo.agent import references
from agentic_grpo.core import types as core_types
from agentic_grpo.train import components as components_lib
from agentic_grpo.train import evaluation
from agentic_grpo.train import session as session_lib


def sft_batch(comp: components_lib.Components, tasks) -> core_types.SFTBatch:
  """Reference episodes as a warm-start batch `[len(tasks), warmstart.seq_len]`.

  Environment text (openings, observations) is context only; the reference stage outputs are
  the loss tokens. Episodes longer than `seq_len` are cut.
  """
  seq_len = comp.cfg.warmstart.seq_len
  wf = comp.workflow_factory()
  tok = comp.tokenizer
  tokens = np.full((len(tasks), seq_len), tok.pad_id, np.int32)
  mask = np.zeros((len(tasks), seq_len), bool)
  for r, task in enumerate(tasks):
    ids, m = [], []
    for seg in references.reference_segments(wf, task):
      opening, output = tok.encode(seg.opening), tok.encode(seg.output)
      ids += opening + output
      m += [False] * len(opening) + [True] * len(output)
    n = min(len(ids), seq_len)
    tokens[r, :n] = ids[:n]
    mask[r, :n] = m[:n]
  return core_types.SFTBatch(tokens, mask)


def run_phase(s: session_lib.Session) -> None:
  """Runs (or finishes) the warm-start, then hands its parameters to the RL phase.

  Without warm-start steps the phase is only the baseline evaluation of the initial policy.
  """
  if s.phase != "warmstart":
    return
  if s.ws_steps:
    _train(s)
  elif not s.stopping():
    s.record_eval(*evaluation.evaluate(s.comp, s.agent, s.device.policy, sampled=True))
    s.metrics.write(dict(step=s.step, phase="warmstart", seconds=time.time() - s.t_start,
                         **s.last_eval))
  if s.step >= s.ws_steps and not s.stopping():
    s.enter_rl()


def _train(s: session_lib.Session) -> None:
  """The warm-start steps from `s.step` on; each batch is a pure function of its step."""
  cfg = s.cfg

  def host_batch(step):
    s.ws_stream.position = step * s.ws_rows
    return sft_batch(s.comp, s.ws_stream.take(s.ws_rows)[1])

  next_batch = host_batch(s.step)
  while s.step < s.ws_steps and not s.stopping():
    t0 = time.time()
    pending = s.device.sft(next_batch)  # Dispatched asynchronously:
    s.advance()
    if s.step < s.ws_steps:
      next_batch = host_batch(s.step)  # the next batch is built while the device works.
    m = s.device.fetch([pending], step=s.step)[0]
    if session_lib.periodic(s.step, cfg.log.every) or s.step == s.ws_steps:
      dt = time.time() - t0
      row = {"step": s.step, "phase": "warmstart", "seconds": time.time() - s.t_start,
             "warmstart/loss": m["loss"], "warmstart/token_accuracy": m["token_accuracy"],
             "grad_norm": m["grad_norm"], "update_skipped": m["update_skipped"],
             "tokens_per_s": float(pending.tokens) / max(dt, 1e-9)}
      if s.step == s.ws_steps:
        # The RL update's shapes compile on a spare core while the evaluation decodes.
        s.device.compile_rl_updates()
        s.record_eval(*evaluation.evaluate(s.comp, s.agent, s.device.policy, sampled=True))
        row.update(s.last_eval)
      s.metrics.write(row)
    s.metrics.progress(s.step, "warmstart", float(m["loss"]))
    # The warm-start's last step is checkpointed whatever `checkpoint.every` says when it is
    # kept (`checkpoint.keep_warmstart`): a control run starts from it.
    s.checkpoint(force=s.keep_warmstart and s.step == s.ws_steps)
    s.agree_on_stop()
