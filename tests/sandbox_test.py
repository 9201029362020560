"""Tests for agentic_grpo.sandbox: verdicts, isolation and the pool.

The adversarial programs run once per isolation mode, concurrently through a
pool, in `setUpClass`; each test method then checks one case's verdict, its
time and its side effects. Every class also checks that no sandbox process
is left: none with the pool's tag on its command line other than the servers,
and none with one of this process's sandbox uids.
"""

import os
import pathlib
import shutil
import signal
import socket
import subprocess
import tempfile
import time

from absl.testing import absltest
from absl.testing import parameterized

from agentic_grpo import sandbox as sb
from agentic_grpo.sandbox import isolation
from agentic_grpo.tasks import literals

# Tight limits keep the adversarial suite fast; memory is the issue's 512 MiB.
_LIMITS = sb.Limits(cpu_seconds=1.0, wall_seconds=2.0, memory_bytes=512 * 2**20,
                    file_size_bytes=2**20, max_processes=8, output_bytes=64 * 2**10)
# A verdict must arrive within the wall limit plus this (kill, reap, report).
_SLACK_SECONDS = 2.5
_FULL = sb.Isolation()
# Without namespaces: Landlock where the kernel has it, and the audit hook alone.
_FALLBACK = sb.Isolation(namespaces=False, drop_privileges=False)
_HOOK_ONLY = sb.Isolation(namespaces=False, landlock=False, drop_privileges=False)


def _proc_entries():
  for name in os.listdir("/proc"):
    if name.isdigit():
      yield int(name)


def _tagged_pids(tag: str) -> set[int]:
  """Processes whose command line mentions `tag` (all sandbox processes do)."""
  found = set()
  for pid in _proc_entries():
    try:
      with open(f"/proc/{pid}/cmdline", "rb") as f:
        if tag.encode() in f.read():
          found.add(pid)
    except OSError:
      pass
  return found


def _sandbox_uid_pids() -> set[int]:
  """Processes running under one of this process's sandbox uids."""
  lo = isolation.slot_uid(0)
  hi = lo + isolation.MAX_SLOTS
  found = set()
  for pid in _proc_entries():
    try:
      with open(f"/proc/{pid}/status") as f:
        for line in f:
          if line.startswith("Uid:"):
            uids = [int(x) for x in line.split()[1:]]
            if any(lo <= u < hi for u in uids):
              found.add(pid)
            break
    except (OSError, ValueError):
      pass
  return found


def _io(source, *tests, entry="f"):
  return sb.Program(source, entry, io_tests=tuple(sb.IOTest(a, e) for a, e in tests))


class _PoolCase(parameterized.TestCase):
  """Shares one pool per class and audits it for leftover processes."""

  ISOLATION = _FULL
  WORKERS = 2

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.pool = sb.SandboxPool(cls.WORKERS, _LIMITS, isolation=cls.ISOLATION)
    cls.pool.start()
    cls.servers = _tagged_pids(cls.pool.tag)

  @classmethod
  def tearDownClass(cls):
    tag = cls.pool.tag
    cls.pool.close()
    deadline = time.monotonic() + 5
    while _tagged_pids(tag) and time.monotonic() < deadline:
      time.sleep(0.05)
    left = _tagged_pids(tag)
    super().tearDownClass()
    if left:
      raise AssertionError(f"processes left after close(): {sorted(left)}")

  def assert_no_leftovers(self):
    self.assertEqual(_tagged_pids(self.pool.tag), self.servers)
    self.assertEmpty(_sandbox_uid_pids())


class ValuesTest(parameterized.TestCase):

  def test_iotest_rejects_non_literals(self):
    class Int(int):
      pass

    with self.assertRaisesRegex(ValueError, "IOTest.args must be a tuple"):
      sb.IOTest("ab", 1)
    with self.assertRaisesRegex(ValueError, "IOTest.expected.*Int"):
      sb.IOTest((1,), Int(3))
    with self.assertRaisesRegex(ValueError, "IOTest.args.*object"):
      sb.IOTest((object(),), 1)
    self.assertEqual(sb.IOTest([1, 2], 3).args, (1, 2))

  def test_program_and_limits_validation(self):
    with self.assertRaisesRegex(ValueError, "entry_point.*'not an id'"):
      sb.Program("x = 1", "not an id")
    with self.assertRaisesRegex(ValueError, r"io_tests\[0\]"):
      sb.Program("x = 1", "f", io_tests=[((1,), 1)])
    with self.assertRaisesRegex(ValueError, "check_function"):
      sb.Program("x = 1", "f", script_test="pass", check_function="1x")
    with self.assertRaisesRegex(ValueError, "Limits.wall_seconds.*-1"):
      sb.Limits(wall_seconds=-1)
    with self.assertRaisesRegex(ValueError, "Limits.max_processes"):
      sb.Limits(max_processes=0)
    with self.assertRaisesRegex(ValueError, "Limits.memory_bytes"):
      sb.Limits(memory_bytes=2**20)
    with self.assertRaisesRegex(ValueError, "max_workers.*0"):
      sb.SandboxPool(0)
    with self.assertRaisesRegex(ValueError, "tag"):
      sb.SandboxPool(1, tag="a b")


class BasicsTest(_PoolCase):

  def test_io_tests_outputs_and_errors(self):
    source = ("def f(a, b):\n"
              "  if a == 0:\n"
              "    raise ValueError('zero')\n"
              "  return a + b\n")
    program = _io(source, ((1, 2), 3), ((1.5, 2), 3.5), (("a", "b"), "ab"), ((1, 2), 4),
                  ((0, 1), 1), (([1], [2]), [1, 2]), (((1,), (2,)), [1, 2]))
    r = self.pool.submit(program).result()
    self.assertEqual(r.verdict, sb.Verdict.FAILED)
    self.assertEqual(r.passed, (True, True, True, False, False, True, False))
    self.assertEqual(r.outputs, (3, 3.5, "ab", 3, None, [1, 2], (1, 2)))
    self.assertEqual((r.num_passed, r.num_tests), (4, 7))
    self.assertEqual(r.test_errors[4], "ValueError: zero")
    self.assertEqual(r.error, "ValueError: zero")
    self.assertLess(r.wall_seconds, _LIMITS.wall_seconds)

  def test_values_round_trip_type_exact(self):
    values = [None, True, -7, 2**100, 1.5, float("inf"), 1 - 2j, "h\u00e9\n\"'\\",
              b"\x00\xff", [1, [2]], (1, (2.0,)), {1, "a"}, frozenset({(1, 2)}),
              {(1, 2): {"k": [None]}, 3: "x", True: 0}, "\ud800"]
    program = _io("def f(x):\n  return x\n", *[((v,), v) for v in values])
    r = self.pool.submit(program).result()
    self.assertEqual(r.verdict, sb.Verdict.PASSED, r)
    for got, want in zip(r.outputs, values, strict=True):
      self.assertIs(type(got), type(want))
      self.assertTrue(literals.values_equal(got, want))
    nan = self.pool.submit(_io("def f():\n  return float('nan')\n", ((), float("nan")))).result()
    self.assertEqual(nan.verdict, sb.Verdict.PASSED)

  def test_expected_type_is_strict(self):
    r = self.pool.submit(_io("def f(x):\n  return x > 0\n", ((1,), 1), ((1,), True))).result()
    self.assertEqual(r.passed, (False, True))
    self.assertEqual(r.verdict, sb.Verdict.FAILED)

  def test_script_tests(self):
    good = sb.Program("def inc(x):\n  return x + 1\n", "inc",
                      script_test="def check(candidate):\n  assert candidate(1) == 2\n")
    bad = sb.Program("def inc(x):\n  return x\n", "inc",
                     script_test="def check(candidate):\n  assert candidate(1) == 2\n")
    asserts = sb.Program("def inc(x):\n  return x + 1\n", "inc",
                         script_test="assert inc(1) == 2\nassert inc(5) == 6\n",
                         check_function=None)
    asserts_bad = sb.Program("def inc(x):\n  return x + 1\n", "inc",
                             script_test="assert inc(1) == 2\nassert inc(5) == 7\n",
                             check_function=None)
    no_check = sb.Program("def inc(x):\n  return x + 1\ndef check(c):\n  pass\n", "inc",
                          script_test="x = 1\n")
    both = sb.Program("def inc(x):\n  return x + 1\n", "inc",
                      io_tests=(sb.IOTest((1,), 2),),
                      script_test="def check(c):\n  assert c(2) == 3\n")
    r = self.pool.map([good, bad, asserts, asserts_bad, no_check, both])
    self.assertEqual([x.verdict for x in r],
                     [sb.Verdict.PASSED, sb.Verdict.FAILED, sb.Verdict.PASSED,
                      sb.Verdict.FAILED, sb.Verdict.FAILED, sb.Verdict.PASSED])
    self.assertEqual([x.script_passed for x in r], [True, False, True, False, False, True])
    self.assertEqual([(x.num_passed, x.num_tests) for x in r],
                     [(1, 1), (0, 1), (1, 1), (0, 1), (0, 1), (2, 2)])
    self.assertIn("AssertionError", r[1].error)
    # The program's own check() is removed before the test code runs.
    self.assertIn("does not define check()", r[4].error)

  def test_module_level_failures(self):
    r = self.pool.map([
        sb.Program("def f(:\n  pass\n", "f"),
        sb.Program("raise RuntimeError('boom')\n", "f"),
        sb.Program("g = 1\n", "f"),
        sb.Program("f = 3\n", "f"),
        sb.Program("def f():\n  return 1\n", "f"),
        sb.Program("x = '\x00'\n\x00", "f"),
    ])
    self.assertEqual([x.verdict for x in r],
                     [sb.Verdict.SYNTAX_ERROR, sb.Verdict.ERROR, sb.Verdict.ERROR,
                      sb.Verdict.ERROR, sb.Verdict.PASSED, sb.Verdict.SYNTAX_ERROR])
    self.assertIn("SyntaxError", r[0].error)
    self.assertIn("RuntimeError: boom", r[1].error)
    self.assertIn("'f' is not defined", r[2].error)
    self.assertEqual(r[4].num_tests, 0)

  def test_output_tail_and_environment(self):
    source = ("import os, sys\n"
              "print('hello')\n"
              "def f():\n"
              "  print('x' * 10000)\n"
              "  print('bye')\n"
              "  return [sorted(os.environ), os.getcwd() == os.environ['HOME'],\n"
              "          sorted(os.listdir('.'))]\n")
    r = self.pool.submit(_io(source, ((), None))).result()
    self.assertTrue(r.output_tail.endswith("x\nbye\n"), r.output_tail[-50:])
    self.assertLen(r.output_tail, 4096)
    self.assertNotIn("hello", r.output_tail)
    env_keys, cwd_is_home, listing = r.outputs[0]
    self.assertEqual(env_keys, sorted(set(isolation.ENV) | {"HOME", "TMPDIR"}))
    self.assertTrue(cwd_is_home)
    self.assertEqual(listing, [])  # Fresh working directory: the job file is gone.

  def test_workdirs_are_fresh_and_hash_seed_fixed(self):
    source = ("import os\n"
              "def f():\n"
              "  before = sorted(os.listdir('.'))\n"
              "  open('mark', 'w').write('1')\n"
              "  return [before, hash('abc')]\n")
    r = self.pool.map([_io(source, ((), None))] * 4)
    self.assertEqual([x.outputs[0][0] for x in r], [[]] * 4)
    self.assertLen({x.outputs[0][1] for x in r}, 1)

  def test_stdlib_modules_that_use_frames_work(self):
    source = ("from typing import List, NamedTuple, TypeVar\n"
              "import collections, enum, fnmatch, re\n"
              "T = TypeVar('T')\n"
              "P = collections.namedtuple('P', 'a b')\n"
              "class Q(NamedTuple):\n"
              "  a: int\n"
              "Color = enum.Enum('Color', 'RED GREEN')\n"
              "def f(xs: List[int]) -> int:\n"
              "  return P(1, 2).b + Q(3).a + Color.GREEN.value + len(re.findall('a', 'aa'))"
              " + fnmatch.fnmatch('x.py', '*.py')\n")
    r = self.pool.submit(_io(source, (([1],), 10))).result()
    self.assertEqual(r.verdict, sb.Verdict.PASSED, r)

  def test_result_too_large_fails_the_test(self):
    limits = sb.Limits(result_bytes=10000)
    r = self.pool.submit(_io("def f(n):\n  return 'x' * n\n", ((10,), "x" * 10),
                             ((100000,), "x" * 100000)), limits).result()
    self.assertEqual(r.passed, (True, False))
    self.assertIn("too large", r.test_errors[1])
    self.assert_no_leftovers()

  def test_run_program(self):
    r = sb.run_program(_io("def f(x):\n  return x * 2\n", ((4,), 8)))
    self.assertEqual(r.verdict, sb.Verdict.PASSED)
    self.assertEqual(r.outputs, (8,))

  def test_isolation_info(self):
    info = self.pool.isolation_info
    self.assertEqual(set(info), {"level", "namespaces", "user_namespace", "drop_privileges",
                                 "fork_allowed", "audit_hook"})
    self.assertIn(info["level"], sb.ISOLATION_LEVELS)
    if os.geteuid() == 0:
      self.assertTrue(info["drop_privileges"])
      self.assertTrue(info["fork_allowed"])


# Created in setUpClass (0700 and 0755 directories of this test process).
_SECRET_DIR = os.path.join(tempfile.gettempdir(), f"sandbox-test-secret-{os.getpid()}")
_SECRET = os.path.join(_SECRET_DIR, "secret.txt")
_VICTIM_DIR = os.path.join(tempfile.gettempdir(), f"sandbox-test-victim-{os.getpid()}")
_VICTIM = os.path.join(_VICTIM_DIR, "victim.txt")
_SECRET_TEXT = "top secret\n"


def _adversarial_cases(listen_port):
  """name -> (program, limits or None, verdicts accepted in full, in fallback)."""
  T, E, F, P = sb.Verdict.TIMEOUT, sb.Verdict.ERROR, sb.Verdict.FAILED, sb.Verdict.PASSED
  io = lambda src, expected=1: _io(src, ((1,), expected))  # pylint: disable=unnecessary-lambda-assignment
  forge_script = sb.Program(
      "import os, sys\n"
      "def f(x):\n  return x\n"
      "print('D'); os.write(3, b'0' * 32 + b' C\\n' + b'0' * 32 + b' D\\n')\n"
      "os._exit(0)\n",
      "f", script_test="def check(c):\n  assert c(1) == 2\n")
  return {
      "infinite_loop": (io("def f(x):\n  while True:\n    pass\n"), None, {T}, {T}),
      "sleep_forever": (io("import time\ndef f(x):\n  while True:\n    time.sleep(0.05)\n"),
                        None, {T}, {T}),
      "cpu_limit": (io("def f(x):\n  while True:\n    pass\n"),
                    sb.Limits(cpu_seconds=1, wall_seconds=8), {T}, {T}),
      "cpu_limit_ignoring_sigxcpu": (
          io("import signal\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)\n"
             "def f(x):\n  while True:\n    pass\n"),
          sb.Limits(cpu_seconds=1, wall_seconds=8), {T}, {T}),
      "busy_forked_child_waited": (
          io("import os\n"
             "def f(x):\n"
             "  pid = os.fork()\n"
             "  if pid == 0:\n"
             "    while True:\n"
             "      pass\n"
             "  os.waitpid(pid, 0)\n"
             "  return x\n"),
          sb.Limits(cpu_seconds=5, wall_seconds=2.0), {T}, {F}),
      "busy_forked_child_detached": (
          io("import os\n"
             "def f(x):\n"
             "  if os.fork() == 0:\n"
             "    os.setsid()\n"
             "    if os.fork() == 0:\n"
             "      while True:\n"
             "        pass\n"
             "    os._exit(0)\n"
             "  return x\n"),
          None, {P}, {F}),
      "fork_bomb": (
          io("import os\n"
             "def f(x):\n"
             "  while True:\n"
             "    try:\n"
             "      os.fork()\n"
             "    except OSError:\n"
             "      pass\n"),
          None, {T}, {T}),
      "count_forks": (
          _io("import os, time\n"
             "def f(n):\n"
             "  ok = 0\n"
             "  for _ in range(n):\n"
             "    try:\n"
             "      pid = os.fork()\n"
             "    except OSError:\n"
             "      continue\n"
             "    if pid == 0:\n"
             "      time.sleep(30)\n"
             "      os._exit(0)\n"
             "    ok += 1\n"
             "  return ok\n", ((40,), -1)), None, {F}, {F}),
      "allocate_8gib": (io("def f(x):\n  b = bytearray(8 * 2**30)\n  return x\n"), None,
                        {sb.Verdict.MEMORY_LIMIT}, {sb.Verdict.MEMORY_LIMIT}),
      "print_forever": (io("def f(x):\n  while True:\n    print('spam' * 100)\n"), None,
                        {sb.Verdict.OUTPUT_LIMIT}, {sb.Verdict.OUTPUT_LIMIT}),
      "huge_file": (io("def f(x):\n  with open('big', 'wb') as fh:\n    while True:\n"
                       "      fh.write(b'0' * 65536)\n"), None,
                    {sb.Verdict.OUTPUT_LIMIT}, {sb.Verdict.OUTPUT_LIMIT}),
      "sys_exit_before_tests": (io("import sys\nsys.exit(0)\ndef f(x):\n  return x\n"), None,
                                {E}, {E}),
      "os_exit_before_tests": (io("import os\nos._exit(0)\ndef f(x):\n  return x\n"), None,
                               {E}, {E}),
      "os_exit_in_test": (io("import os\ndef f(x):\n  os._exit(0)\n"), None, {E}, {E}),
      "raise_system_exit": (io("raise SystemExit\ndef f(x):\n  return x\n"), None, {E}, {E}),
      "raise_system_exit_in_test": (io("def f(x):\n  raise SystemExit(0)\n"), None, {F}, {F}),
      "keyboard_interrupt_in_test": (io("def f(x):\n  raise KeyboardInterrupt\n"), None,
                                     {F}, {F}),
      "syntax_error": (io("def f(x)\n  return x\n"), None,
                       {sb.Verdict.SYNTAX_ERROR}, {sb.Verdict.SYNTAX_ERROR}),
      "rigged_eq": (io("class A:\n  def __eq__(self, o):\n    return True\n"
                       "  __hash__ = object.__hash__\n"
                       "def f(x):\n  return A()\n"), None, {F}, {F}),
      "rigged_int_subclass": (io("class I(int):\n  def __eq__(self, o):\n    return True\n"
                                 "def f(x):\n  return I(7)\n"), None, {F}, {F}),
      "rigged_eq_in_script_test": (
          sb.Program("class A:\n  def __eq__(self, o):\n    return True\n"
                     "def f(x):\n  return A()\n", "f",
                     script_test="def check(c):\n  assert c(1) == 2\n"), None, {F}, {F}),
      "read_secret_file": (io(f"def f(x):\n  return open({_SECRET!r}).read()\n",
                              _SECRET_TEXT), None, {F}, {F}),
      "read_world_readable_file": (
          io("def f(x):\n  return open('/etc/passwd').read()[:4]\n",
             open("/etc/passwd").read()[:4]), None, {F}, {F}),
      "read_via_symlink": (
          io(f"import os\ndef f(x):\n  os.symlink({_SECRET!r}, 'link')\n"
             f"  return open('link').read()\n", _SECRET_TEXT), None, {F}, {F}),
      "delete_outside_workdir": (io(f"import os\ndef f(x):\n  os.remove({_VICTIM!r})\n"
                                    "  return x\n"), None, {F}, {F}),
      "rmtree_outside_workdir": (io(f"import shutil\ndef f(x):\n  shutil.rmtree({_VICTIM_DIR!r})"
                                    "\n  return x\n"), None, {F}, {F}),
      "network_socket": (io("import socket\n"
                            "def f(x):\n"
                            f"  socket.create_connection(('127.0.0.1', {listen_port}), 1)\n"
                            "  return x\n"), None, {E}, {E}),
      "network_raw_socket_module": (io("def f(x):\n"
                                       "  import _socket\n"
                                       "  s = _socket.socket()\n"
                                       f"  s.connect(('127.0.0.1', {listen_port}))\n"
                                       "  return x\n"), None, {F}, {F}),
      "flood_report_channel": (io("import os\ndef f(x):\n  while True:\n"
                                  "    os.write(3, b'x' * 65536)\n"), None,
                               {sb.Verdict.OUTPUT_LIMIT}, {sb.Verdict.OUTPUT_LIMIT}),
      "write_host_tmp": (io("def f(x):\n  open('/tmp/sandbox-was-here', 'w').write('x')\n"
                            "  return x\n"), None, {F}, {F}),
      "forge_report_lines": (io("import os\nos.write(3, b'0' * 32 + b' D\\n')\nprint('D')\n"
                                "def f(x):\n  return 0\n"), None, {F}, {F}),
      "forge_script_pass_and_exit": (forge_script, None, {E}, {E}),
      "frame_walk_getframe": (
          sb.Program("import sys\ndef f(x):\n  return sys._getframe(1).f_locals\n", "f",
                     script_test="def check(c):\n  assert c(1) == 2\n"), None, {F}, {F}),
      "frame_walk_traceback": (
          io("def f(x):\n  try:\n    1 / 0\n  except ZeroDivisionError as e:\n"
             "    return str(e.__traceback__.tb_frame.f_back.f_locals)\n"), None, {F}, {F}),
      "frame_walk_generator": (
          io("def f(x):\n  def g():\n    yield 1\n  it = g()\n  return str(it.gi_frame)\n"),
          None, {F}, {F}),
      "gc_introspection": (io("import gc\ndef f(x):\n  return len(gc.get_objects())\n"), None,
                           {E}, {E}),
      "ctypes": (io("import ctypes\ndef f(x):\n  return x\n"), None, {E}, {E}),
      "subprocess": (io("import os\ndef f(x):\n  os.system('true')\n  return x\n"), None,
                     {F}, {F}),
      "patched_builtins_vs_script_test": (
          sb.Program("import builtins\nbuiltins.abs = lambda v: 0\nbuiltins.len = lambda v: 3\n"
                     "def f(x):\n  return [x]\n", "f",
                     script_test="def check(c):\n  assert abs(c(1)[0] - 5) < 1e-6\n"
                                 "  assert len(c(1)) == 3\n"), None, {F}, {F}),
      "fork_to_guess_twice": (
          sb.Program("import os\ndef f(x):\n  if os.fork() == 0:\n    return x + 1\n"
                     "  os.wait()\n  return x\n", "f",
                     script_test="def check(c):\n  assert c(1) == 2\n"), None, {F}, {F}),
      "signal_parent": (io("import os, signal\ndef f(x):\n  os.kill(os.getppid(), signal.SIGKILL)"
                           "\n  return x\n"), None, {F}, {F}),
      "crash_segfault": (io("import os, signal\ndef f(x):\n  os.kill(os.getpid(), "
                            "signal.SIGSEGV)\n  return x\n"), None, {E}, {E}),
  }


class _AdversarialBase(_PoolCase):
  """Runs every adversarial case at once in setUpClass; one test per case."""

  WORKERS = 4

  @classmethod
  def setUpClass(cls):
    os.makedirs(_SECRET_DIR, mode=0o700, exist_ok=True)
    os.makedirs(_VICTIM_DIR, exist_ok=True)
    pathlib.Path(_SECRET).write_text(_SECRET_TEXT)
    os.chmod(_SECRET, 0o600)
    pathlib.Path(_VICTIM).write_text("victim\n")
    os.chmod(_VICTIM_DIR, 0o755)
    cls.listener = socket.create_server(("127.0.0.1", 0))
    cls.listener.setblocking(False)
    super().setUpClass()
    cls.cases = _adversarial_cases(cls.listener.getsockname()[1])
    futures = {name: cls.pool.submit(program, limits)
               for name, (program, limits, _, _) in cls.cases.items()}
    cls.results = {name: f.result() for name, f in futures.items()}

  @classmethod
  def tearDownClass(cls):
    cls.listener.close()
    shutil.rmtree(_SECRET_DIR, ignore_errors=True)
    shutil.rmtree(_VICTIM_DIR, ignore_errors=True)
    super().tearDownClass()

  @parameterized.named_parameters((name, name) for name in _adversarial_cases(0))
  def test_case(self, name):
    _, limits, full, fallback = self.cases[name]
    result = self.results[name]
    accepted = full if self.ISOLATION == _FULL else fallback
    self.assertIn(result.verdict, accepted, f"{name}: {result}")
    wall = (limits or _LIMITS).wall_seconds
    self.assertLess(result.wall_seconds, wall + _SLACK_SECONDS, name)

  def test_no_process_left_behind(self):
    self.assert_no_leftovers()

  def test_side_effects_blocked(self):
    self.assertEqual(pathlib.Path(_SECRET).read_text(), _SECRET_TEXT)
    self.assertTrue(os.path.exists(_VICTIM))
    self.assertFalse(os.path.exists("/tmp/sandbox-was-here"))
    with self.assertRaises(BlockingIOError):
      self.listener.accept()
    self.assertIsNone(self.results["read_secret_file"].outputs[0])
    self.assertIn("PermissionError", self.results["read_world_readable_file"].error)
    self.assertIn("PermissionError", self.results["network_socket"].error)
    self.assertIn("not a plain literal", self.results["rigged_eq"].error)
    self.assertIn("sandbox", self.results["frame_walk_getframe"].error)
    self.assertFalse(self.results["forge_script_pass_and_exit"].script_passed)

  def test_process_count_is_capped(self):
    r = self.results["count_forks"]
    if self.pool.isolation_info["fork_allowed"]:
      # The job itself plus its children fill RLIMIT_NPROC exactly.
      self.assertEqual(r.outputs, (_LIMITS.max_processes - 1,))
    else:  # fork() raises PermissionError, which the program catches.
      self.assertEqual(r.outputs, (0,))

  def test_cpu_limit_is_told_from_wall_limit(self):
    self.assertEqual(self.results["sleep_forever"].error, "wall-clock limit of 2s exceeded")
    self.assertEqual(self.results["cpu_limit"].error, "CPU limit of 1s exceeded")
    self.assertEqual(self.results["cpu_limit_ignoring_sigxcpu"].error, "CPU limit of 1s exceeded")

  def test_fork_and_memory_details(self):
    r = self.results["allocate_8gib"]
    self.assertIn("MemoryError", r.error)
    self.assertEqual(self.results["huge_file"].error,
                     f"file size limit of {_LIMITS.file_size_bytes} bytes exceeded")
    self.assertIn("killed by signal 11", self.results["crash_segfault"].error)


class AdversarialFullIsolationTest(_AdversarialBase):
  ISOLATION = _FULL


class AdversarialFallbackTest(_AdversarialBase):
  """No namespaces, no uid change: Landlock (where available), the audit hook and rlimits."""
  ISOLATION = _FALLBACK


class AdversarialHookOnlyTest(_AdversarialBase):
  """No namespaces, no Landlock, no uid change: the audit hook and rlimits alone."""
  ISOLATION = _HOOK_ONLY


class ManyProgramsTest(_PoolCase):
  """64 programs where one hangs and one crashes: the other 62 are unaffected."""

  WORKERS = 4

  def test_hang_and_crash_do_not_affect_others(self):
    programs, expected = [], []
    for i in range(64):
      tests = ((i,), i * i), ((i + 1,), (i + 1) ** 2 if i % 3 else -1)
      expected.append((tests[0][1], tests[1][0][0] ** 2, bool(i % 3)))
      programs.append(_io(f"def f(x):\n  print({i})\n  return x * x\n", *tests))
    programs[17] = _io("def f(x):\n  while True:\n    pass\n", ((1,), 1))
    programs[40] = _io("import os\ndef f(x):\n  os.abort()\n", ((1,), 1))
    start = time.monotonic()
    results = self.pool.map(programs)
    self.assertLess(time.monotonic() - start, 30)
    self.assertEqual(results[17].verdict, sb.Verdict.TIMEOUT)
    self.assertEqual(results[40].verdict, sb.Verdict.ERROR)
    self.assertIn("signal 6", results[40].error)
    for i, (r, (out0, out1, second_ok)) in enumerate(zip(results, expected, strict=True)):
      if i in (17, 40):
        continue
      self.assertEqual(r.verdict, sb.Verdict.PASSED if second_ok else sb.Verdict.FAILED, i)
      self.assertEqual(r.outputs, (out0, out1), i)
      self.assertEqual(r.passed, (True, second_ok), i)
      self.assertEqual(r.output_tail, f"{i}\n{i}\n", i)
    self.assert_no_leftovers()


class LifecycleTest(parameterized.TestCase):

  def test_close_stops_everything_and_rejects_submissions(self):
    pool = sb.SandboxPool(2, _LIMITS)
    pool.start()
    self.assertNotEmpty(_tagged_pids(pool.tag))
    fut = pool.submit(_io("import time\ndef f(x):\n  time.sleep(0.3)\n  return x\n",
                          ((1,), 1)))
    pool.close()  # Waits for submitted work.
    self.assertEqual(fut.result().verdict, sb.Verdict.PASSED)
    self.assertEmpty(_tagged_pids(pool.tag))
    with self.assertRaisesRegex(RuntimeError, "closed"):
      pool.submit(_io("def f(x):\n  return x\n", ((1,), 1)))
    pool.close()  # Idempotent.

  def test_server_death_becomes_error_result_and_pool_recovers(self):
    with sb.SandboxPool(1, _LIMITS) as pool:
      pool.start()
      servers = _tagged_pids(pool.tag)
      fut = pool.submit(_io("import time\ndef f(x):\n  time.sleep(1.5)\n  return x\n",
                            ((1,), 1)))
      time.sleep(0.5)
      for pid in servers:
        try:
          os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
          pass
      r = fut.result(timeout=20)
      self.assertEqual(r.verdict, sb.Verdict.ERROR)
      self.assertIn("sandbox", r.error)
      # Recovery: the pool restarts the server, whose job numbers start again; the dead
      # server's job directory must not get in the way.
      r2 = pool.submit(_io("def f(x):\n  return x + 1\n", ((1,), 2))).result(timeout=60)
      self.assertEqual(r2.verdict, sb.Verdict.PASSED, r2.error)
    self.assertEmpty(_tagged_pids(pool.tag))
    self.assertEmpty(_sandbox_uid_pids())

  def test_network_namespace_has_no_route_to_host_loopback(self):
    plan = isolation.plan_for(sb.Isolation())
    with socket.create_server(("127.0.0.1", 0)) as listener, \
        tempfile.TemporaryDirectory() as new_root:
      port = listener.getsockname()[1]
      code = f"import socket; socket.create_connection(('127.0.0.1', {port}), 2)"
      cmd = [plan.python, "-c", code]
      if plan.namespaces:
        cmd = (list(plan.prefix) + [new_root, "1048576", "1048576", isolation.RUNNER_PATH] +
               list(plan.mount_entries) + ["--"] + cmd)
      probe = subprocess.run(cmd, capture_output=True, timeout=30, check=False)
      listener.setblocking(False)
      if plan.namespaces:
        self.assertNotEqual(probe.returncode, 0)
        self.assertRegex(probe.stderr.decode(), "Network is unreachable|Connection refused")
        with self.assertRaises(BlockingIOError):
          listener.accept()
      else:  # Without namespaces the connection succeeds: only the hook blocks it.
        self.assertEqual(probe.returncode, 0)


if __name__ == "__main__":
  absltest.main()
