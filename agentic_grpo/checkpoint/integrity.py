"""Integrity manifests for checkpoint directories: a SHA-256 and a size per file.

Orbax's commit (the rename of a temporary directory) makes a save atomic against a process that
dies while saving, but nothing checks the bytes afterwards: a flipped byte in a data file loads
without complaint (and the next loss is NaN), and a truncated file fails deep inside
TensorStore with a message that points elsewhere. `write_manifest` records every file of a
committed checkpoint step directory in `integrity.json` inside it, written last (to a temporary
name, then moved over any earlier manifest), and `verify` checks a step directory against it.

A step directory without a manifest is *not* intact: it may be a save whose process died between
Orbax's commit and the manifest, or a checkpoint written before manifests existed. An old
checkpoint that is known to be good can be adopted explicitly with `write_manifest` (see
`Checkpointer.adopt`). A damaged step directory is moved out of the way with `set_aside`, which
never overwrites what was set aside before.

Paths are `etils.epath` paths, so local, NFS and `gs://` directories work alike (a `gs://`
manifest costs one read of every file at restore). Where a path is moved, the overwrite
semantics are chosen explicitly: epath's `rename` refuses an existing target on every backend,
its `replace` overwrites one (`os.replace` locally, an overwriting rename on `gs://`).
"""

import dataclasses
import errno
import hashlib
import itertools
import json
from typing import Optional

from etils import epath

MANIFEST = "integrity.json"
_VERSION = 1
_CHUNK = 1 << 22  # bytes read at a time while hashing


@dataclasses.dataclass(frozen=True)
class Problem:
  """Why a step directory is not intact.

  Attributes:
    file: the file's path relative to the step directory (`integrity.json` for a missing or
      unreadable manifest).
    reason: what is wrong, in words (e.g. `size 100 bytes, manifest says 4096`).
  """
  file: str
  reason: str

  def __str__(self) -> str:
    return f"{self.file}: {self.reason}"


def _files(step_dir: epath.Path) -> list[str]:
  """Relative paths of every file under `step_dir` but the manifest, sorted."""
  out, todo = [], [step_dir]
  while todo:  # iterdir, not rglob: `**` is refused on gs:// paths
    for p in todo.pop().iterdir():
      if p.is_dir():
        todo.append(p)
        continue
      rel = str(p.relative_to(step_dir))
      if rel != MANIFEST and not rel.startswith(MANIFEST + "."):
        out.append(rel)
  return sorted(out)


def _sha256(path: epath.Path) -> tuple[str, int]:
  h = hashlib.sha256()
  size = 0
  with path.open("rb") as f:
    while chunk := f.read(_CHUNK):
      h.update(chunk)
      size += len(chunk)
  return h.hexdigest(), size


def write_manifest(step_dir: epath.PathLike) -> dict[str, dict[str, object]]:
  """Hashes every file of the committed `step_dir` and writes `integrity.json` into it.

  Call it once the save is finalised (every process's files written and committed). The
  manifest goes to a temporary name first and then replaces any manifest already there (a
  checkpoint adopted again, or one whose manifest is stale or unreadable), so a reader sees a
  whole manifest, the old or the new, never part of one.

  Returns:
    `{relative path: {"sha256": hex digest, "bytes": size}}`.
  """
  step_dir = epath.Path(step_dir)
  files = {}
  for rel in _files(step_dir):
    digest, size = _sha256(step_dir / rel)
    files[rel] = {"sha256": digest, "bytes": size}
  tmp = step_dir / f"{MANIFEST}.tmp"
  tmp.write_text(json.dumps({"version": _VERSION, "files": files}, indent=1, sort_keys=True))
  # `replace`, not `rename`: epath's rename refuses an existing target on every backend
  # (unlike POSIX rename); replace is os.replace locally, an overwriting rename on gs://.
  tmp.replace(step_dir / MANIFEST)
  return files


def verify(step_dir: epath.PathLike) -> list[Problem]:
  """Checks `step_dir` against its manifest.

  Returns:
    The problems found, empty when the directory is intact: a missing, unreadable or
    malformed manifest; a listed file that is missing, of another size, or of another
    SHA-256; a file not in the manifest.
  """
  step_dir = epath.Path(step_dir)
  path = step_dir / MANIFEST
  if not path.exists():
    return [Problem(MANIFEST, "missing (the save did not finish, or the checkpoint predates "
                              "integrity manifests)")]
  try:
    manifest = json.loads(path.read_text())
    files = manifest["files"]
    listed = {rel: (str(e["sha256"]), int(e["bytes"])) for rel, e in files.items()}
  except (ValueError, KeyError, TypeError, AttributeError) as e:
    return [Problem(MANIFEST, f"unreadable ({type(e).__name__}: {e})")]
  problems = []
  present = set(_files(step_dir))
  for rel, (digest, size) in sorted(listed.items()):
    if rel not in present:
      problems.append(Problem(rel, "missing"))
      continue
    got_digest, got_size = _sha256(step_dir / rel)
    if got_size != size:
      problems.append(Problem(rel, f"size {got_size} bytes, manifest says {size} (truncated?)"))
    elif got_digest != digest:
      problems.append(Problem(rel, "SHA-256 differs from the manifest (bytes changed)"))
  for rel in sorted(present - set(listed)):
    problems.append(Problem(rel, "not in the manifest"))
  return problems


def set_aside(step_dir: epath.PathLike, aside: epath.PathLike, *, stamp: str) -> epath.Path:
  """Moves the (damaged) `step_dir` into the directory `aside` under a free name; never
  overwrites.

  The name is the step directory's own, else `<name>-<stamp>`, else `<name>-<stamp>-<k>` for
  the first free `k` (the same step set aside again with the same stamp). `aside` is created
  if missing.

  Args:
    step_dir: the step directory to move.
    aside: where damaged step directories are kept (e.g. `<checkpoints>-damaged`).
    stamp: a time stamp for names already taken (e.g. `20250101-120000`).

  Returns:
    Where the step directory now is.

  Raises:
    FileExistsError: the chosen name was taken between the check and the move (another
      writer in `aside`); it names both paths, and `step_dir` is left where it was.
  """
  step_dir, aside = epath.Path(step_dir), epath.Path(aside)
  aside.mkdir(parents=True, exist_ok=True)
  name = step_dir.name
  names = itertools.chain([name, f"{name}-{stamp}"],
                          (f"{name}-{stamp}-{k}" for k in itertools.count(1)))
  target = next(aside / n for n in names if not (aside / n).exists())
  try:
    # `rename`, not `replace`: nothing already set aside is overwritten. epath's rename refuses
    # an existing target locally and on gs://; POSIX rename(2) would replace an empty directory.
    step_dir.rename(target)
  except OSError as e:
    if not isinstance(e, FileExistsError) and e.errno not in (errno.EEXIST, errno.ENOTEMPTY):
      raise
    raise FileExistsError(f"cannot set aside damaged checkpoint {step_dir}: {target} was "
                          f"created meanwhile (another writer in {aside}?)") from e
  return target


def describe(step: int, problems: list[Problem], limit: Optional[int] = 5) -> str:
  """One line naming the step and its damaged files (the first `limit` of them)."""
  shown = problems if limit is None else problems[:limit]
  more = len(problems) - len(shown)
  text = "; ".join(str(p) for p in shown) + (f"; and {more} more" if more > 0 else "")
  return f"checkpoint {step}: {text}"
