"""The in-sandbox half of `agentic_grpo.sandbox`: a fork server.

This file runs as its own interpreter (`python -S -s -B -P runner.py --serve
...`), usually as PID 1 of fresh PID, network, mount, IPC and UTS namespaces
whose root is a minimal read-only view (see `isolation.py`). It imports the
standard library only and never the `agentic_grpo` package; the host side
imports it for the protocol constants, `decode_value` and its file path.

Life of the server ("zygote"):

0. With `--landlock-ro/--landlock-rw` (no namespaces, Landlock available):
   restrict this process to those file hierarchies, then `exec` itself
   without the flags (so that no `ctypes` stays loaded in the server).
1. Preload a fixed set of standard-library modules (so that jobs do not pay
   their import time), then report `READY` on stdout.
2. Read jobs from stdin (`JOB <n>\\n` + `n` bytes of `marshal` data written
   by the trusted parent). For each job: make a fresh working directory, fork
   the candidate child and, for a script test, the check child; supervise
   them (wall deadline, output and report caps); kill every process the job
   left; empty every writable directory of the view (`--views`: the working
   directory, /tmp, /var/tmp, /dev/shm, /run), check that the mount table is
   unchanged, and write one `RESULT` frame on stdout.
3. Exit on end of input; as PID 1 of its namespace this kills everything left.

Both children get: new session, stdio redirected (stdin from /dev/null,
stdout and stderr to the output pipe, fd 3 to the report pipe), resource
limits, scrubbed environment, privilege drop to a per-worker uid, and an
audit hook (PEP 578) that refuses file access outside the working directory
(and relative paths with `..`, symbolic links, and directory descriptors
outside it, which `dir_fd=` would resolve against), sockets, `exec`/`spawn`,
`ctypes`, `gc` and frame introspection.

The candidate child (`_candidate_main`) compiles and executes the program,
runs the I/O tests, then serves the check child's calls of the entry point
until that child closes the call pipe. The check child (`_check_main`) is a
fork of the pristine server, so no untrusted code ever ran in it: it runs the
trusted `script_context` and `script_test` in fresh globals with its own
builtins and modules, and the candidate it hands to `check` is a proxy that
sends the arguments (`marshal`) to the candidate child and decodes the reply
(tagged JSON of a plain literal). Globals, builtins or modules the program
patches therefore never reach the check. Expected outputs of I/O tests never
reach the sandbox: results are encoded as tagged JSON made only of ASCII
digits, hex and tags, and compared by the parent.

Report lines (fd 3), each `<nonce> <payload>\\n`:

  `S <hex>`          the program does not compile (SyntaxError, ...)
  `L <kind> <hex>`   executing the program's top level raised
  `N <hex>`          the entry point is missing or not callable
  `R <i> <json>`     I/O test `i` returned the encoded value
  `X <i> <kind> <hex>`  I/O test `i` raised, or its value is not encodable
  `C`                the script test ran to completion (check child)
  `F <kind> <hex>`   the script test raised (check child)
  `I <hex>`          the harness itself failed (a bad job)
  `D`                the candidate child finished every test and call

A stdin/stdout job (`"kind": "stdio"`, see `stdio.py`) carries inputs but
no expected outputs. The server forks one child per input (`_stdio_main`),
each in a fresh working directory with the input on stdin (a memfd), stdout
and stderr on separate pipes and the job's limits per test; the child runs
the program as `__main__` and reports `S`, `L <kind> <hex>` or `D`. The
RESULT frame's report is then the `marshal` list of per-test dicts (exit
status, CPU, wall, peak RSS, limit hit, stdout, stderr tail, report lines);
the parent compares the outputs. The list is shorter than the inputs when the
job stopped early: after a test that ended in an error with `stop_on_error`,
or when the job's wall-clock `budget` (seconds, or None) ran out; a test still
running at the end of the budget is killed (reason `budget`).

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
REASON_BUDGET = "budget"  # a stdio job's wall-clock budget ended this test

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


def decode_value(node, depth=0):
  """Tagged JSON (as parsed by `json.loads`) -> plain literal; ValueError if malformed.

  The inverse of `make_encoder`. Used by the trusted parent and by the check
  child, both on data the candidate controls: it only builds builtin values.
  """
  if depth > MAX_DEPTH + 1:
    raise ValueError("value nested too deeply")
  if type(node) is not list or not node or type(node[0]) is not str:
    raise ValueError("malformed value")
  tag = node[0]
  if len(node) == 1:
    if tag in _SINGLETONS:
      return _SINGLETONS[tag]
    raise ValueError("malformed value")
  if len(node) != 2:
    raise ValueError("malformed value")
  body = node[1]
  if type(body) is str:
    if tag == "i":
      return int(body)
    if tag == "f":
      return float(body)
    if tag == "c":
      return complex(body)
    if tag == "s":
      return bytes.fromhex(body).decode("utf-8", "surrogatepass")
    if tag == "b":
      return bytes.fromhex(body)
    raise ValueError("malformed value")
  if type(body) is not list:
    raise ValueError("malformed value")
  if tag == "d":
    out = {}
    for pair in body:
      if type(pair) is not list or len(pair) != 2:
        raise ValueError("malformed value")
      out[decode_value(pair[0], depth + 1)] = decode_value(pair[1], depth + 1)
    return out
  make = _CONTAINERS.get(tag)
  if make is None:
    raise ValueError("malformed value")
  return make(decode_value(x, depth + 1) for x in body)


_SINGLETONS = {"N": None, "T": True, "F": False}
_CONTAINERS = {"l": list, "t": tuple, "S": set, "Z": frozenset}


# ---------------------------------------------------------------- audit hook
# Long by design: the hook is one closure over its allow-lists so that untrusted code cannot reach
# its state; every audited event is handled in one place, read top to bottom.
def _make_audit_hook(workdir, read_roots, allow_fork, getframe_allowed):
  """Builds the PEP 578 hook that confines the untrusted code.

  Refuses (PermissionError): opening, listing or changing files outside
  `workdir` (reads are also allowed under `read_roots`, the standard
  library); relative paths with a `..` component, creating symbolic links and
  opening a directory outside `workdir` (a relative path given with
  `dir_fd=` resolves against that descriptor, not the working directory the
  hook checks against: without `..`, links and outside directory descriptors
  both resolve inside `workdir`); sockets, exec/spawn/system, fork unless `allow_fork`, signals to
  other processes, rlimit changes, ctypes, gc and tracing introspection,
  frame objects (tracebacks' `tb_frame`, generators' `gi_frame`, ...) and
  `sys._getframe` except from the standard-library functions whose code
  objects are in `getframe_allowed` (typing, namedtuple and Enum use it to
  read a module name). All helpers are bound in this closure.
  """
  getcwd, readlink, getpid, fsdecode = os.getcwd, os.readlink, os.getpid, os.fsdecode
  stat_, s_isdir = os.stat, __import__("stat").S_ISDIR
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
      "sys.setdlopenflags", "ensurepip.bootstrap", "os.symlink", "os.chroot",
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
  two_path_events = frozenset({"os.rename", "os.link", "shutil.move",
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
      if ".." in p.split("/"):
        raise perm("sandbox: relative paths with '..' are not allowed")
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

  def check_path(p, write, opening=False):
    if p is None:
      p = "."
    if type_(p) is int_t:  # An already open descriptor.
      return
    path = resolve(as_text(p))
    if not under(path, write_roots if write else read_roots):
      raise perm("sandbox: access to " + path[:200] + " is not allowed")
    if opening and not write and not under(path, write_roots):
      try:
        is_dir = s_isdir(stat_(path).st_mode)
      except oserror:
        is_dir = False
      if is_dir:
        raise perm("sandbox: opening directory " + path[:200] + " is not allowed")

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
      check_path(args[0], write, True)
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
      check_path(args[0] if args else None, True)
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


# --------------------------------------------------------------- the children
def _confine(job, workdir, out_w, rep_w, uid, keep=(), stdin=None, err_w=None):
  """Common set-up of all children: session, stdio, rlimits, env, uid.

  stdin comes from `stdin` (default /dev/null); stderr goes to `err_w`
  (default: with stdout to `out_w`). Returns the new numbers of the
  descriptors in `keep` (REPORT_FD + 1, ...); every other descriptor above
  REPORT_FD is closed.
  """
  os.setsid()
  null = os.open("/dev/null", os.O_RDONLY)
  import fcntl  # pylint: disable=g-import-not-at-top
  in_fd = null if stdin is None else stdin
  err_fd = out_w if err_w is None else err_w
  in_hi, out_hi, err_hi, rep_hi, *keep_hi = [
      fcntl.fcntl(fd, fcntl.F_DUPFD, 100) for fd in (in_fd, out_w, err_fd, rep_w) + tuple(keep)]
  os.dup2(in_hi, 0)
  os.dup2(out_hi, 1)
  os.dup2(err_hi, 2)
  os.dup2(rep_hi, REPORT_FD)
  kept = tuple(REPORT_FD + 1 + i for i in range(len(keep_hi)))
  for fd, new in zip(keep_hi, kept):
    os.dup2(fd, new, inheritable=False)
  os.closerange(REPORT_FD + 1 + len(kept), 1 << 16)
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
  return kept


def _make_reporter(nonce):
  """`rep(payload)`: writes one nonce-tagged report line (this process only)."""
  write, getpid = os.write, os.getpid
  bytes_join, bytes_find, base_exc = b"".join, bytes.find, BaseException
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

  return rep


def _describe(e):
  name = "?"
  try:
    name = str(type(e).__name__)
    return name + ": " + str(e)
  except BaseException:  # pylint: disable=broad-except
    return name


def _kind_of(e):
  if type(e) is MemoryError:  # pylint: disable=unidiomatic-typecheck
    return b"M"
  if isinstance(e, OSError) and getattr(e, "errno", None) == 27:  # EFBIG
    return b"O"
  return b"E"


def _frame_reader(fd):
  """`read() -> bytes | None`: one `<n>\\n<n bytes>` frame from `fd`, None at EOF."""
  read, int_, bytes_join = os.read, int, b"".join

  def read_frame():
    head = []
    while True:
      ch = read(fd, 1)
      if not ch:
        return None
      if ch == b"\n":
        break
      head.append(ch)
      if len(head) > 20:
        return None
    n = int_(bytes_join(head))
    chunks = []
    while n > 0:
      chunk = read(fd, n if n < 1 << 20 else 1 << 20)
      if not chunk:
        return None
      chunks.append(chunk)
      n -= len(chunk)
    return bytes_join(chunks)

  return read_frame


def _frame_writer(fd):
  write, bytes_join = os.write, b"".join

  def write_frame(payload):
    data = memoryview(bytes_join((str(len(payload)).encode("ascii"), b"\n", payload)))
    while data:
      data = data[write(fd, data):]

  return write_frame


# Long by design: the child's life in order (limits, privileges, hook, load, serve the check's
# calls, exit); each step depends on the one before and must not be reordered.
def _candidate_main(job, workdir, out_w, rep_w, uid, hook_args, calls):
  """Runs the program and its I/O tests, then serves calls; never returns.

  `calls`: (read fd, write fd) of the call channel with the check child, or
  None without a script test.
  """
  exit_, getpid = os._exit, os.getpid  # pylint: disable=protected-access
  job_pid = getpid()
  rep = _make_reporter(job["nonce"])
  try:
    calls = _confine(job, workdir, out_w, rep_w, uid, calls or ()) or None
    import builtins  # pylint: disable=g-import-not-at-top
    source, entry, io_args = job["source"], job["entry_point"], job["io_args"]
    encode = make_encoder(job["result_chars"])
    hook = _make_audit_hook(workdir, *hook_args) if hook_args is not None else None
    if calls is not None:
      read_call, write_reply = _frame_reader(calls[0]), _frame_writer(calls[1])
  except BaseException as e:  # pylint: disable=broad-except
    rep(b"I " + _hex("sandbox setup failed: %s: %s" % (type(e).__name__, e)))
    exit_(71)
  del job

  # Everything the harness needs from here on is a local: untrusted code may
  # rebind builtins and module attributes but cannot reach this frame.
  enumerate_, str_t, callable_, bytes_t = enumerate, str, callable, bytes
  hex_, describe, kind_of = _hex, _describe, _kind_of
  syntax_err, value_err, overflow_err = SyntaxError, ValueError, OverflowError
  type_err, recursion_err, base_exc = TypeError, RecursionError, BaseException
  compile_, exec_, loads = compile, exec, marshal.loads
  out_stream, err_stream = sys.stdout, sys.stderr

  def finish(code):
    for stream in (out_stream, err_stream):
      try:
        stream.flush()
      except base_exc:  # pylint: disable=broad-except
        pass
    exit_(code)

  def call(fn, args, kwargs):
    """(b"R", encoded) or (kind, message) for one call of the entry point."""
    try:
      value = fn(*args, **kwargs)
    except base_exc as e:  # pylint: disable=broad-except
      return kind_of(e), hex_(describe(e))
    try:
      return b"R", encode(value)
    except (type_err, value_err, recursion_err) as e:
      return b"U", hex_(describe(e))
    except base_exc as e:  # pylint: disable=broad-except
      return kind_of(e), hex_(describe(e))

  if hook is not None:
    sys.addaudithook(hook)
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
    kind, body = call(fn, args, {})
    tag = str_t(i).encode("ascii")
    rep((b"R " + tag + b" " + body) if kind == b"R" else
        (b"X " + tag + b" " + kind + b" " + body))
  if calls is not None:
    try:
      write_reply(b"ready")
      while True:
        frame = read_call()
        if frame is None:
          break
        args, kwargs = loads(frame)
        kind, body = call(fn, args, kwargs)
        if getpid() != job_pid:  # A forked copy of the candidate returned: not an answer.
          exit_(0)
        write_reply(bytes_t(kind) + b" " + bytes_t(body))
    except base_exc as e:  # pylint: disable=broad-except
      rep(b"I " + hex_("call channel failed: " + describe(e)))
      finish(0)
  rep(b"D")
  finish(0)


def _make_proxy(read_reply, write_call, entry, builtin_exceptions):
  """The candidate the check sees: calls the entry point in the candidate child."""
  import json  # pylint: disable=g-import-not-at-top
  plain = make_encoder(1 << 30)  # Raises TypeError unless given a plain literal.

  def candidate(*args, **kwargs):
    try:
      plain((args, kwargs))
      frame = marshal.dumps((args, kwargs))
    except (TypeError, ValueError) as e:
      raise TypeError("arguments of %s() must be plain literals" % entry) from e
    write_call(frame)
    reply = read_reply()
    if reply is None:
      raise RuntimeError("the candidate process ended during a call of %s()" % entry)
    kind, _, body = reply.partition(b" ")
    if kind == b"R":
      return decode_value(json.loads(body))
    message = bytes.fromhex(body.decode("ascii")).decode("utf-8", "replace")
    if kind == b"U":
      raise TypeError("candidate returned a value that is not a plain literal: " + message)
    if kind == b"M":
      raise MemoryError(message)
    name, _, text = message.partition(": ")
    raise builtin_exceptions.get(name, RuntimeError)(message if name not in
                                                     builtin_exceptions else text)

  candidate.__name__ = candidate.__qualname__ = entry
  return candidate


def _check_main(job, workdir, out_w, rep_w, uid, hook_args, calls):
  """Runs the script test against a proxy of the candidate; never returns.

  Forked from the pristine server: the program never ran in this process.
  `calls`: (read fd, write fd) of the call channel with the candidate child.
  """
  exit_ = os._exit  # pylint: disable=protected-access
  rep = _make_reporter(job["nonce"])
  try:
    calls = _confine(job, workdir, out_w, rep_w, uid, calls)
    import builtins  # pylint: disable=g-import-not-at-top
    fresh_builtins = dict(builtins.__dict__)
    exceptions = {k: v for k, v in fresh_builtins.items()
                  if isinstance(v, type) and issubclass(v, Exception)}
    entry, check_name = job["entry_point"], job["check_function"]
    context = job["script_context"]
    context_code = None if context is None else compile(context, "<context>", "exec",
                                                         dont_inherit=True)
    script_code = compile(job["script_test"], "<test>", "exec", dont_inherit=True)
    read_reply, write_call = _frame_reader(calls[0]), _frame_writer(calls[1])
    if hook_args is not None:
      sys.addaudithook(_make_audit_hook(workdir, *hook_args))
  except BaseException as e:  # pylint: disable=broad-except
    rep(b"I " + _hex("sandbox setup failed: %s: %s" % (type(e).__name__, e)))
    exit_(71)
  if read_reply() != b"ready":
    exit_(0)  # The program did not load; the candidate child reported why.
  test_ns = {"__name__": "__test__", "__builtins__": fresh_builtins}
  try:
    if context_code is not None:
      exec(context_code, test_ns)  # pylint: disable=exec-used
    proxy = _make_proxy(read_reply, write_call, entry, exceptions)
    test_ns[entry] = proxy
    if check_name is not None:
      test_ns.pop(check_name, None)
    exec(script_code, test_ns)  # pylint: disable=exec-used
    if check_name is not None:
      check = test_ns.get(check_name)
      if check is None or not callable(check):
        raise NameError("the script test does not define %s()" % check_name)
      check(proxy)
  except BaseException as e:  # pylint: disable=broad-except
    rep(b"F " + _kind_of(e) + b" " + _hex(_describe(e)))
  else:
    rep(b"C")
  for stream in (sys.stdout, sys.stderr):
    try:
      stream.flush()
    except BaseException:  # pylint: disable=broad-except
      pass
  exit_(0)


def _stdio_main(job, workdir, out_w, rep_w, uid, hook_args, fds):
  """Runs the program as `__main__` on one test's input; never returns.

  `fds`: (stdin descriptor holding the test's input, stderr write end).
  Reports `S` (does not compile), `L <kind>` (raised, or exited non-zero) or
  `D` (ran to the end, or `sys.exit(0)`); the exit status says the rest.
  """
  exit_ = os._exit  # pylint: disable=protected-access
  rep = _make_reporter(job["nonce"])
  try:
    _confine(job, workdir, out_w, rep_w, uid, stdin=fds[0], err_w=fds[1])
    import builtins  # pylint: disable=g-import-not-at-top
    import io  # pylint: disable=g-import-not-at-top
    source = job["source"]
    hook = _make_audit_hook(workdir, *hook_args) if hook_args is not None else None
    # Fresh streams on the new descriptors (the server's read nothing through them).
    sys.stdin = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)),
                                 encoding="utf-8", errors="replace")
    sys.stdout = io.TextIOWrapper(io.BufferedWriter(io.FileIO(1, "w", closefd=False), 1 << 16),
                                  encoding="utf-8", errors="replace")
    sys.stderr = io.TextIOWrapper(io.BufferedWriter(io.FileIO(2, "w", closefd=False)),
                                  encoding="utf-8", errors="replace", line_buffering=True)
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr
  except BaseException as e:  # pylint: disable=broad-except
    rep(b"I " + _hex("sandbox setup failed: %s: %s" % (type(e).__name__, e)))
    exit_(71)
  del job
  hex_, describe, kind_of, base_exc = _hex, _describe, _kind_of, BaseException
  system_exit, compile_, exec_ = SystemExit, compile, exec
  out_stream, err_stream = sys.stdout, sys.stderr

  def finish(code):
    for stream in (out_stream, err_stream):
      try:
        stream.flush()
      except base_exc:  # pylint: disable=broad-except
        pass
    exit_(code)

  if hook is not None:
    sys.addaudithook(hook)
    del hook
  try:
    code = compile_(source, "<program>", "exec", dont_inherit=True)
  except base_exc as e:  # pylint: disable=broad-except
    rep(b"S " + hex_(describe(e)))
    finish(1)
  try:
    exec_(code, {"__name__": "__main__", "__builtins__": builtins})
  except system_exit as e:
    status = e.code
    if status is None or status == 0:
      rep(b"D")
      finish(0)
    rep(b"L E " + hex_("SystemExit: %r" % (status,)))
    finish(1)
  except base_exc as e:  # pylint: disable=broad-except
    rep(b"L " + kind_of(e) + b" " + hex_(describe(e)))
    finish(1)
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


def _fork_child(main, job, workdir, out_w, rep_w, uid, hook_args, calls, close):
  """Forks one job child running `main`; returns its pid (raises OSError)."""
  pid = os.fork()
  if pid == 0:
    try:
      for fd in close:
        os.close(fd)
      main(job, workdir, out_w, rep_w, uid, hook_args, calls)
    finally:
      os._exit(72)  # pylint: disable=protected-access
  return pid


def _empty_dir(path):
  """Removes everything inside `path` (a directory the job could write)."""
  try:
    entries = list(os.scandir(path))
  except OSError:
    return
  for entry in entries:
    try:
      if entry.is_dir(follow_symlinks=False):
        _remove_tree(entry.path)
      else:
        os.unlink(entry.path)
    except OSError:
      pass


def _mount_table():
  try:
    with open("/proc/self/mountinfo", "rb") as f:
      return f.read()
  except OSError:
    return b""


# Long by design: one job's lifecycle in the server (fork, watch the wall clock, read the report,
# kill and reap every process of the job, empty its views) in the order the kernel needs.
def _run_job(job, root, counter, uid, allow_fork, ns_init, hook_args, views):
  """Forks, supervises and cleans up one job; returns the RESULT frame."""
  import select  # pylint: disable=g-import-not-at-top
  import signal  # pylint: disable=g-import-not-at-top
  import time  # pylint: disable=g-import-not-at-top
  del allow_fork  # Enforced by the audit hook (hook_args).
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
  pipes = [out_r, out_w, rep_r, rep_w]
  pids = []
  try:
    if job["script_test"] is not None:
      call_r, call_w = os.pipe2(os.O_CLOEXEC)
      reply_r, reply_w = os.pipe2(os.O_CLOEXEC)
      pipes += [call_r, call_w, reply_r, reply_w]
      pids.append(_fork_child(_candidate_main, job, workdir, out_w, rep_w, uid, hook_args,
                              (call_r, reply_w), (out_r, rep_r, call_w, reply_r)))
      pids.append(_fork_child(_check_main, job, workdir, out_w, rep_w, uid, hook_args,
                              (reply_r, call_w), (out_r, rep_r, call_r, reply_w)))
      for fd in (call_r, call_w, reply_r, reply_w):
        os.close(fd)
        pipes.remove(fd)
    else:
      pids.append(_fork_child(_candidate_main, job, workdir, out_w, rep_w, uid, hook_args,
                              None, (out_r, rep_r)))
  except OSError as e:
    for fd in pipes:
      os.close(fd)
    for p in pids:
      _kill_all(p, uid, ns_init)
      os.waitpid(p, 0)
    _remove_tree(workdir)
    message = _hex("fork failed: %s" % e).decode()
    return "RESULT 0 0.0 %s 0 0 0 %s %%d\n" % (REASON_SPAWN, message), b""
  os.close(out_w)
  os.close(rep_w)
  limits = job["limits"]
  wall, out_cap, rep_cap = limits["wall"], limits["output"], limits["report"]
  deadline = start + wall
  pidfds = {}
  for p in pids:
    try:
      pidfds[os.pidfd_open(p)] = p
    except (AttributeError, OSError):
      pass
  poller = select.poll()
  for fd in (out_r, rep_r):
    os.set_blocking(fd, False)
    poller.register(fd, select.POLLIN)
  for fd in pidfds:
    poller.register(fd, select.POLLIN)
  poller.register(0, select.POLLIN)  # End of input: the parent has gone.
  tail = bytearray()
  report = bytearray()
  out_total = 0
  reason = REASON_NONE
  open_fds = {out_r, rep_r}
  running = set(pids)
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

  while running:
    timeout = deadline - time.monotonic()
    if timeout <= 0:
      reason = reason if reason != REASON_NONE else REASON_DEADLINE
      break
    polled = len(pidfds) == len(pids)
    events = poller.poll(min(timeout, timeout if polled else 0.05) * 1000)
    for fd, _ in events:
      if fd in open_fds:
        if not drain(fd):
          poller.unregister(fd)
          open_fds.discard(fd)
      elif fd in pidfds:
        running.discard(pidfds[fd])
        poller.unregister(fd)
      elif fd == 0:
        parent_gone = True
        poller.unregister(0)
    if not polled:
      for p in list(running):
        try:
          if os.waitid(os.P_PID, p, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
            running.discard(p)
        except ChildProcessError:
          running.discard(p)
    if reason != REASON_NONE or parent_gone:
      break
  # The job processes are not reaped yet, so their process group ids are still ours.
  for p in pids[1:]:
    try:
      os.killpg(p, signal.SIGKILL)
    except OSError:
      pass
  _kill_all(pids[0], uid, ns_init)  # Its sweep (namespace or uid) reaches the check child too.
  statuses = [os.wait4(p, 0)[1:] for p in pids]
  if ns_init:
    _reap_all(2.0)
  for fd in pidfds:
    os.close(fd)
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
  for view in views:
    _empty_dir(view)
  status, usage = statuses[0]
  cpu = usage.ru_utime + usage.ru_stime
  if reason == REASON_NONE:
    for st, us in statuses:
      used = us.ru_utime + us.ru_stime
      if os.WIFSIGNALED(st) and (os.WTERMSIG(st) == signal.SIGXCPU or (
          os.WTERMSIG(st) == signal.SIGKILL and used >= 0.5 * limits["cpu"])):
        reason = REASON_CPU
  tail_bytes = bytes(tail[-TAIL_BYTES:])
  header = "RESULT %d %.6f %s %d %d %d - %%d\n" % (
      status, cpu, reason, out_total, len(tail_bytes), len(report))
  return header, tail_bytes + bytes(report)


# Long by design: one stdin/stdout test's lifecycle (fork, feed stdin, drain stdout under the output
# cap and the wall clock, classify the exit), in the order the pipes need.
def _run_stdio_test(job, data, workdir, uid, ns_init, hook_args, job_deadline=None):
  """Runs the program once on `data` (bytes on stdin); returns the test's dict.

  The test ends at its own wall-clock limit or at `job_deadline` (monotonic
  seconds; None: none), whichever comes first (reason `deadline` or `budget`).
  Keys: status (wait status), cpu (seconds), wall (seconds), maxrss (KiB),
  reason (a REASON_*), stdout (bytes, at most the output cap), tail (the last
  TAIL_BYTES of stderr), report (the nonce-tagged report lines).
  """
  import select  # pylint: disable=g-import-not-at-top
  import signal  # pylint: disable=g-import-not-at-top
  import time  # pylint: disable=g-import-not-at-top
  start = time.monotonic()
  stdin = os.memfd_create("stdin", os.MFD_CLOEXEC)
  _write_all(stdin, data)
  os.lseek(stdin, 0, os.SEEK_SET)
  out_r, out_w = os.pipe2(os.O_CLOEXEC)
  err_r, err_w = os.pipe2(os.O_CLOEXEC)
  rep_r, rep_w = os.pipe2(os.O_CLOEXEC)
  try:
    pid = _fork_child(_stdio_main, job, workdir, out_w, rep_w, uid, hook_args, (stdin, err_w),
                      (out_r, err_r, rep_r))
  except OSError as e:
    for fd in (stdin, out_r, out_w, err_r, err_w, rep_r, rep_w):
      os.close(fd)
    return {"status": 0, "cpu": 0.0, "wall": 0.0, "maxrss": 0, "reason": REASON_SPAWN,
            "stdout": b"", "tail": _hex("fork failed: %s" % e), "report": b""}
  for fd in (stdin, out_w, err_w, rep_w):
    os.close(fd)
  limits = job["limits"]
  deadline, out_cap, rep_cap = start + limits["wall"], limits["output"], limits["report"]
  expired = REASON_DEADLINE
  if job_deadline is not None and job_deadline < deadline:
    deadline, expired = job_deadline, REASON_BUDGET
  pidfd = os.pidfd_open(pid)
  bufs = {out_r: bytearray(), err_r: bytearray(), rep_r: bytearray()}
  poller = select.poll()
  for fd in bufs:
    os.set_blocking(fd, False)
    poller.register(fd, select.POLLIN)
  poller.register(pidfd, select.POLLIN)
  reason, total, running, open_fds = REASON_NONE, 0, True, set(bufs)

  def drain(fd):
    nonlocal total, reason
    while True:
      try:
        chunk = os.read(fd, 1 << 16)
      except BlockingIOError:
        return True
      if not chunk:
        return False
      buf = bufs[fd]
      if fd == rep_r:
        if len(buf) + len(chunk) > rep_cap:
          reason = REASON_REPORT if reason == REASON_NONE else reason
          return True
        buf.extend(chunk)
        continue
      total += len(chunk)
      if total > out_cap:
        reason = REASON_OUTPUT if reason == REASON_NONE else reason
        return True
      buf.extend(chunk)
      if fd == err_r and len(buf) > 2 * TAIL_BYTES:
        del buf[:-TAIL_BYTES]

  while running and reason == REASON_NONE:
    timeout = deadline - time.monotonic()
    if timeout <= 0:
      reason = expired
      break
    for fd, _ in poller.poll(timeout * 1000):
      if fd == pidfd:
        running = False
      elif fd in open_fds and not drain(fd):
        poller.unregister(fd)
        open_fds.discard(fd)
  _kill_all(pid, uid, ns_init)
  _, status, usage = os.wait4(pid, 0)
  if ns_init:
    _reap_all(2.0)
  os.close(pidfd)
  end = time.monotonic() + 1.0  # Every writer is dead: read what is left (bounded).
  while open_fds and time.monotonic() < end and reason == REASON_NONE:
    for fd, _ in poller.poll(100):
      if fd in open_fds and not drain(fd):
        poller.unregister(fd)
        open_fds.discard(fd)
  for fd in bufs:
    os.close(fd)
  cpu = usage.ru_utime + usage.ru_stime
  if reason == REASON_NONE and os.WIFSIGNALED(status) and (
      os.WTERMSIG(status) == signal.SIGXCPU or (
          os.WTERMSIG(status) == signal.SIGKILL and cpu >= 0.5 * limits["cpu"])):
    reason = REASON_CPU
  return {"status": status, "cpu": cpu, "wall": time.monotonic() - start,
          "maxrss": usage.ru_maxrss, "reason": reason, "stdout": bytes(bufs[out_r]),
          "tail": bytes(bufs[err_r][-TAIL_BYTES:]), "report": bytes(bufs[rep_r])}


def _run_stdio_job(job, root, counter, uid, ns_init, hook_args, views):
  """Runs a stdin/stdout job: the program once per input, each in a fresh
  working directory and fresh views; returns the RESULT frame whose report is
  the `marshal` list of the tests' dicts (`_run_stdio_test`). Stops early after
  an error with `stop_on_error`, and when the `budget` (wall-clock seconds for
  all tests, or None) is spent: the inputs not run get no dict."""
  import time  # pylint: disable=g-import-not-at-top
  budget = job.get("budget")
  job_deadline = None if budget is None else time.monotonic() + budget
  tests = []
  for i, data in enumerate(job["inputs"]):
    if job_deadline is not None and time.monotonic() >= job_deadline:
      break
    workdir = os.path.join(root, "job%d_%d" % (counter, i))
    if os.path.islink(workdir):
      os.unlink(workdir)
    elif os.path.lexists(workdir):
      _remove_tree(workdir)
    os.mkdir(workdir, 0o700)
    if uid >= 0:
      os.chown(workdir, uid, uid)
    try:
      tests.append(_run_stdio_test(job, data, workdir, uid, ns_init, hook_args, job_deadline))
    finally:
      _remove_tree(workdir)
      for view in views:
        _empty_dir(view)
    if job["stop_on_error"] and (tests[-1]["reason"] != REASON_NONE or
                                 tests[-1]["status"] != 0):
      break
  body = marshal.dumps(tests)
  cpu = sum(t["cpu"] for t in tests)
  total = sum(len(t["stdout"]) for t in tests)
  return "RESULT 0 %.6f %s %d 0 %d - %%d\n" % (cpu, REASON_NONE, total, len(body)), body


def _stdlib_roots():
  roots = []
  for p in sys.path:
    if p and os.path.isabs(p):
      roots.append(os.path.realpath(p))
  return roots


# Landlock (Linux >= 5.13): x86_64 and aarch64 share the syscall numbers.
_LANDLOCK_CREATE_RULESET, _LANDLOCK_ADD_RULE, _LANDLOCK_RESTRICT_SELF = 444, 445, 446
_LANDLOCK_RULE_PATH_BENEATH = 1
_LANDLOCK_READ = (1 << 0) | (1 << 2) | (1 << 3)  # execute, read file, read dir
# Every file-system right of each ABI version (1: bits 0-12, 2: REFER, 3: TRUNCATE,
# 5: IOCTL_DEV).
_LANDLOCK_FS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1,
                       4: (1 << 15) - 1, 5: (1 << 16) - 1}


def landlock_abi():
  """The kernel's Landlock ABI version, or 0 where Landlock is unavailable."""
  try:
    import ctypes  # pylint: disable=g-import-not-at-top
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    version = libc.syscall(ctypes.c_long(_LANDLOCK_CREATE_RULESET), None,
                           ctypes.c_size_t(0), ctypes.c_uint32(1))
    return max(0, int(version))
  except (OSError, AttributeError, ImportError):
    return 0


def _apply_landlock(read_paths, write_paths):
  """Confines this process and its future children to the given hierarchies.

  Read paths get execute/read rights, write paths every file-system right;
  the rest of the file system becomes inaccessible. Also denies TCP bind and
  connect (ABI >= 4) and signals to processes outside the domain (ABI >= 6).
  Raises OSError if the kernel refuses.
  """
  import ctypes  # pylint: disable=g-import-not-at-top
  libc = ctypes.CDLL(None, use_errno=True)
  libc.syscall.restype = ctypes.c_long
  abi = landlock_abi()
  if abi < 1:
    raise OSError("Landlock is not available")
  fs_all = _LANDLOCK_FS_BY_ABI[min(abi, 5)]

  class RulesetAttr(ctypes.Structure):
    _fields_ = [("fs", ctypes.c_uint64), ("net", ctypes.c_uint64), ("scoped", ctypes.c_uint64)]

  class PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]

  attr = RulesetAttr(fs_all, 3 if abi >= 4 else 0, 3 if abi >= 6 else 0)
  size = 8 if abi < 4 else (16 if abi < 6 else 24)
  ruleset = libc.syscall(ctypes.c_long(_LANDLOCK_CREATE_RULESET), ctypes.byref(attr),
                         ctypes.c_size_t(size), ctypes.c_uint32(0))
  if ruleset < 0:
    raise OSError(ctypes.get_errno(), "landlock_create_ruleset failed")
  for paths, rights in ((read_paths, _LANDLOCK_READ), (write_paths, fs_all)):
    for path in paths:
      fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
      is_dir = os.path.isdir(path)
      # Files accept only the rights that apply to files.
      rule = PathBeneath(rights if is_dir else rights & ((1 << 0) | (1 << 1) | (1 << 2) |
                                                        (1 << 14) | (1 << 15)), fd)
      rc = libc.syscall(ctypes.c_long(_LANDLOCK_ADD_RULE), ctypes.c_int(ruleset),
                        ctypes.c_int(_LANDLOCK_RULE_PATH_BENEATH), ctypes.byref(rule),
                        ctypes.c_uint32(0))
      os.close(fd)
      if rc < 0:
        raise OSError(ctypes.get_errno(), f"landlock_add_rule({path}) failed")
  if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
    raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
  if libc.syscall(ctypes.c_long(_LANDLOCK_RESTRICT_SELF), ctypes.c_int(ruleset),
                  ctypes.c_uint32(0)) < 0:
    raise OSError(ctypes.get_errno(), "landlock_restrict_self failed")
  os.close(ruleset)


def serve(argv):
  """Entry point of the server; see the module docstring."""
  import argparse  # pylint: disable=g-import-not-at-top
  parser = argparse.ArgumentParser()
  parser.add_argument("--serve", action="store_true")
  parser.add_argument("--root", required=True)
  parser.add_argument("--uid", type=int, default=-1)
  parser.add_argument("--allow-fork", type=int, default=0)
  parser.add_argument("--audit-hook", type=int, default=1)
  parser.add_argument("--view", action="append", default=[])
  parser.add_argument("--landlock-ro", action="append", default=[])  # --landlock-ro=PATH
  parser.add_argument("--landlock-rw", action="append", default=[])  # --landlock-rw=PATH
  parser.add_argument("--tag", default="")
  args = parser.parse_args(argv)
  if args.landlock_rw:
    os.makedirs(args.root, exist_ok=True)
    _apply_landlock(args.landlock_ro, args.landlock_rw)
    # The same command without the Landlock flags (given as `--flag=value`).
    rest = [a for a in argv if not a.startswith("--landlock-")]
    os.execv(sys.executable, [sys.executable, "-S", "-s", "-B", "-P",
                              os.path.abspath(__file__)] + rest)
  for name in PRELOAD:
    try:
      __import__(name)
    except ImportError:
      pass
  for name in ("_posixsubprocess", "ctypes", "_ctypes", "socket", "_socket"):
    sys.modules.pop(name, None)
  ns_init = os.getpid() == 1
  hook_args = None
  if args.audit_hook:
    hook_args = (_stdlib_roots(), bool(args.allow_fork), _getframe_allowlist())
  os.makedirs(args.root, exist_ok=True)
  os.chmod(args.root, 0o711)
  mounts = _mount_table()
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
    if job.get("kind") == "stdio":
      header, body = _run_stdio_job(job, args.root, counter, args.uid, ns_init, hook_args,
                                    args.view)
    else:
      header, body = _run_job(job, args.root, counter, args.uid, bool(args.allow_fork),
                              ns_init, hook_args, args.view)
    # A job that changed the mount table (possible only with capabilities in a
    # user namespace) must not leave its mounts to the next job: retire.
    retire = _mount_table() != mounts
    _write_all(1, (header % retire).encode() + body)
    if retire:
      break
  os._exit(0)  # pylint: disable=protected-access


if __name__ == "__main__":
  serve(sys.argv[1:])
