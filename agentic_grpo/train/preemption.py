"""Stopping on SIGTERM / SIGINT: finish the current step, checkpoint, end with `Preempted`.

A preemptible VM gets SIGTERM (and a short grace period) before it is taken away; Ctrl-C sends
SIGINT. `StopRequest` turns the first such signal into a flag that the run's loops read between
steps (`requested`): the step in progress finishes, every process agrees to stop at the same
step (`train.coordination`), a checkpoint is written (learner state, replay, in-flight
episodes, unlogged metrics) and `run` raises `Preempted`; `launch/train.py` exits with
`exit_codes.PREEMPTED`. The next start on the same workdir resumes exactly there.

After the first signal the previous handlers are back: a second SIGINT interrupts at once
(`KeyboardInterrupt`), a second SIGTERM ends the process.
"""

import signal
import threading
from typing import Optional

from absl import logging

from agentic_grpo import exit_codes

_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Preempted(Exception):
  """The run stopped on a signal after writing a checkpoint at global step `step`."""
  exit_code = exit_codes.PREEMPTED

  def __init__(self, step: int, signal_name: str):
    super().__init__(f"stopped by {signal_name} at global step {step} after writing a "
                     f"checkpoint; rerun with the same workdir to resume")
    self.step = step
    self.signal_name = signal_name


class StopRequest:
  """A context manager that records SIGTERM / SIGINT instead of dying at once.

  Handlers can only be installed from the main thread; elsewhere (a run started from a worker
  thread) signals keep their default behaviour and `requested` stays False.
  """

  def __init__(self):
    self.signal_name: Optional[str] = None
    self._previous = {}

  @property
  def requested(self) -> bool:
    """True once a signal arrived."""
    return self.signal_name is not None

  def _handle(self, signum, frame):
    del frame
    self.signal_name = signal.Signals(signum).name
    logging.warning("received %s: finishing the current step, then writing a checkpoint "
                    "(send it again to stop at once)", self.signal_name)
    self._restore()

  def _restore(self):
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)
    self._previous = {}

  def __enter__(self) -> "StopRequest":
    if threading.current_thread() is threading.main_thread():
      for sig in _SIGNALS:
        self._previous[sig] = signal.signal(sig, self._handle)
    return self

  def __exit__(self, *exc) -> None:
    self._restore()
