"""The peer-failure report (`parallel.peer_watch._peer_report`) and the heartbeat behind it.

A process ended by `peer_watchdog` names the peers that failed: those that never entered the
collective, or, when every peer entered it, those whose heartbeat stopped inside it (a peer
killed while inside a collective). Tested against an in-memory coordination service (the
key-value calls the report and the heartbeat make), two processes, this one process 0; the
two-process run with a real kill is `peer_failure_test`.
"""

import threading
import time
from unittest import mock

from absl.testing import absltest

from agentic_grpo.parallel import peer_watch


class FakeService:
  """The coordination client's key-value calls, in memory. `beating`: processes whose
  heartbeat count rises by one at every read of the heartbeat directory (alive ones)."""

  def __init__(self, beating=(), hang=False):
    self.store: dict[str, str] = {}
    self.beating = set(beating)
    self.hang = hang
    self.lock = threading.Lock()

  def key_value_set(self, key, value, allow_overwrite=False):
    with self.lock:
      if key in self.store and not allow_overwrite:
        raise RuntimeError(f"{key} exists")
      self.store[key] = value

  def key_value_dir_get(self, prefix):
    if self.hang:
      time.sleep(60)
    with self.lock:
      if prefix == peer_watch._HEARTBEAT_KEY:
        for q in self.beating:
          key = f"{prefix}{q}"
          self.store[key] = str(int(self.store.get(key, "0")) + 1)
      return [(k, v) for k, v in self.store.items() if k.startswith(prefix)]


def _as_process(test: absltest.TestCase, index: int) -> None:
  """Makes `test` run as process `index` of two (`jax.process_index` / `process_count`)."""
  patcher = mock.patch.multiple(peer_watch.jax, process_index=mock.DEFAULT,
                                process_count=mock.DEFAULT)
  mocks = patcher.start()
  mocks["process_index"].return_value = index
  mocks["process_count"].return_value = 2
  test.addCleanup(patcher.stop)


class PeerReportTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    _as_process(self, 0)

  def _service(self, entered: dict[int, int], beats: dict[int, int], **kw) -> FakeService:
    service = FakeService(**kw)
    for q, n in entered.items():
      service.store[f"{peer_watch._PROGRESS_KEY}{q}"] = str(n)
    for q, n in beats.items():
      service.store[f"{peer_watch._HEARTBEAT_KEY}{q}"] = str(n)
    return service

  def test_names_peer_not_at_the_collective(self):
    service = self._service({0: 7, 1: 6}, {0: 3, 1: 3}, beating=(0, 1))
    report = peer_watch._peer_report(7, client=service, wait_s=0.01)
    self.assertIn("Not at this collective (stuck or dead): process 1 (entered 6 host "
                  "collectives)", report)

  def test_names_peer_that_died_inside_the_collective(self):
    # Process 1 entered collective 7 and then died: its heartbeat no longer rises.
    service = self._service({0: 7, 1: 7}, {0: 40, 1: 38}, beating=(0,))
    report = peer_watch._peer_report(7, client=service, wait_s=0.01)
    self.assertRegex(report, r"stopped in it \(no heartbeat for 0.01 s: dead or stuck\): "
                             r"process 1\.")

  def test_live_peers_inside_the_collective_are_not_blamed(self):
    service = self._service({0: 7, 1: 7}, {0: 40, 1: 38}, beating=(0, 1))
    report = peer_watch._peer_report(7, client=service, wait_s=0.01)
    self.assertIn("is alive", report)
    self.assertNotIn("process 1", report)

  def test_peer_that_ended_itself_is_not_blamed(self):
    # With more processes, a peer that ended itself for this failure stops beating too.
    service = self._service({0: 7, 1: 7}, {0: 40, 1: 38}, beating=(0,))
    service.store[f"{peer_watch._EXITED_KEY}1"] = "1"
    report = peer_watch._peer_report(7, client=service, wait_s=0.01)
    self.assertNotIn("stopped in it", report)
    self.assertIn("ended itself", report)

  def test_a_peer_behind_is_named_without_waiting_for_heartbeats(self):
    service = self._service({0: 7, 1: 6}, {0: 3, 1: 3}, beating=(0, 1))
    t0 = time.monotonic()
    report = peer_watch._peer_report(7, client=service, wait_s=30.0)
    self.assertLess(time.monotonic() - t0, 10.0)
    self.assertIn("process 1 (entered 6", report)

  def test_mark_exited_writes_its_key(self):
    service = FakeService()
    peer_watch._mark_exited(service)
    self.assertEqual(service.store, {f"{peer_watch._EXITED_KEY}0": "1"})
    peer_watch._mark_exited(mock.Mock(**{"key_value_set.side_effect": RuntimeError("gone")}))

  def test_peer_without_heartbeat_is_not_judged_by_it(self):
    service = self._service({0: 7, 1: 7}, {0: 40}, beating=(0,))
    report = peer_watch._peer_report(7, client=service, wait_s=0.01)
    self.assertNotIn("stopped in it", report)

  def test_service_that_does_not_answer(self):
    service = self._service({0: 7, 1: 7}, {}, hang=True)
    with mock.patch.object(peer_watch, "_DIAGNOSE_S", 0.05):
      t0 = time.monotonic()
      report = peer_watch._peer_report(7, client=service, wait_s=0.01)
    self.assertLess(time.monotonic() - t0, 5.0)
    self.assertIn("does not answer", report)

  def test_no_service(self):
    with mock.patch.object(peer_watch, "_coordination_client", return_value=None):
      self.assertIn("No coordination service", peer_watch._peer_report(3))


class HeartbeatTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    _as_process(self, 1)
    self.addCleanup(setattr, peer_watch._WATCH, "heartbeat_stop", None)

  def _beat(self, service) -> int:
    return int(service.store.get(f"{peer_watch._HEARTBEAT_KEY}1", "0"))

  def test_beats_rise_until_stopped(self):
    service = FakeService()
    stop, thread = peer_watch.start_heartbeat(service, interval_s=0.01)
    deadline = time.monotonic() + 10
    while self._beat(service) < 3 and time.monotonic() < deadline:
      time.sleep(0.01)
    self.assertGreaterEqual(self._beat(service), 3)
    stop.set()
    thread.join(5.0)
    self.assertFalse(thread.is_alive())
    stopped_at = self._beat(service)
    time.sleep(0.05)
    self.assertEqual(self._beat(service), stopped_at)

  def test_a_new_heartbeat_stops_the_previous_one(self):
    first, first_thread = peer_watch.start_heartbeat(FakeService(), interval_s=0.01)
    second, second_thread = peer_watch.start_heartbeat(FakeService(), interval_s=0.01)
    first_thread.join(5.0)
    self.assertTrue(first.is_set())
    self.assertFalse(first_thread.is_alive())
    self.assertFalse(second.is_set())
    second.set()
    second_thread.join(5.0)

  def test_failed_writes_are_retried(self):
    # A live process whose write failed once must go on beating, or a peer's report would
    # name it as stopped.
    service = FakeService()
    real_set = service.key_value_set
    failures = [RuntimeError("connection reset")] * 2

    def flaky(key, value, allow_overwrite=False):
      if failures:
        raise failures.pop()
      real_set(key, value, allow_overwrite)

    service.key_value_set = flaky
    with mock.patch.object(peer_watch, "_HEARTBEAT_BACKOFF_S", 0.02):
      stop, thread = peer_watch.start_heartbeat(service, interval_s=0.01)
      deadline = time.monotonic() + 10
      while self._beat(service) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
      stop.set()
      thread.join(5.0)
    self.assertEqual(failures, [])
    self.assertGreaterEqual(self._beat(service), 2)

  def test_stops_when_jax_shuts_its_client_down(self):
    service = FakeService()
    with mock.patch.object(peer_watch, "_coordination_client", return_value=service):
      stop, thread = peer_watch.start_heartbeat(interval_s=0.01)
      deadline = time.monotonic() + 10
      while self._beat(service) < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    # Unpatched: JAX has no client now (no jax.distributed here), as after its shutdown.
    thread.join(5.0)
    self.assertFalse(thread.is_alive())
    self.assertFalse(stop.is_set())

  def test_no_client_starts_nothing(self):
    with mock.patch.object(peer_watch, "_coordination_client", return_value=None):
      stop, thread = peer_watch.start_heartbeat()
    self.assertTrue(stop.is_set())
    self.assertIsNone(thread)

  def test_bad_interval(self):
    with self.assertRaisesRegex(ValueError, "interval_s must be > 0, got 0"):
      peer_watch.start_heartbeat(FakeService(), interval_s=0)


class WatchdogTest(absltest.TestCase):
  """`set_timeout` and `peer_watchdog` as process 0 of two."""

  def setUp(self):
    super().setUp()
    _as_process(self, 0)
    self.addCleanup(peer_watch.set_timeout, peer_watch.timeout_s())
    self.addCleanup(setattr, peer_watch._WATCH, "entered", peer_watch._WATCH.entered)
    # No coordination service here: the watchdog's progress write is skipped.
    patcher = mock.patch.object(peer_watch, "_coordination_client", return_value=None)
    patcher.start()
    self.addCleanup(patcher.stop)

  def test_set_and_read(self):
    peer_watch.set_timeout(5)
    self.assertEqual(peer_watch.timeout_s(), 5.0)
    peer_watch.set_timeout(0)
    self.assertEqual(peer_watch.timeout_s(), 0.0)

  def test_bad_timeout(self):
    for bad in (-1, True, "5", float("nan")):
      with self.assertRaisesRegex(ValueError, "seconds must be a number >= 0"):
        peer_watch.set_timeout(bad)

  def test_without_a_timeout_an_error_is_the_callers(self):
    peer_watch.set_timeout(0)
    with mock.patch.object(peer_watch, "_end_for_peer_failure") as end:
      with self.assertRaises(KeyError):
        with peer_watch.peer_watchdog("test"):
          raise KeyError("x")
    end.assert_not_called()

  def test_with_a_timeout_an_error_ends_the_process(self):
    peer_watch.set_timeout(30)
    entered = peer_watch._WATCH.entered
    with mock.patch.object(peer_watch, "_end_for_peer_failure") as end:
      with peer_watch.peer_watchdog("test"):
        raise KeyError("x")
    end.assert_called_once_with("host collective #%d (test) failed: KeyError: 'x'"
                                % (entered + 1), entered + 1)

  def test_with_a_timeout_a_block_that_outlasts_it_ends_the_process(self):
    peer_watch.set_timeout(0.05)
    with mock.patch.object(peer_watch, "_end_for_peer_failure") as end:
      with peer_watch.peer_watchdog("slow"):
        deadline = time.monotonic() + 5.0
        while not end.called and time.monotonic() < deadline:
          time.sleep(0.01)
    end.assert_called_once()
    self.assertIn("(slow) did not complete within 0.05 s", end.call_args[0][0])


if __name__ == "__main__":
  absltest.main()
