"""Adversarial programs against every isolation level of agentic_grpo.sandbox.

Each class of escape runs once per level: namespaces (minimal read-only root),
Landlock, and the audit hook alone; and, for the first two, once more without
the audit hook, so that the OS-level confinement is tested by itself. The
programs report what they reached; the tests check that no secret came back,
nothing outside changed and nothing crossed from one job to the next.
"""

import os
import pathlib
import shutil
import tempfile

from absl.testing import absltest
from absl.testing import parameterized

from agentic_grpo import sandbox as sb

_LIMITS = sb.Limits(cpu_seconds=2.0, wall_seconds=5.0)
_LEVELS = (
    ("namespaces", sb.Isolation(namespaces=True)),
    ("namespaces_without_hook", sb.Isolation(namespaces=True, audit_hook=False)),
    ("landlock", sb.Isolation(namespaces=False, landlock=True)),
    ("landlock_without_hook", sb.Isolation(namespaces=False, landlock=True, audit_hook=False)),
    ("hook_only", sb.Isolation(namespaces=False, landlock=False)),
)
_CHECKOUT_FILE = os.path.abspath(__file__)
_SECRET = "hidden-tests-4b1d"
# Reports what the program reached: READ:<text>, WROTE, LIST:<names>, or blocked.
_WALK = '''
import os
def attempt(out, fn):
  try:
    out.append(fn())
  except OSError as e:
    out.append("blocked:" + type(e).__name__)

def f(target, victim):
  out = []
  # Seen from the working directory (what a path hook checks), `up` stays inside it;
  # resolved against a descriptor on the standard library, it climbs to "/".
  deep = "/".join("d%d" % i for i in range(24))
  def links():
    os.makedirs(deep, exist_ok=True)
    os.symlink(deep, "encodings")
    return "linked"
  attempt(out, links)
  up = "encodings/" + "../" * 16
  def stdlib_fd():
    return os.open(os.path.dirname(os.__file__), os.O_RDONLY)
  def read():
    fd = os.open(up + target.lstrip("/"), os.O_RDONLY, dir_fd=stdlib_fd())
    return "READ:" + os.read(fd, 200).decode(errors="replace")
  def write():
    fd = os.open(up + victim.lstrip("/"), os.O_WRONLY | os.O_TRUNC, dir_fd=stdlib_fd())
    os.write(fd, b"pwned")
    return "WROTE"
  def list_root():
    fd = os.open(up, os.O_RDONLY, dir_fd=stdlib_fd())
    return "LIST:" + ",".join(sorted(os.listdir(fd)))
  for fn in (read, write, list_root):
    attempt(out, fn)
  return out
'''
_ABSOLUTE = '''
import os
def f(paths, victim):
  out = []
  for p in paths:
    try:
      out.append("READ:" + open(p).read(200))
    except OSError as e:
      out.append("blocked:" + type(e).__name__)
  try:
    with open(victim, "w") as fh:
      fh.write("pwned")
    out.append("WROTE")
  except OSError as e:
    out.append("blocked:" + type(e).__name__)
  return out
'''
_PLANT = '''
import os
def f(dirs):
  out = []
  for d in dirs:
    try:
      with open(os.path.join(d, "planted-by-job-1"), "w") as fh:
        fh.write("state")
      out.append("planted")
    except OSError as e:
      out.append("blocked:" + type(e).__name__)
  return out
'''
_FIND = '''
import os
def f(dirs):
  out = []
  for d in dirs:
    try:
      out.append(sorted(os.listdir(d)))
    except OSError as e:
      out.append("blocked:" + type(e).__name__)
  return out
'''
_PROC = '''
import os
def f(host_pid):
  out = []
  for p in ("/proc/%d/cmdline" % host_pid, "/proc/%d/environ" % host_pid):
    try:
      out.append("READ:" + open(p, "rb").read(300).decode(errors="replace"))
    except OSError as e:
      out.append("blocked:" + type(e).__name__)
  try:
    out.append(sorted(int(n) for n in os.listdir("/proc") if n.isdigit()))
  except OSError as e:
    out.append("blocked:" + type(e).__name__)
  return out
'''


def _call(source, *args):
  return sb.Program(source, "f", io_tests=(sb.IOTest(args, None),))


class AdversarialIsolationTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    self.outside = tempfile.mkdtemp(prefix="sandbox-adversarial-")
    os.chmod(self.outside, 0o777)
    self.hidden = os.path.join(self.outside, "hidden_tests.txt")
    pathlib.Path(self.hidden).write_text(_SECRET)
    os.chmod(self.hidden, 0o644)
    self.victim = os.path.join(self.outside, "victim.txt")
    pathlib.Path(self.victim).write_text("intact")
    os.chmod(self.victim, 0o666)
    self.addCleanup(shutil.rmtree, self.outside, ignore_errors=True)

  def _run(self, isolation, programs):
    with sb.SandboxPool(1, _LIMITS, isolation=isolation) as pool:
      level = pool.isolation_info["level"]
      results = [pool.submit(p).result() for p in programs]  # One worker, in order.
    for r in results:
      self.assertIn(r.verdict, (sb.Verdict.FAILED, sb.Verdict.PASSED), r)
    return level, [r.outputs[0] for r in results]

  def _assert_nothing_escaped(self, reports):
    text = repr(reports)
    self.assertNotIn(_SECRET, text)
    self.assertNotIn("WROTE", text)
    self.assertNotIn("Tests for", text)  # This file's docstring.
    self.assertEqual(pathlib.Path(self.victim).read_text(), "intact")

  @parameterized.named_parameters(*_LEVELS)
  def test_dir_fd_and_symlink_walk(self, isolation):
    _, (checkout, hidden) = self._run(isolation, [
        _call(_WALK, _CHECKOUT_FILE, self.victim), _call(_WALK, self.hidden, self.victim)])
    self._assert_nothing_escaped([checkout, hidden])
    listing = [x for x in checkout if x.startswith("LIST:")]
    host_root = sorted(os.listdir("/"))
    top = _CHECKOUT_FILE.strip("/").split("/")[0]
    for entry in listing:  # If "/" was reached at all, it is not the host's root.
      seen = entry[5:].split(",")
      self.assertNotEqual(sorted(seen), host_root)
      self.assertIn("jobs", seen)  # the sandbox's own minimal root (job directories' tmpfs)
      if top not in ("tmp", "var", "run", "root", "usr", "etc", "dev", "proc"):
        # The checkout's top folder is not visible, unless the minimal root has one of that
        # name (e.g. a checkout under /tmp: the sandbox's /tmp is its own empty tmpfs).
        self.assertNotIn(top, seen)

  @parameterized.named_parameters(*_LEVELS)
  def test_absolute_paths_outside(self, isolation):
    _, (report,) = self._run(isolation, [
        _call(_ABSOLUTE, [_CHECKOUT_FILE, self.hidden, "/etc/hostname"], self.victim)])
    self._assert_nothing_escaped(report)
    self.assertTrue(all(x.startswith("blocked") for x in report), report)

  @parameterized.named_parameters(*_LEVELS)
  def test_no_state_crosses_jobs_on_one_worker(self, isolation):
    dirs = [".", "..", "/tmp", "/dev/shm", "/var/tmp", "/run", tempfile.gettempdir()]
    _, (planted, found) = self._run(isolation, [_call(_PLANT, dirs), _call(_FIND, dirs)])
    self.assertLen(planted, len(dirs))
    self.assertNotIn("planted-by-job-1", repr(found), (planted, found))

  @parameterized.named_parameters(*_LEVELS)
  def test_proc_shows_no_other_process(self, isolation):
    level, (report,) = self._run(isolation, [_call(_PROC, os.getpid())])
    self.assertTrue(report[0].startswith("blocked") and report[1].startswith("blocked"), report)
    if isinstance(report[2], list):  # Listing allowed only in its own PID namespace.
      self.assertEqual(level, "namespaces")
      self.assertNotIn(os.getpid(), report[2])
      self.assertLessEqual(len(report[2]), 4)  # server, candidate (and its check)

  @parameterized.named_parameters(*_LEVELS)
  def test_check_sees_neither_program_globals_nor_patched_modules(self, isolation):
    check = ("import math\n"
             "def check(candidate):\n"
             "  assert abs(candidate(2.0) - 4.0) < 1e-9\n"
             "  assert set(tuple([1, 1])) == {1}\n"
             "  assert math.isclose(candidate(3.0), 9.0)\n")
    rigged = [
        "abs = lambda v: 0\nset = lambda v: {1}\ndef f(x):\n  return 0.0\n",
        "import builtins\nbuiltins.abs = lambda v: 0\ndef f(x):\n  return 0.0\n",
        "import math\nmath.isclose = lambda *a, **k: True\ndef f(x):\n"
        "  import math\n  math.isclose = lambda *a, **k: True\n  return x * x + (x == 3.0)\n",
        "import sys\ndef f(x):\n  sys.modules['math'].isclose = lambda *a, **k: True\n"
        "  __builtins__['abs'] = lambda v: 0\n  return x * x + (x == 3.0)\n",
    ]
    honest = "abs = lambda v: 0\ndef f(x):\n  return x * x\n"
    with sb.SandboxPool(1, _LIMITS, isolation=isolation) as pool:
      results = pool.map([sb.Program(s, "f", script_test=check) for s in rigged + [honest]])
    for source, r in zip(rigged, results[:-1], strict=True):
      self.assertEqual(r.verdict, sb.Verdict.FAILED, (source, r))
    self.assertEqual(results[-1].verdict, sb.Verdict.PASSED, results[-1])


if __name__ == "__main__":
  absltest.main()
