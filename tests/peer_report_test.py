"""The peer-failure report (`parallel.collectives._peer_report`) and the heartbeat behind it.

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

from agentic_grpo.parallel import collectives


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
      if prefix == collectives._HEARTBEAT_KEY:
        for q in self.beating:
          key = f"{prefix}{q}"
          self.store[key] = str(int(self.store.get(key, "0")) + 1)
      return [(k, v) for k, v in self.store.items() if k.startswith(prefix)]


def _two_processes():
  return mock.patch.multiple(collectives.jax, process_index=mock.DEFAULT,
                             process_count=mock.DEFAULT)


class PeerReportTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    patcher = _two_processes()
    mocks = patcher.start()
    mocks["process_index"].return_value = 0
    mocks["process_count"].return_value = 2
    self.addCleanup(patcher.stop)

  def _service(self, entered: dict[int, int], beats: dict[int, int], **kw) -> FakeService:
    service = FakeService(**kw)
    for q, n in entered.items():
      service.store[f"{collectives._PROGRESS_KEY}{q}"] = str(n)
    for q, n in beats.items():
      service.store[f"{collectives._HEARTBEAT_KEY}{q}"] = str(n)
    return service

  def test_names_peer_not_at_the_collective(self):
    service = self._service({0: 7, 1: 6}, {0: 3, 1: 3}, beating=(0, 1))
    report = collectives._peer_report(7, client=service, wait_s=0.01)
    self.assertIn("Not at this collective (stuck or dead): process 1 (entered 6 host "
                  "collectives)", report)

  def test_names_peer_that_died_inside_the_collective(self):
    # Process 1 entered collective 7 and then died: its heartbeat no longer rises.
    service = self._service({0: 7, 1: 7}, {0: 40, 1: 38}, beating=(0,))
    report = collectives._peer_report(7, client=service, wait_s=0.01)
    self.assertRegex(report, r"stopped in it \(no heartbeat for 0.01 s: dead or stuck\): "
                             r"process 1\.")

  def test_live_peers_inside_the_collective_are_not_blamed(self):
    service = self._service({0: 7, 1: 7}, {0: 40, 1: 38}, beating=(0, 1))
    report = collectives._peer_report(7, client=service, wait_s=0.01)
    self.assertIn("is alive", report)
    self.assertNotIn("process 1", report)

  def test_peer_without_heartbeat_is_not_judged_by_it(self):
    service = self._service({0: 7, 1: 7}, {0: 40}, beating=(0,))
    report = collectives._peer_report(7, client=service, wait_s=0.01)
    self.assertNotIn("stopped in it", report)

  def test_service_that_does_not_answer(self):
    service = self._service({0: 7, 1: 7}, {}, hang=True)
    with mock.patch.object(collectives, "_DIAGNOSE_S", 0.05):
      t0 = time.monotonic()
      report = collectives._peer_report(7, client=service, wait_s=0.01)
    self.assertLess(time.monotonic() - t0, 5.0)
    self.assertIn("does not answer", report)

  def test_no_service(self):
    with mock.patch.object(collectives, "_coordination_client", return_value=None):
      self.assertIn("No coordination service", collectives._peer_report(3))


class HeartbeatTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    patcher = _two_processes()
    mocks = patcher.start()
    mocks["process_index"].return_value = 1
    mocks["process_count"].return_value = 2
    self.addCleanup(patcher.stop)
    self.addCleanup(setattr, collectives._WATCH, "heartbeat_stop", None)

  def _beat(self, service) -> int:
    return int(service.store.get(f"{collectives._HEARTBEAT_KEY}1", "0"))

  def test_beats_rise_until_stopped(self):
    service = FakeService()
    stop = collectives.start_heartbeat(service, interval_s=0.01)
    deadline = time.monotonic() + 10
    while self._beat(service) < 3 and time.monotonic() < deadline:
      time.sleep(0.01)
    self.assertGreaterEqual(self._beat(service), 3)
    stop.set()
    time.sleep(0.05)
    stopped_at = self._beat(service)
    time.sleep(0.1)
    self.assertEqual(self._beat(service), stopped_at)

  def test_a_new_heartbeat_stops_the_previous_one(self):
    first = collectives.start_heartbeat(FakeService(), interval_s=0.01)
    second = collectives.start_heartbeat(FakeService(), interval_s=0.01)
    self.assertTrue(first.is_set())
    self.assertFalse(second.is_set())
    second.set()

  def test_service_failure_ends_the_thread_quietly(self):
    service = mock.Mock()
    service.key_value_set.side_effect = RuntimeError("connection reset")
    collectives.start_heartbeat(service, interval_s=0.01)
    time.sleep(0.1)
    # One try, then the thread ended: no retries against a dead service.
    self.assertEqual(service.key_value_set.call_count, 1)

  def test_no_client_starts_nothing(self):
    with mock.patch.object(collectives, "_coordination_client", return_value=None):
      self.assertTrue(collectives.start_heartbeat().is_set())

  def test_bad_interval(self):
    with self.assertRaisesRegex(ValueError, "interval_s must be > 0, got 0"):
      collectives.start_heartbeat(FakeService(), interval_s=0)


if __name__ == "__main__":
  absltest.main()
