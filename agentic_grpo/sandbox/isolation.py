"""What isolation a sandbox worker gets: probing, the plan, and per-worker uids.

Three levels, strongest first (`ISOLATION_LEVELS` lists them weakest first):

* `namespaces`: each worker is PID 1 of new PID, network, mount, IPC and UTS
  namespaces (plus a user namespace when not root), made by util-linux
  `unshare`. Its root is a minimal read-only view built by `_MOUNT_SCRIPT` and
  entered with `pivot_root`: the interpreter, its standard library (its
  site-packages covered by an empty directory), the shared libraries it maps,
  `/etc/ld.so.cache`, `/dev/{null,zero,random,urandom}`, the runner file,
  `/proc` of the new PID namespace, and tmpfs mounts for the working
  directories (`/jobs`), `/tmp`, `/var/tmp`, `/dev/shm` and `/run`, which the
  server empties after every job. Nothing else of the host (the checkout, the
  workdir, home directories, datasets) exists there.
* `landlock`: no namespaces, but the kernel confines each worker (Landlock)
  to the same read-only paths plus its own job directory, read-write; TCP and
  signals to outside processes are denied where the kernel's ABI allows.
* `hook`: the PEP 578 audit hook of the runner and the rlimits only (best
  effort; `fork` is refused unless the process count is bounded per sandbox).

The audit hook is installed at every level (defence in depth). The plan is
probed once per `Isolation` value and logged with a warning when it is weaker
than `namespaces`; `Isolation.min_level` makes a weaker machine an error.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import struct
import subprocess
import sys
import threading

from absl import logging

from agentic_grpo.sandbox import runner
from agentic_grpo.sandbox import types

RUNNER_PATH = os.path.abspath(runner.__file__)
ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "PYTHONHASHSEED": "0",
    "PYTHONIOENCODING": "utf-8",
    "PYTHONDONTWRITEBYTECODE": "1",
}
MAX_SLOTS = 1024
# Paths of the view, inside the worker's mount namespace.
JOBS_DIR = "/jobs"
VIEW_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run")
VIEW_RUNNER = "/sandbox/runner.py"
# Run by /bin/sh as PID 1 of the new namespaces, before the server starts.
# $1: new root (an empty host directory), $2: size of /jobs and /tmp, $3: size
# of the other writable directories, $4: the runner file; then entries up to
# `--` (B:<path> bind read-only, L:<path>:<target> symbolic link, E:<path>
# empty read-only directory over <path>); then the server's command.
_MOUNT_SCRIPT = """\
set -e
R=$1; BIG=$2; SMALL=$3; RUNNER=$4; shift 4
PATH=/usr/local/sbin:/usr/sbin:/sbin:$PATH
M=$(command -v mount); U=$(command -v umount)
mount --make-rprivate /
mount -t tmpfs -o size=1m,mode=0755,nosuid,nodev agentic-sandbox-root "$R"
while [ "$1" != "--" ]; do
  case "$1" in
    B:*) p=${1#B:}
      if [ -d "$p" ]; then mkdir -p "$R$p"; else mkdir -p "$R${p%/*}"; : > "$R$p"; fi
      mount --bind "$p" "$R$p"; mount -o remount,bind,ro,nosuid,nodev "$R$p" ;;
    L:*) e=${1#L:}; p=${e%%:*}; mkdir -p "$R${p%/*}"; ln -s "${e#*:}" "$R$p" ;;
    E:*) p=${1#E:}; mount -t tmpfs -o size=4k,mode=0555,ro agentic-sandbox-empty "$R$p" ;;
  esac
  shift
done
shift
mkdir -p "$R/dev/shm" "$R/proc" "$R/jobs" "$R/tmp" "$R/var/tmp" "$R/run" "$R/sandbox" "$R/.old"
for d in null zero random urandom; do : > "$R/dev/$d"; mount --bind "/dev/$d" "$R/dev/$d"; done
: > "$R/sandbox/runner.py"
mount --bind "$RUNNER" "$R/sandbox/runner.py"
mount -o remount,bind,ro "$R/sandbox/runner.py"
mount -t proc -o nosuid,nodev,noexec proc "$R/proc"
mount -t tmpfs -o "size=$BIG,mode=0711,nosuid,nodev,noexec" agentic-sandbox "$R/jobs"
mount -t tmpfs -o "size=$BIG,mode=1777,nosuid,nodev,noexec" agentic-sandbox "$R/tmp"
for d in var/tmp dev/shm run; do
  mount -t tmpfs -o "size=$SMALL,mode=1777,nosuid,nodev,noexec" agentic-sandbox "$R/$d"
done
cd "$R"
pivot_root . .old
cd /
"/.old$M" -o remount,bind,ro /
"/.old$U" -l /.old
exec "$@"
"""


@dataclasses.dataclass(frozen=True)
class Plan:
  """The isolation a pool's workers get (decided once per `Isolation`)."""
  level: str                 # one of types.ISOLATION_LEVELS
  prefix: tuple[str, ...]    # unshare + mount script command prefix (namespaces)
  user_namespace: bool
  drop_privileges: bool
  allow_fork: bool
  audit_hook: bool
  python: str                # interpreter, as a real path
  view: tuple[str, ...]      # the read-only paths programs see (namespaces, landlock)
  mount_entries: tuple[str, ...]  # `_MOUNT_SCRIPT` entries building the view

  @property
  def namespaces(self) -> bool:
    return self.level == "namespaces"


_PLANS: dict[types.Isolation, Plan] = {}
_PLANS_LOCK = threading.Lock()

# Imported by the probe so that the libraries of commonly used extension
# modules are part of the view.
_PROBE_MODULES = runner.PRELOAD + ("zlib", "bz2", "lzma", "sqlite3", "csv", "uuid",
                                   "xml.etree.ElementTree", "pickle", "locale", "ssl")
_PROBE = """\
import json, os, sys
for m in sys.argv[1].split(","):
  try:
    __import__(m)
  except Exception:
    pass
maps = set()
for line in open("/proc/self/maps"):
  parts = line.split(None, 5)
  if len(parts) == 6 and parts[5].startswith("/"):
    maps.add(parts[5].strip())
print(json.dumps({"path": sys.path, "maps": sorted(maps), "exe": os.path.realpath(sys.executable),
                  "stdlib": os.path.dirname(os.__file__)}))
"""


def _run(cmd, **kwargs) -> subprocess.CompletedProcess | None:
  try:
    return subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, env=ENV,
                          timeout=30, check=False, **kwargs)
  except (OSError, subprocess.SubprocessError):
    return None


def _elf_interpreter(path: str) -> str | None:
  """PT_INTERP of a 64-bit little-endian ELF file (the dynamic loader), or None."""
  try:
    with open(path, "rb") as f:
      head = f.read(64)
      if head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
        return None
      phoff, = struct.unpack_from("<Q", head, 32)
      phentsize, phnum = struct.unpack_from("<HH", head, 54)
      for i in range(phnum):
        f.seek(phoff + i * phentsize)
        p_type, _, p_offset, _, _, p_filesz = struct.unpack("<IIQQQQ", f.read(40))
        if p_type == 3:
          f.seek(p_offset)
          return f.read(p_filesz).rstrip(b"\x00").decode()
  except (OSError, struct.error, UnicodeDecodeError):
    return None
  return None


def _symlinks_along(path: str) -> list[tuple[str, str]]:
  """(link, target) for every symbolic link met while resolving `path`."""
  links: list[tuple[str, str]] = []
  parts, done = path.strip("/").split("/"), ""
  while parts:
    part = parts.pop(0)
    if part in ("", "."):
      continue
    if part == "..":
      done = done.rsplit("/", 1)[0]
      continue
    cand = done + "/" + part
    if os.path.islink(cand) and len(links) < 40:
      target = os.readlink(cand)
      links.append((cand, target))
      parts = target.strip("/").split("/") + parts
      if target.startswith("/"):
        done = ""
      continue
    done = cand
  return links


def _view_entries(python: str) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
  """(mount-script entries, read-only paths) of the minimal view, or None.

  Probes `python -S -s` for its standard library and the shared libraries it
  maps after importing common modules.
  """
  done = _run([python, "-S", "-s", "-B", "-P", "-c", _PROBE, ",".join(_PROBE_MODULES)])
  if done is None or done.returncode != 0:
    return None
  info = json.loads(done.stdout)
  stdlib = os.path.realpath(info["stdlib"])
  roots = {os.path.realpath(p) for p in info["path"] if p and os.path.isabs(p)
           and os.path.exists(p)}
  roots.add(stdlib)
  binds = set(roots) | {info["exe"]}
  for lib in info["maps"]:
    if not os.path.exists(lib) or any(lib.startswith(r + "/") for r in roots):
      continue
    # Libraries of the Python installation one by one; system ones by directory.
    prefix = os.path.realpath(sys.base_prefix)
    binds.add(lib if lib.startswith(prefix + "/") else os.path.dirname(lib))
  if os.path.exists("/etc/ld.so.cache"):
    binds.add("/etc/ld.so.cache")
  links = []
  interp = _elf_interpreter(info["exe"])
  for p in ([interp] if interp else []) + sorted(info["maps"]):
    # The loader finds system libraries under /lib as well as /usr/lib.
    for q in [p, "/lib" + p[len("/usr/lib"):]] if p.startswith("/usr/lib/") else [p]:
      if os.path.lexists(q):
        links += _symlinks_along(q)
  # Keep only outermost binds (a bind inside another would hide nothing new).
  ordered = sorted(binds)
  kept = [b for b in ordered if not any(b.startswith(o + "/") for o in ordered if o != b)]
  entries = ["B:" + b for b in kept]
  entries += sorted({f"L:{link}:{target}" for link, target in links
                     if not any(link == b or link.startswith(b + "/") for b in kept)})
  site = os.path.join(stdlib, "site-packages")
  if os.path.isdir(site):
    entries.append("E:" + site)
  return tuple(entries), tuple(kept)


def _make_plan(isolation: types.Isolation) -> Plan:
  """Decides (and probes once) what isolation this machine supports."""
  python = os.path.realpath(isolation.python or sys.executable)
  root = os.geteuid() == 0
  prefix: tuple[str, ...] = ()
  level = "hook"
  view_entries = _view_entries(python)
  view = view_entries[1] if view_entries else ()
  unshare = shutil.which("unshare", path=ENV["PATH"])
  if isolation.namespaces is not False and unshare and view_entries:
    base = (unshare, "--fork", "--pid", "--kill-child", "--net", "--ipc", "--uts", "--mount")
    if not root:
      base += ("--user", "--map-root-user")
    prefix = base + ("/bin/sh", "-c", _MOUNT_SCRIPT, "sandbox-init")
    probe_root = _probe_dir()
    try:
      probe = _run(prefix + (probe_root, "1m", "1m", RUNNER_PATH) + view_entries[0] +
                   ("--", python, "-S", "-s", "-B", "-P", "-c",
                    f"import os; assert not os.path.exists({RUNNER_PATH!r})"))
    finally:
      os.rmdir(probe_root)
    if probe is not None and probe.returncode == 0:
      level = "namespaces"
    else:
      prefix = ()
      logging.warning("sandbox: cannot create namespaces with a minimal root: %s",
                      probe.stderr.decode(errors="replace")[-500:] if probe else "no unshare")
  if level == "hook" and isolation.landlock is not False and view and runner.landlock_abi() > 0:
    level = "landlock"
  if types.ISOLATION_LEVELS.index(level) < types.ISOLATION_LEVELS.index(isolation.min_level):
    raise RuntimeError(f"sandbox isolation {level!r} is below Isolation.min_level "
                       f"{isolation.min_level!r} on this machine")
  if isolation.namespaces and level != "namespaces":
    raise RuntimeError("Isolation(namespaces=True) but namespaces are unavailable here")
  if isolation.landlock and level == "hook":
    raise RuntimeError("Isolation(landlock=True) but Landlock is unavailable here")
  if not isolation.audit_hook and level == "hook":
    raise RuntimeError("Isolation(audit_hook=False) needs namespaces or Landlock")
  user_ns = level == "namespaces" and not root
  drop = isolation.drop_privileges
  if drop is None:
    drop = root
  elif drop and not root:
    raise RuntimeError("Isolation(drop_privileges=True) needs the trainer to run as root")
  plan = Plan(level=level, prefix=prefix, user_namespace=user_ns, drop_privileges=drop,
              allow_fork=drop or user_ns, audit_hook=isolation.audit_hook, python=python,
              view=view, mount_entries=view_entries[0] if view_entries else ())
  log = logging.info if level == "namespaces" else logging.warning
  log("sandbox isolation level in force: %s (levels: %s; drop privileges: %s, fork: %s)",
      level, ", ".join(types.ISOLATION_LEVELS), drop, plan.allow_fork)
  return plan


def _probe_dir() -> str:
  import tempfile  # pylint: disable=g-import-not-at-top
  path = tempfile.mkdtemp(prefix="agentic-grpo-sandbox-probe-")
  os.chmod(path, 0o755)
  return path


def plan_for(isolation: types.Isolation) -> Plan:
  """The (cached) plan for `isolation`; raises RuntimeError if it cannot be met."""
  with _PLANS_LOCK:
    if isolation not in _PLANS:
      _PLANS[isolation] = _make_plan(isolation)
    return _PLANS[isolation]


def server_command(plan: Plan, isolation_disk: int, new_root: str, job_root: str, uid: int,
                   tag: str) -> list[str]:
  """The command that starts one worker's server under `plan`.

  `new_root`: an empty host directory (namespaces: the view is mounted on it);
  `job_root`: the host directory of the working directories (other levels).
  """
  common = ["--uid", str(uid), "--allow-fork", str(int(plan.allow_fork)),
            "--audit-hook", str(int(plan.audit_hook)), "--tag", tag]
  if plan.namespaces:
    small = max(2**20, isolation_disk // 8)
    return (list(plan.prefix) + [new_root, str(isolation_disk), str(small), RUNNER_PATH] +
            list(plan.mount_entries) + ["--", plan.python, "-S", "-s", "-B", "-P",
                                                    VIEW_RUNNER, "--serve", "--root", JOBS_DIR] +
            [f"--view={d}" for d in (JOBS_DIR,) + VIEW_DIRS] + common)
  cmd = [plan.python, "-S", "-s", "-B", "-P", RUNNER_PATH, "--serve", "--root", job_root,
         f"--view={job_root}"] + common
  if plan.level == "landlock":
    for p in plan.view + (RUNNER_PATH, "/dev/null", "/dev/zero", "/dev/urandom", "/dev/random"):
      cmd.append(f"--landlock-ro={p}")
    cmd.append(f"--landlock-rw={job_root}")
  return cmd


# ------------------------------------------------------------ uid slots
_SLOTS_LOCK = threading.Lock()
_FREE_SLOTS: list[int] = []
_NEXT_SLOT = [0]


def acquire_slot() -> int:
  """A worker slot number unique in this process (raises RuntimeError past MAX_SLOTS)."""
  with _SLOTS_LOCK:
    if _FREE_SLOTS:
      return _FREE_SLOTS.pop()
    if _NEXT_SLOT[0] >= MAX_SLOTS:
      raise RuntimeError(f"more than {MAX_SLOTS} sandbox workers in one process")
    _NEXT_SLOT[0] += 1
    return _NEXT_SLOT[0] - 1


def release_slot(slot: int):
  with _SLOTS_LOCK:
    _FREE_SLOTS.append(slot)


def slot_uid(slot: int) -> int:
  """The sandbox uid of a slot.

  Distinct per (process, worker) so that concurrent trainers or test
  processes on one machine never share a sandbox uid (RLIMIT_NPROC counts per
  uid, and cleanup may kill every process of the uid).
  """
  return 0x40000000 + ((os.getpid() & 0xFFFFF) << 10) + slot
