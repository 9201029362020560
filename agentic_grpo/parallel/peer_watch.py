"""Peer-failure detection for multi-process runs: the watchdog, the heartbeat and the report.

A process that dies or stops (a hang, a stopped VM) would leave the others waiting in their
next collective. With a collective timeout (`collectives.initialize_distributed(
collective_timeout_s=)`, from `config.mesh`, which calls `set_timeout` and `start_heartbeat`):

* every host collective of `collectives`, and every wait on a program that spans processes
  (`collectives.fetch`, `batch.local_rows` / `batch.shard_batch`), runs under
  `peer_watchdog`: when it has not returned after the timeout, or when it raises (a dead
  peer's connection resets), the process logs which peers have not reached that collective
  (each process records in the coordination service how many host collectives it has
  entered), or, when every peer has reached it, which peers stopped inside it (each process
  also writes a heartbeat there every `_HEARTBEAT_S`, from a thread of its own, so a peer that
  died inside the collective, or whose VM stopped, stops beating; a peer hung in a call that
  releases the GIL still beats), and ends at once with status `EXIT_PEER_FAILURE`
  (`os._exit`: neither Python's nor JAX's exit handlers run, so the exit cannot wait for the
  failed peer). Checkpoints are written synchronously between collectives, so the last
  finished one restores.
* JAX's own heartbeat and shutdown timeouts (`jax.distributed.initialize`'s
  `heartbeat_timeout_seconds` / `shutdown_timeout_seconds`) are set to the
  same value: the coordination service declares a process that stopped
  sending heartbeats dead and aborts the others, even where they are not in
  a collective (e.g. in host code), and a process exiting on an error waits
  that long at most for the others at its shutdown barrier.

Limitations: device programs that span processes (the learner step, the
sampler) are not watched themselves, only the reads of their results that go
through this package and the host collectives around them; a timeout shorter
than the slowest legitimate gap between two processes reaching the same
collective (compilation, a long sandbox batch, evaluation) ends a healthy run.
"""

import atexit
import contextlib
import os
import sys
import threading
import time
from typing import Iterator, Optional

from absl import logging
import jax
# The coordination service client (live processes, key-value store) has no public accessor;
# it is used only to say which peer failed, and its absence only shortens the message.
from jax._src import distributed as jax_distributed

# Exit status of a process ended by `peer_watchdog` (sysexits' EX_TEMPFAIL: a restart resumes
# from the last checkpoint).
EXIT_PEER_FAILURE = 76  # agentic_grpo.exit_codes.PEER_FAILURE
# Coordination-service keys holding how many host collectives each process has entered.
_PROGRESS_KEY = "agentic_grpo/collectives_entered/"
_DIAGNOSE_S = 10.0  # at most this long asking the coordination service who failed
# Coordination-service keys holding each process's heartbeat: a count its heartbeat thread
# raises every `_HEARTBEAT_S` seconds; one that has not risen over `_HEARTBEAT_WAIT_S` is a
# process that died or stopped (a stopped VM, a hang that holds the GIL).
_HEARTBEAT_KEY = "agentic_grpo/heartbeat/"
_HEARTBEAT_S = 1.0
_HEARTBEAT_WAIT_S = 3.5
_HEARTBEAT_BACKOFF_S = 10.0  # the longest wait between tries after the service failed
# Keys of processes that ended themselves for a peer failure (their heartbeat stops too).
_EXITED_KEY = "agentic_grpo/exited/"


class _Watch:
  """The collective timeout (seconds; 0: off), this process's count of host collectives and
  its heartbeat thread's stop event (None: not beating)."""
  timeout_s: float = 0.0
  entered: int = 0
  heartbeat_stop: Optional[threading.Event] = None


_WATCH = _Watch()


def set_timeout(seconds: float) -> None:
  """Sets the collective timeout (seconds; 0: off) `peer_watchdog` watches with.

  Raises:
    ValueError: a negative or non-numeric `seconds`.
  """
  if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or not seconds >= 0:
    raise ValueError(f"seconds must be a number >= 0, got {seconds!r}")
  _WATCH.timeout_s = float(seconds)


def timeout_s() -> float:
  """The collective timeout in seconds (0: off)."""
  return _WATCH.timeout_s


def start_heartbeat(client=None, interval_s: float = _HEARTBEAT_S
                    ) -> tuple[threading.Event, Optional[threading.Thread]]:
  """Starts this process's heartbeat (module docstring): a daemon thread that raises the count
  under `_HEARTBEAT_KEY<process index>` in the coordination service every `interval_s`
  seconds, so that a peer's `peer_watchdog` report can tell a process that stopped inside a
  collective from one that is only slow. Started by `collectives.initialize_distributed` with
  a collective timeout; stopped at interpreter exit, before JAX's own shutdown (its exit handler was
  registered first, so it runs after this one), and when JAX's client is gone
  (`jax.distributed.shutdown`). A failed write is retried, backing off to
  `_HEARTBEAT_BACKOFF_S`: one lost write must not make a live process look stopped.

  Args:
    client: the coordination-service client (default: JAX's, followed as above); None there:
      nothing starts.
    interval_s: seconds between beats (> 0).

  Returns:
    `(stop, thread)`: the event that stops the beats (already set, and no thread, when nothing
    started) and the thread.

  Raises:
    ValueError: `interval_s` not positive.
  """
  if not interval_s > 0:
    raise ValueError(f"interval_s must be > 0, got {interval_s!r}")
  follow = client is None
  client = client if client is not None else _coordination_client()
  stop = threading.Event()
  if client is None:
    stop.set()
    return stop, None
  if _WATCH.heartbeat_stop is not None:
    _WATCH.heartbeat_stop.set()
  key = f"{_HEARTBEAT_KEY}{jax.process_index()}"

  def beat():
    count, wait, warned = 0, interval_s, False
    while not stop.is_set():
      if follow and _coordination_client() is not client:
        return  # JAX shut its client down
      count += 1
      try:
        client.key_value_set(key, str(count), allow_overwrite=True)
        wait = interval_s
      except Exception as e:  # pylint: disable=broad-except
        if not warned:
          logging.warning("heartbeat write failed (retrying): %s", e)
          warned = True
        wait = min(2 * wait, max(interval_s, _HEARTBEAT_BACKOFF_S))
      stop.wait(wait)

  thread = threading.Thread(target=beat, name="peer-heartbeat", daemon=True)
  thread.start()
  _WATCH.heartbeat_stop = stop

  def end():
    stop.set()
    thread.join(2 * interval_s)

  atexit.register(end)
  return stop, thread


def _coordination_client():
  state = getattr(jax_distributed, "global_state", None)
  return getattr(state, "client", None)


@contextlib.contextmanager
def peer_watchdog(what: str) -> Iterator[None]:
  """Ends this process, with a message naming the failed peers, when the block inside does not
  return within the collective timeout or raises.

  For blocks that every process enters at the same point of the program (host collectives, a
  wait on a program that spans processes). A no-op with one process or without a timeout
  (`collectives.initialize_distributed(collective_timeout_s=)`, `set_timeout`). On failure the
  process logs (and prints to stderr) which peers have not reached this collective (stuck or
  dead), then calls `os._exit(EXIT_PEER_FAILURE)` (see the module docstring for why).

  Args:
    what: a short name of the collective for the message.
  """
  timeout = _WATCH.timeout_s
  if timeout <= 0 or jax.process_count() == 1:
    yield
    return
  _WATCH.entered += 1
  number = _WATCH.entered
  done = threading.Event()

  def watch():
    if not done.wait(timeout):
      _end_for_peer_failure(f"host collective #{number} ({what}) did not complete within "
                            f"{timeout:g} s", number)

  threading.Thread(target=watch, name="peer-watchdog", daemon=True).start()
  try:
    client = _coordination_client()
    if client is not None:
      client.key_value_set(f"{_PROGRESS_KEY}{jax.process_index()}", str(number),
                           allow_overwrite=True)
    yield
  except Exception as e:  # pylint: disable=broad-except
    done.set()
    _end_for_peer_failure(f"host collective #{number} ({what}) failed: "
                          f"{type(e).__name__}: {e}", number)
  finally:
    done.set()


def _peer_report(number: int, client=None, wait_s: float = _HEARTBEAT_WAIT_S) -> str:
  """Which peers failed host collective `number`, from the coordination service's key-value
  store: those that have not entered it (stuck or dead), else those that entered it and then
  stopped (their heartbeat, `start_heartbeat`, did not rise over `wait_s` seconds; peers that
  ended themselves for a peer failure meanwhile are not counted). Bounded by
  `_DIAGNOSE_S + wait_s` (the service may have died with process 0). Its list of live
  processes is not asked: that call waits for every live process, a stuck one included.

  Args:
    number: the collective's number (this process's count of host collectives entered).
    client: the coordination-service client (default: JAX's).
    wait_s: seconds between the two reads of the heartbeats (only when no peer is behind).

  Returns:
    One or two sentences for the failure message.
  """
  client = client if client is not None else _coordination_client()
  if client is None:
    return "No coordination service to ask which peer failed."
  me, count = jax.process_index(), jax.process_count()
  answer = {}

  def read(prefix: str) -> dict[int, int]:
    return {int(k.rsplit("/", 1)[-1]): int(v) for k, v in client.key_value_dir_get(prefix)}

  def ask(what: str, fn) -> bool:
    def run():
      answer[what] = fn()
    asker = threading.Thread(target=run, name="peer-report", daemon=True)
    asker.start()
    asker.join(_DIAGNOSE_S + (wait_s if what == "beats" else 0.0))
    return what in answer

  if not ask("entered", lambda: read(_PROGRESS_KEY)):
    return ("The coordination service (process 0) does not answer: process 0 is likely dead "
            "or stuck.")
  entered = answer["entered"]
  behind = {q: entered.get(q, 0) for q in range(count) if q != me and entered.get(q, 0) < number}
  if behind:
    return "Not at this collective (stuck or dead): " + ", ".join(
        f"process {q} (entered {n} host collectives)" for q, n in sorted(behind.items())) + "."

  def beats():
    before = read(_HEARTBEAT_KEY)
    time.sleep(wait_s)
    return before, read(_HEARTBEAT_KEY), read(_EXITED_KEY)

  if not ask("beats", beats):
    return ("Every peer has entered this collective, and the coordination service stopped "
            "answering: process 0 is likely dead or stuck.")
  before, after, exited = answer["beats"]
  # A peer with a heartbeat that did not rise stopped; one that never beat has no thread to
  # judge it by (a run started without a collective timeout on that process).
  stopped = [q for q in range(count) if q != me and q in before and q not in exited
             and after.get(q, 0) <= before[q]]
  if stopped:
    return (f"Every peer has entered this collective; stopped in it (no heartbeat for "
            f"{wait_s:g} s: dead or stuck): " + ", ".join(f"process {q}" for q in stopped)
            + ".")
  return ("Every peer has entered this collective and is alive (its heartbeat rises) or ended "
          "itself; see their logs for the failure.")


def _end_for_peer_failure(reason: str, number: int) -> None:
  """Logs why and who failed, then ends this process at once (`os._exit`)."""
  message = (f"process {jax.process_index()} of {jax.process_count()}: {reason}. "
             f"{_peer_report(number)} Ending this process with status {EXIT_PEER_FAILURE}; "
             f"restart the run to resume from its last checkpoint.")
  logging.error("%s", message)
  print(message, file=sys.stderr, flush=True)
  logging.flush()
  _mark_exited()
  os._exit(EXIT_PEER_FAILURE)  # pylint: disable=protected-access


def _mark_exited(client=None, timeout_s: float = 2.0) -> None:
  """Records in the coordination service that this process ends itself (`_EXITED_KEY`), so
  that a slower peer's report does not count its stopped heartbeat as a failure; bounded by
  `timeout_s` (the service may be gone)."""
  client = client if client is not None else _coordination_client()
  if client is None:
    return

  def mark():
    try:
      client.key_value_set(f"{_EXITED_KEY}{jax.process_index()}", "1", allow_overwrite=True)
    except Exception:  # pylint: disable=broad-except
      pass

  marker = threading.Thread(target=mark, name="peer-exited", daemon=True)
  marker.start()
  marker.join(timeout_s)
