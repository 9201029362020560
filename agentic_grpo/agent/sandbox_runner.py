"""The in-sandbox half of `agentic_grpo.agent.sandbox`: a fork server.

This file runs as its own interpreter (`python -S -s -B -P sandbox_runner.py
--serve ...`), usually as PID 1 of fresh PID, network, mount, IPC and UTS
namespaces made by util-linux `unshare`. It imports the standard library only
and never the `agentic_grpo` package. `sandbox.py` imports it solely for the
protocol constants and its file path.

Life of the server ("zygote"):

1. Preload a fixed set of standard-library modules (so that untrusted code
   finds them in `sys.modules` after privileges are dropped and so that jobs
   do not pay their import time), then report `READY` on stdout.
2. Read jobs from stdin (`JOB <n>\\n` + `n` bytes of `marshal` data written
   by the trusted parent). For each job: make a fresh working directory, fork
   a child, supervise it (wall deadline, output and report caps), kill every
   process the job left behind, and write one `RESULT` frame on stdout.
3. Exit on end of input; as PID 1 of its namespace this kills everything left.

The child (`_child_main`): new session, stdio redirected (stdin from
/dev/null, stdout and stderr to the output pipe, fd 3 to the report pipe),
resource limits, scrubbed environment, privilege drop to a per-worker uid,
and an audit hook (PEP 578) that refuses file access outside the working
directory, sockets, `exec`/`spawn`, `ctypes`, `gc` and frame introspection.
It then compiles and executes the program, runs the I/O tests and the script
test, and writes nonce-tagged report lines. Expected outputs never reach this
process: results are encoded as tagged JSON made only of ASCII digits, hex and
tags, and compared by the parent.

Report lines (fd 3), each `<nonce> <payload>\\n`:

  `S <hex>`          the program does not compile (SyntaxError, ...)
  `L <kind> <hex>`   executing the program's top level raised
  `N <hex>`          the entry point is missing or not callable
  `R <i> <json>`     I/O test `i` returned the encoded value
  `X <i> <kind> <hex>`  I/O test `i` raised, or its value is not encodable
  `C`                the script test ran to completion
  `F <kind> <hex>`   the script test raised
  `I <hex>`          the harness itself failed (a bad job)
  `D`                the harness finished every test

`<kind>` is `M` (MemoryError), `O` (file size limit hit), `U` (return value
not a plain literal or too large) or `E` (anything else). `<hex>` is a UTF-8
message in hex.
"""

import marshal
import os
import sys

# ----------------------------------------------------------------- protocol
REPORT_FD = 3
TAIL_BYTES = 4096
MESSAGE_CHARS = 400
# Encoded values deeper than this are rejected (the parent's decoder recurses).
MAX_DEPTH = 64

KIND_MEMORY = "M"
KIND_OUTPUT = "O"
KIND_UNSUPPORTED = "U"
KIND_ERROR = "E"

REASON_NONE = "none"
REASON_DEADLINE = "deadline"
REASON_CPU = "cpu"
REASON_OUTPUT = "output"
REASON_REPORT = "report"
REASON_SPAWN = "spawn"

# Modules imported by the server before it forks jobs. Untrusted code finds
# them in `sys.modules`, which matters where the standard library directory
# is unreadable for the sandbox uid. Nothing here may give a way around the
# audit hook: no ctypes, subprocess, _posixsubprocess or socket.
PRELOAD = (
    "abc", "array", "base64", "binascii", "bisect", "calendar", "cmath",
    "collections", "collections.abc", "contextlib", "copy", "dataclasses",
    "datetime", "decimal", "difflib", "enum", "fractions", "functools",
    "hashlib", "heapq", "itertools", "json", "math", "numbers", "operator",
    "queue", "random", "re", "select", "shutil", "statistics", "string",
    "struct", "textwrap", "threading", "time", "typing", "unicodedata",
    "fcntl", "resource",
)
# Never importable inside the sandbox.
_DENIED_IMPORTS = frozenset({
    "ctypes", "_ctypes", "_posixsubprocess", "subprocess", "socket",
    "_socket", "multiprocessing", "_multiprocessing", "_xxsubinterpreters",
    "_testcapi", "_testinternalcapi", "_testmultiphase", "pty", "_tracemalloc",
    "tracemalloc", "faulthandler", "gc",
})


def _hex(text, limit=MESSAGE_CHARS):
  """Hex of the UTF-8 of `text[:limit]` as bytes (ASCII)."""
  if len(text) > limit:
    text = text[:limit] + "..."
  return text.encode("utf-8", "backslashreplace").hex().encode("ascii")


# ------------------------------------------------------------ value encoding
def make_encoder(max_chars):
  """Returns `encode(value) -> bytes` (tagged JSON) for plain literals.

  Accepts exactly the builtin types None, bool, int, float, complex, str,
  bytes, list, tuple, set, frozenset and dict (no subclasses), nested at most
  `MAX_DEPTH` deep. Raises TypeError for anything else and ValueError when the
  encoding exceeds `max_chars`. The result contains no quote or backslash
  inside strings (text is hex), so it needs no escaping. Everything the
  function uses is bound here, so that untrusted code that patches builtins
  or module attributes cannot change what it does.
  """
  type_ = type
  none_t, bool_t, int_t, float_t = type(None), bool, int, float
  complex_t, str_t, bytes_t = complex, str, bytes
  list_t, tuple_t, set_t, frozenset_t, dict_t = list, tuple, set, frozenset, dict
  int_repr, float_repr, complex_repr = int.__repr__, float.__repr__, complex.__repr__
  str_encode, bytes_hex = str.encode, bytes.hex
  dict_items = dict.items
  join = ",".join
  len_ = len
  type_error, value_error = TypeError, ValueError
  seq_tags = {list_t: '"l"', tuple_t: '"t"', set_t: '"S"', frozenset_t: '"Z"'}
  seq_tags_get = seq_tags.get
  budget = [0]

  def enc(v, depth):
    if depth > MAX_DEPTH:
      raise value_error("value nested too deeply")
    t = type_(v)
    if t is none_t:
      s = '["N"]'
    elif t is bool_t:
      s = '["T"]' if v else '["F"]'
    elif t is int_t:
      s = '["i","' + int_repr(v) + '"]'
    elif t is float_t:
      s = '["f","' + float_repr(v) + '"]'
    elif t is complex_t:
      s = '["c","' + complex_repr(v) + '"]'
    elif t is str_t:
      s = '["s","' + bytes_hex(str_encode(v, "utf-8", "surrogatepass")) + '"]'
    elif t is bytes_t:
      s = '["b","' + bytes_hex(v) + '"]'
    elif t is dict_t:
      parts = []
      for k, x in list_t(dict_items(v)):
        parts.append("[" + enc(k, depth + 1) + "," + enc(x, depth + 1) + "]")
      s = '["d",[' + join(parts) + "]]"
    else:
      tag = seq_tags_get(t)
      if tag is None:
        raise type_error("return value of type " + repr_type(t) + " is not a plain literal")
      s = "[" + tag + ",[" + join([enc(x, depth + 1) for x in list_t(v)]) + "]]"
    budget[0] += len_(s)
    if budget[0] > max_chars:
      raise value_error("return value too large to report")
    return s

  def repr_type(t):
    try:
      return str_t(t.__name__)[:80]
    except BaseException:  # pylint: disable=broad-except
      return "?"

  def encode(v):
    budget[0] = 0
    return str_encode(enc(v, 0), "ascii")

  return encode


def make_plain_check():
  """Returns `check(value)` raising TypeError unless `value` is a plain literal."""
  type_ = type
  plain = frozenset({type(None), bool, int, float, complex, str, bytes})
  containers = frozenset({list, tuple, set, frozenset})
  dict_t, list_t, dict_items = dict, list, dict.items
  type_error = TypeError

  def check(v, depth=0):
    t = type_(v)
    if t in plain:
      return
    if depth > MAX_DEPTH:
      raise type_error("value nested too deeply")
    if t in containers:
      for x in list_t(v):
        check(x, depth + 1)
    elif t is dict_t:
      for k, x in list_t(dict_items(v)):
        check(k, depth + 1)
        check(x, depth + 1)
    else:
      raise type_error("candidate returned a value that is not a plain literal")

  return check


# ---------------------------------------------------------------- audit hook
def _make_audit_hook(workdir, read_roots, allow_fork, getframe_allowed):
  """Builds the PEP 578 hook that confines the untrusted code.

  Refuses (PermissionError): opening, listing or changing files outside
  `workdir` (reads are also allowed under `read_roots`, the standard
  library), sockets, exec/spawn/system, fork unless `allow_fork`, signals to
  other processes, rlimit changes, ctypes, gc and tracing introspection,
  frame objects (tracebacks' `tb_frame`, generators' `gi_frame`, ...) and
  `sys._getframe` except from the standard-library functions whose code
  objects are in `getframe_allowed` (typing, namedtuple and Enum use it to
  read a module name). All helpers are bound in this closure.
  """
  getcwd, readlink, getpid, fsdecode = os.getcwd, os.readlink, os.getpid, os.fsdecode
  getframe = sys._getframe  # pylint: disable=protected-access
  import _thread  # pylint: disable=g-import-not-at-top
  get_ident = _thread.get_ident
  type_, isinstance_, len_, bool_ = type, isinstance, len, bool
  str_t, bytes_t, int_t = str, bytes, int
  str_join, bytes_join = "".join, b"".join
  perm = PermissionError
  oserror = OSError
  wr_flags = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
  busy = set()
  busy_add, busy_discard = busy.add, busy.discard
  workdir = str_join([workdir])
  write_roots = (workdir, "/dev/null")
  read_roots = tuple(read_roots) + (workdir, "/dev/null", "/dev/zero",
                                    "/dev/urandom", "/dev/random")
  always_denied = frozenset({
      "sys._current_frames", "sys._current_exceptions", "sys.settrace",
      "sys.setprofile", "gc.get_objects", "gc.get_referrers",
      "gc.get_referents", "os.exec", "os.posix_spawn", "os.system",
      "os.forkpty", "subprocess.Popen", "pdb.Pdb", "webbrowser.open",
      "resource.setrlimit", "resource.prlimit", "os.putenv", "os.unsetenv",
      "sys.setdlopenflags", "ensurepip.bootstrap",
  })
  frame_attrs = frozenset({"tb_frame", "gi_frame", "cr_frame", "ag_frame"})
  denied_imports = _DENIED_IMPORTS
  read_events = frozenset({"os.listdir", "os.scandir", "os.chdir", "glob.glob",
                           "os.walk", "os.fwalk", "pathlib.Path.glob",
                           "pathlib.Path.rglob", "os.getxattr", "os.listxattr"})
  write_events = frozenset({"os.remove", "os.rmdir", "os.mkdir", "os.chmod",
                            "os.chown", "os.utime", "os.truncate", "os.setxattr",
                            "os.removexattr", "shutil.rmtree", "shutil.copymode",
                            "shutil.copystat", "shutil.chown", "tempfile.mkdtemp",
                            "tempfile.mkstemp", "os.lockf"})
  two_path_events = frozenset({"os.rename", "os.link", "os.symlink", "shutil.move",
                               "shutil.copyfile", "shutil.copytree",
                               "shutil.make_archive", "shutil.unpack_archive"})

  def as_text(p):
    t = type_(p)
    if t is str_t:
      return p
    if t is bytes_t:
      return fsdecode(p)
    if isinstance_(p, str_t):  # A str subclass: copy its characters.
      return str_join([p])
    if isinstance_(p, bytes_t):
      return fsdecode(bytes_join([p]))
    raise perm("sandbox: unsupported path object")

  def resolve(p):
    if "\x00" in p:
      raise perm("sandbox: bad path")
    if p[:1] != "/":
      p = getcwd() + "/" + p
    pending = p.split("/")
    pending.reverse()
    out = []
    hops = 0
    while pending:
      c = pending.pop()
      if c == "" or c == ".":
        continue
      if c == "..":
        if out:
          out.pop()
        continue
      cand = "/" + "/".join(out) + ("/" if out else "") + c
      try:
        target = readlink(cand)
      except oserror:
        out.append(c)
        continue
      hops += 1
      if hops > 40:
        raise perm("sandbox: too many symbolic links")
      if target[:1] == "/":
        out = []
      parts = target.split("/")
      parts.reverse()
      pending.extend(parts)
    return "/" + "/".join(out)

  def under(path, roots):
    for r in roots:
      if path == r or path.startswith(r + "/"):
        return True
    return False

  def check_path(p, write):
    if p is None:
      p = "."
    if type_(p) is int_t:  # An already open descriptor.
      return
    path = resolve(as_text(p))
    if not under(path, write_roots if write else read_roots):
      raise perm("sandbox: access to " + path[:200] + " is not allowed")

  def hook(event, args):
    ident = get_ident()
    if ident in busy:
      return
    if event == "open":
      if len_(args) >= 3 and type_(args[2]) is int_t:
        write = bool_(args[2] & wr_flags)
      else:
        mode = args[1] if len_(args) >= 2 else None
        write = type_(mode) is str_t and ("w" in mode or "a" in mode or "x" in mode
                                          or "+" in mode)
      check_path(args[0], write)
    elif event in always_denied or event.startswith("ctypes.") or event.startswith("socket."):
      raise perm("sandbox: " + event + " is not allowed")
    elif event == "object.__getattr__":
      if len_(args) >= 2 and args[1] in frame_attrs:
        raise perm("sandbox: frame access is not allowed")
    elif event == "sys._getframe":
      busy_add(ident)
      try:
        code = getframe(1).f_code
      finally:
        busy_discard(ident)
      if code not in getframe_allowed:
        raise perm("sandbox: sys._getframe is not allowed")
    elif event == "import":
      name = as_text(args[0]) if args else ""
      if name.partition(".")[0] in denied_imports:
        raise perm("sandbox: import of " + name + " is not allowed")
    elif event == "os.fork":
      if not allow_fork:
        raise perm("sandbox: fork is not allowed")
    elif event == "os.kill" or event == "os.killpg":
      if not args or type_(args[0]) is not int_t or args[0] != getpid():
        raise perm("sandbox: signals to other processes are not allowed")
    elif event in read_events:
      check_path(args[0] if args else None, False)
    elif event in write_events:
      check_path(args[0] if args else None, True)
    elif event in two_path_events:
      check_path(args[0] if args else None, event != "os.symlink")
      check_path(args[1] if len_(args) > 1 else None, True)

  return hook


def _getframe_allowlist():
  """Code objects of stdlib functions allowed to call sys._getframe."""
  codes = set()
  typing = sys.modules.get("typing")
  collections = sys.modules.get("collections")
  enum = sys.modules.get("enum")
  for fn in (getattr(typing, "_caller", None), getattr(collections, "namedtuple", None),
             getattr(getattr(enum, "EnumType", None), "_create_", None)):
    code = getattr(fn, "__code__", None)
    if code is not None:
      codes.add(code)
  return frozenset(codes)


# --------------------------------------------------------------- the child
def _child_main(job, workdir, out_w, rep_w, uid, allow_fork, read_roots, getframe_allowed):
  """Runs one job in the freshly forked child; never returns."""
  write, exit_, getpid = os.write, os._exit, os.getpid  # pylint: disable=protected-access
  bytes_join, bytes_find, base_exc = b"".join, bytes.find, BaseException
  nonce = job["nonce"]
  job_pid = getpid()

  def rep(payload):
    # Only the job process reports: a forked copy of it also runs this code
    # and could otherwise try a second guess and report that one.
    # `payload` may come from untrusted code (a bytes subclass with a rigged
    # `__radd__` would see the nonce): copy it into an exact bytes object.
    try:
      if getpid() != job_pid:
        return
      payload = bytes_join((payload,))
      if bytes_find(payload, b"\n") >= 0:
        return
      write(REPORT_FD, bytes_join((nonce, b" ", payload, b"\n")))
    except base_exc:  # pylint: disable=broad-except
      pass

  try:
    os.setsid()
    null = os.open("/dev/null", os.O_RDONLY)
    import fcntl  # pylint: disable=g-import-not-at-top
    out_hi = fcntl.fcntl(out_w, fcntl.F_DUPFD, 100)
    rep_hi = fcntl.fcntl(rep_w, fcntl.F_DUPFD, 100)
    os.dup2(null, 0)
    os.dup2(out_hi, 1)
    os.dup2(out_hi, 2)
    os.dup2(rep_hi, REPORT_FD)
    os.closerange(REPORT_FD + 1, 1 << 16)
    os.chdir(workdir)
    import resource  # pylint: disable=g-import-not-at-top
    limits = job["limits"]
    cpu = limits["cpu"]
    # SIGXCPU (default action: terminate) at the soft CPU limit marks a CPU
    # timeout; the hard limit's SIGKILL a second later catches programs that
    # ignore SIGXCPU. (rusage under-reports CPU time, so it cannot tell.)
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    for res, value in ((resource.RLIMIT_AS, limits["memory"]),
                       (resource.RLIMIT_FSIZE, limits["fsize"]),
                       (resource.RLIMIT_NPROC, limits["nproc"]),
                       (resource.RLIMIT_NOFILE, limits["nofile"]),
                       (resource.RLIMIT_CORE, 0)):
      if value >= 0:  # A negative value leaves the inherited limit.
        resource.setrlimit(res, (value, value))
    os.environ.clear()
    os.environ.update(job["env"])
    os.environ["HOME"] = workdir
    os.environ["TMPDIR"] = workdir
    if uid >= 0:
      os.setgroups([])
      os.setgid(uid)
      os.setuid(uid)
    os.umask(0o077)
    sys.argv[:] = ["<sandbox>"]
    import builtins  # pylint: disable=g-import-not-at-top
    pristine_builtins = dict(builtins.__dict__)
    source = job["source"]
    entry = job["entry_point"]
    io_args = job["io_args"]
    script = job["script_test"]
    check_name = job["check_function"]
    encode = make_encoder(job["result_chars"])
    plain_check = make_plain_check()
    script_code = None
    if script is not None:
      script_code = compile(script, "<test>", "exec", dont_inherit=True)
    hook = _make_audit_hook(workdir, read_roots, allow_fork, getframe_allowed)
  except BaseException as e:  # pylint: disable=broad-except
    rep(b"I " + _hex("sandbox setup failed: %s: %s" % (type(e).__name__, e)))
    exit_(71)
  del job

  # Everything the harness needs from here on is a local: untrusted code may
  # rebind builtins and module attributes but cannot reach this frame.
  type_, callable_, enumerate_, str_t = type, callable, enumerate, str
  isinstance_, getattr_, hex_ = isinstance, getattr, _hex
  mem_err, os_err, syntax_err = MemoryError, OSError, SyntaxError
  value_err, overflow_err, type_err = ValueError, OverflowError, TypeError
  recursion_err, name_err = RecursionError, NameError
  compile_, exec_, dict_t, add_hook = compile, exec, dict, sys.addaudithook
  out_stream, err_stream = sys.stdout, sys.stderr
  efbig = 27

  def describe(e):
    name = "?"
    try:
      name = str_t(type_(e).__name__)
      return name + ": " + str_t(e)
    except base_exc:  # pylint: disable=broad-except
      return name

  def kind_of(e):
    if type_(e) is mem_err:
      return b"M"
    if isinstance_(e, os_err) and getattr_(e, "errno", None) == efbig:
      return b"O"
    return b"E"

  def finish(code):
    for stream in (out_stream, err_stream):
      try:
        stream.flush()
      except base_exc:  # pylint: disable=broad-except
        pass
    exit_(code)

  add_hook(hook)
  del hook
  try:
    code = compile_(source, "<program>", "exec", dont_inherit=True)
  except (syntax_err, value_err, overflow_err) as e:
    rep(b"S " + hex_(describe(e)))
    finish(0)
  except base_exc as e:  # pylint: disable=broad-except
    rep(b"L " + kind_of(e) + b" " + hex_(describe(e)))
    finish(0)
  namespace = {"__name__": "__sandbox__", "__builtins__": builtins}
  try:
    exec_(code, namespace)
  except base_exc as e:  # pylint: disable=broad-except
    rep(b"L " + kind_of(e) + b" " + hex_(describe(e)))
    finish(0)
  fn = namespace.get(entry)
  if fn is None or not callable_(fn):
    rep(b"N " + hex_("entry point %r is not defined or not callable" % entry))
    finish(0)
  for i, args in enumerate_(io_args):
    tag = str_t(i).encode("ascii")
    try:
      value = fn(*args)
    except base_exc as e:  # pylint: disable=broad-except
      rep(b"X " + tag + b" " + kind_of(e) + b" " + hex_(describe(e)))
      continue
    try:
      encoded = encode(value)
    except (type_err, value_err, recursion_err) as e:
      rep(b"X " + tag + b" U " + hex_(describe(e)))
      continue
    except base_exc as e:  # pylint: disable=broad-except
      rep(b"X " + tag + b" " + kind_of(e) + b" " + hex_(describe(e)))
      continue
    rep(b"R " + tag + b" " + encoded)
  if script_code is not None:
    test_ns = dict_t(namespace)
    test_ns["__builtins__"] = dict_t(pristine_builtins)
    test_ns["__name__"] = "__test__"
    candidate = fn

    def wrapped(*args, **kwargs):
      result = candidate(*args, **kwargs)
      plain_check(result)
      return result

    test_ns[entry] = wrapped
    if check_name is not None:
      test_ns.pop(check_name, None)
    try:
      exec_(script_code, test_ns)
      if check_name is not None:
        check = test_ns.get(check_name)
        if check is None or not callable_(check):
          raise name_err("the script test does not define %s()" % check_name)
        check(wrapped)
    except base_exc as e:  # pylint: disable=broad-except
      rep(b"F " + kind_of(e) + b" " + hex_(describe(e)))
    else:
      rep(b"C")
  rep(b"D")
  finish(0)


# --------------------------------------------------------------- the server
def _read_exact(fd, n):
  chunks = []
  while n > 0:
    chunk = os.read(fd, min(n, 1 << 20))
    if not chunk:
      return None
    chunks.append(chunk)
    n -= len(chunk)
  return b"".join(chunks)


def _read_line(fd):
  buf = []
  while True:
    ch = os.read(fd, 1)
    if not ch:
      return None
    if ch == b"\n":
      return b"".join(buf)
    buf.append(ch)
    if len(buf) > 256:
      return None


def _write_all(fd, data):
  view = memoryview(data)
  while view:
    n = os.write(fd, view)
    view = view[n:]


def _kill_all(pid, uid, ns_init):
  """Kills the job's process group and every other process it may have left."""
  import signal  # pylint: disable=g-import-not-at-top
  try:
    os.killpg(pid, signal.SIGKILL)
  except OSError:
    pass
  if ns_init:
    try:  # From PID 1 of a namespace this reaches every other process in it.
      os.kill(-1, signal.SIGKILL)
    except OSError:
      pass
  elif uid >= 0:
    helper = os.fork()
    if helper == 0:
      try:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
        os.kill(-1, signal.SIGKILL)  # Every process of the sandbox uid.
      except BaseException:  # pylint: disable=broad-except
        pass
      os._exit(0)  # pylint: disable=protected-access
    os.waitpid(helper, 0)


def _reap_all(time_limit):
  """Reaps every child (PID 1 inherits orphans); waits at most `time_limit`."""
  import time  # pylint: disable=g-import-not-at-top
  end = time.monotonic() + time_limit
  while True:
    try:
      pid, _ = os.waitpid(-1, os.WNOHANG)
    except ChildProcessError:
      return
    if pid == 0:
      if time.monotonic() > end:
        return
      time.sleep(0.002)


def _remove_tree(path):
  import shutil  # pylint: disable=g-import-not-at-top

  def fix(func, p, _):
    try:
      os.chmod(os.path.dirname(p), 0o700)
      os.chmod(p, 0o700)
    except OSError:
      pass
    try:
      func(p)
    except OSError:
      pass

  shutil.rmtree(path, onerror=fix)


def _run_job(job, root, counter, uid, allow_fork, ns_init, read_roots, getframe_allowed):
  """Forks, supervises and cleans up one job; returns the RESULT frame."""
  import select  # pylint: disable=g-import-not-at-top
  import signal  # pylint: disable=g-import-not-at-top
  import time  # pylint: disable=g-import-not-at-top
  start = time.monotonic()
  workdir = os.path.join(root, "job%d" % counter)
  if os.path.islink(workdir):
    os.unlink(workdir)
  elif os.path.lexists(workdir):  # Left by a server that died mid-job: job numbers restart.
    _remove_tree(workdir)
  os.mkdir(workdir, 0o700)
  if uid >= 0:
    os.chown(workdir, uid, uid)
  out_r, out_w = os.pipe2(os.O_CLOEXEC)
  rep_r, rep_w = os.pipe2(os.O_CLOEXEC)
  try:
    pid = os.fork()
  except OSError as e:
    for fd in (out_r, out_w, rep_r, rep_w):
      os.close(fd)
    _remove_tree(workdir)
    message = _hex("fork failed: %s" % e).decode()
    return ("RESULT 0 0.0 %s 0 0 0 %s\n" % (REASON_SPAWN, message)).encode()
  if pid == 0:
    try:
      os.close(out_r)
      os.close(rep_r)
      _child_main(job, workdir, out_w, rep_w, uid, allow_fork, read_roots, getframe_allowed)
    finally:
      os._exit(72)  # pylint: disable=protected-access
  os.close(out_w)
  os.close(rep_w)
  limits = job["limits"]
  wall, out_cap, rep_cap = limits["wall"], limits["output"], limits["report"]
  deadline = start + wall
  try:
    pidfd = os.pidfd_open(pid)
  except (AttributeError, OSError):
    pidfd = None
  poller = select.poll()
  for fd in (out_r, rep_r):
    os.set_blocking(fd, False)
    poller.register(fd, select.POLLIN)
  if pidfd is not None:
    poller.register(pidfd, select.POLLIN)
  poller.register(0, select.POLLIN)  # End of input: the parent has gone.
  tail = bytearray()
  report = bytearray()
  out_total = 0
  reason = REASON_NONE
  open_fds = {out_r, rep_r}
  exited = False
  parent_gone = False

  def drain(fd):
    nonlocal out_total, reason
    while True:
      try:
        chunk = os.read(fd, 1 << 16)
      except BlockingIOError:
        return True
      if not chunk:
        return False
      if fd == out_r:
        out_total += len(chunk)
        tail.extend(chunk)
        if len(tail) > 2 * TAIL_BYTES:
          del tail[:-TAIL_BYTES]
        if out_total > out_cap and reason == REASON_NONE:
          reason = REASON_OUTPUT
      else:
        if len(report) + len(chunk) > rep_cap:
          if reason == REASON_NONE:
            reason = REASON_REPORT
          return True
        report.extend(chunk)

  while not exited:
    timeout = deadline - time.monotonic()
    if timeout <= 0:
      reason = reason if reason != REASON_NONE else REASON_DEADLINE
      break
    events = poller.poll(min(timeout, 0.05 if pidfd is None else timeout) * 1000)
    for fd, _ in events:
      if fd in open_fds:
        if not drain(fd):
          poller.unregister(fd)
          open_fds.discard(fd)
      elif fd == pidfd:
        exited = True
      elif fd == 0:
        parent_gone = True
        poller.unregister(0)
    if pidfd is None and not exited:
      try:
        exited = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
      except ChildProcessError:
        exited = True
    if reason != REASON_NONE or parent_gone:
      break
  # The job process is not reaped yet, so its process group id is still ours.
  _kill_all(pid, uid, ns_init)
  _, status, usage = os.wait4(pid, 0)
  if ns_init:
    _reap_all(2.0)
  if pidfd is not None:
    poller.unregister(pidfd)
    os.close(pidfd)
  if not parent_gone:
    poller.unregister(0)
  # Every writer is dead now: read what is left (bounded, in case one lives).
  end = time.monotonic() + 1.0
  while open_fds and time.monotonic() < end:
    for fd, _ in poller.poll(100):
      if fd in open_fds and not drain(fd):
        poller.unregister(fd)
        open_fds.discard(fd)
  os.close(out_r)
  os.close(rep_r)
  _remove_tree(workdir)
  cpu = usage.ru_utime + usage.ru_stime
  if reason == REASON_NONE and os.WIFSIGNALED(status) and (
      os.WTERMSIG(status) == signal.SIGXCPU or
      (os.WTERMSIG(status) == signal.SIGKILL and cpu >= 0.5 * limits["cpu"])):
    reason = REASON_CPU
  tail_bytes = bytes(tail[-TAIL_BYTES:])
  header = "RESULT %d %.6f %s %d %d %d -\n" % (
      status, cpu, reason, out_total, len(tail_bytes), len(report))
  return header.encode() + tail_bytes + bytes(report)


def _stdlib_roots():
  roots = []
  for p in sys.path:
    if p and os.path.isabs(p):
      roots.append(os.path.realpath(p))
  return roots


def serve(argv):
  """Entry point of the server; see the module docstring."""
  import argparse  # pylint: disable=g-import-not-at-top
  parser = argparse.ArgumentParser()
  parser.add_argument("--serve", action="store_true")
  parser.add_argument("--root", required=True)
  parser.add_argument("--uid", type=int, default=-1)
  parser.add_argument("--allow-fork", type=int, default=0)
  parser.add_argument("--tag", default="")
  args = parser.parse_args(argv)
  for name in PRELOAD:
    try:
      __import__(name)
    except ImportError:
      pass
  for name in ("_posixsubprocess", "ctypes", "_ctypes", "socket", "_socket"):
    sys.modules.pop(name, None)
  ns_init = os.getpid() == 1
  read_roots = _stdlib_roots()
  getframe_allowed = _getframe_allowlist()
  os.makedirs(args.root, exist_ok=True)
  os.chmod(args.root, 0o711)
  _write_all(1, ("READY ns_init=%d uid=%d fork=%d\n" % (
      ns_init, args.uid, args.allow_fork)).encode())
  counter = 0
  while True:
    line = _read_line(0)
    if line is None or not line.startswith(b"JOB "):
      break
    payload = _read_exact(0, int(line[4:]))
    if payload is None:
      break
    job = marshal.loads(payload)
    counter += 1
    result = _run_job(job, args.root, counter, args.uid, bool(args.allow_fork), ns_init,
                      read_roots, getframe_allowed)
    _write_all(1, result)
  os._exit(0)  # pylint: disable=protected-access


if __name__ == "__main__":
  serve(sys.argv[1:])
