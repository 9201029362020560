"""Tests for launch/tpu_pod.sh and launch/multihost_local.sh.

`tpu_pod.sh` runs against a stand-in `gcloud` that records its arguments, so
the sequence of slice, copy, setup and run commands is checked without a
cloud account. `multihost_local.sh` runs a small stand-in module as its
processes, checking the environment each gets, failure propagation and the
timeout.
"""

import os
import pathlib
import shlex
import stat
import subprocess
import sys
import textwrap
import time

from absl.testing import absltest

ROOT = pathlib.Path(__file__).resolve().parent.parent
TPU_POD = ROOT / "launch" / "tpu_pod.sh"
LOCAL = ROOT / "launch" / "multihost_local.sh"

_FAKE_GCLOUD = """#!/usr/bin/env bash
printf '%s\\n' "$*" >> "$GCLOUD_LOG"
if [[ "$4" == describe ]]; then exit "${DESCRIBE_RC:-1}"; fi
if [[ "$4" == ssh && "$*" == *launch.train* ]]; then exit "${RUN_RC:-0}"; fi
exit 0
"""


class TpuPodTest(absltest.TestCase):

  def _run(self, args, describe_rc=1, run_rc=0):
    tmp = self.create_tempdir()
    gcloud = pathlib.Path(tmp.full_path) / "gcloud"
    gcloud.write_text(_FAKE_GCLOUD)
    gcloud.chmod(gcloud.stat().st_mode | stat.S_IEXEC)
    log = pathlib.Path(tmp.full_path) / "calls.log"
    env = dict(os.environ, GCLOUD=str(gcloud), GCLOUD_LOG=str(log),
               DESCRIBE_RC=str(describe_rc), RUN_RC=str(run_rc))
    proc = subprocess.run(["bash", str(TPU_POD)] + args, env=env, capture_output=True,
                          text=True, timeout=60, check=False)
    calls = log.read_text().splitlines() if log.exists() else []
    return proc, calls

  def test_creates_copies_sets_up_and_runs_on_all_workers(self):
    proc, calls = self._run(["--name=pod", "--zone=us-east5-a", "--project=p1", "--",
                             "--config=experiments/tiny_codegen.py", "--workdir=gs://b/r 1"])
    self.assertEqual(proc.returncode, 0, proc.stderr)
    verbs = [c.split()[3] for c in calls]
    self.assertEqual(verbs, ["describe", "create", "scp", "ssh", "ssh", "ssh"])
    self.assertIn("--accelerator-type=v5p-64", calls[1])
    self.assertIn("--version=v2-alpha-tpuv5", calls[1])
    self.assertIn("--project=p1", calls[1])
    for call in calls[2:]:
      self.assertIn("--worker=all", call)
    self.assertIn("tar -xzf code.tar.gz", calls[3])
    self.assertIn("jax[tpu]", calls[4])
    run = calls[5]
    self.assertIn("AGENTIC_GRPO_DISTRIBUTED=1", run)
    self.assertIn("-m launch.train --config=experiments/tiny_codegen.py", run)
    # The argument with a space survives the remote shell as one argument.
    remote = run.split("--command=", 1)[1]
    self.assertIn("--workdir=gs://b/r 1", shlex.split(remote))

  def test_reuses_existing_slice_and_can_delete(self):
    proc, calls = self._run(["--name=pod", "--zone=z", "--skip-setup", "--delete", "--",
                             "--workdir=gs://b/r"], describe_rc=0, run_rc=3)
    verbs = [c.split()[3] for c in calls]
    self.assertEqual(verbs, ["describe", "ssh", "delete"])
    self.assertEqual(proc.returncode, 3)  # the run's status, after deleting

  def test_clone_instead_of_copy(self):
    proc, calls = self._run(["--name=pod", "--zone=z", "--repo=https://example.com/r.git",
                             "--ref=v1"], describe_rc=0)
    self.assertEqual(proc.returncode, 0, proc.stderr)
    self.assertNotIn("scp", [c.split()[3] for c in calls])
    self.assertIn("git clone -q https://example.com/r.git agentic_grpo", calls[1])
    self.assertIn("checkout -q v1", calls[1])

  def test_requires_name_and_zone(self):
    proc, calls = self._run(["--zone=z"])
    self.assertEqual(proc.returncode, 2)
    self.assertIn("--name and --zone are required", proc.stderr)
    self.assertEmpty(calls)
    proc, _ = self._run(["--name=a", "--zone=z", "--bogus"])
    self.assertEqual(proc.returncode, 2)


# Stand-in for launch/train.py: reports its environment, then behaves as asked.
_PROBE = textwrap.dedent("""\
    import os, sys, time
    pid = int(os.environ["JAX_PROCESS_ID"])
    print("probe", pid, os.environ["JAX_NUM_PROCESSES"], os.environ["JAX_COORDINATOR_ADDRESS"],
          os.environ["AGENTIC_GRPO_DISTRIBUTED"], os.environ["XLA_FLAGS"], " ".join(sys.argv[1:]),
          flush=True)
    mode = sys.argv[1]
    if mode == "fail" and pid == 1:
      sys.exit(7)
    if mode in ("fail", "hang"):
      time.sleep(120)
""")


class MultihostLocalTest(absltest.TestCase):

  def _run(self, options, mode, timeout=60):
    tmp = pathlib.Path(self.create_tempdir().full_path)
    (tmp / "probe_mod.py").write_text(_PROBE)
    logs = tmp / "logs"
    env = dict(os.environ, PYTHON=sys.executable, TRAIN_MODULE="probe_mod",
               PYTHONPATH=str(tmp))
    env.pop("XLA_FLAGS", None)
    start = time.monotonic()
    proc = subprocess.run(["bash", str(LOCAL), "-l", str(logs)] + options + ["--", mode, "x y"],
                          env=env, capture_output=True, text=True, timeout=timeout,
                          check=False, cwd=tmp)
    return proc, logs, time.monotonic() - start

  def test_processes_get_their_rank_and_devices(self):
    proc, logs, _ = self._run(["-n", "3", "-d", "2", "-p", "4321"], "ok")
    self.assertEqual(proc.returncode, 0, proc.stderr)
    for i in range(3):
      words = (logs / f"process_{i}.log").read_text().split()
      self.assertEqual(words[:5], ["probe", str(i), "3", "127.0.0.1:4321", "1"])
      self.assertEqual(words[5], "--xla_force_host_platform_device_count=2")
      self.assertEqual(words[-3:], ["ok", "x", "y"])

  def test_one_failure_stops_the_others(self):
    proc, logs, elapsed = self._run(["-n", "2"], "fail")
    self.assertEqual(proc.returncode, 7)
    self.assertLess(elapsed, 30)  # process 0 (sleeping 120 s) was stopped
    self.assertIn("stopping the others", proc.stderr)
    self.assertTrue((logs / "process_0.log").exists())

  def test_timeout_kills_everything(self):
    proc, _, elapsed = self._run(["-n", "2", "-t", "2"], "hang")
    self.assertEqual(proc.returncode, 124)
    self.assertLess(elapsed, 30)

  def test_bad_option_values(self):
    proc, _, _ = self._run(["-n", "two"], "ok")
    self.assertEqual(proc.returncode, 2)
    self.assertIn("-n must be", proc.stderr)


if __name__ == "__main__":
  absltest.main()
