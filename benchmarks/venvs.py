"""Virtual environments for the benchmarks' peers (Tunix, transformers), created on first use.

Each peer runs in a fresh process of its own environment, so that its dependency pins never meet
ours. An environment lives under `$AGENTIC_GRPO_BENCH_CACHE` (default
`$XDG_CACHE_HOME/agentic_grpo/bench`, else `~/.cache/agentic_grpo/bench`) in a directory named
after the requirements file and a hash of its text: editing the file makes a new environment.
An environment is used only once `pip install` has finished (a `.ready` marker), so an interrupted
install is redone rather than half-used.

`AGENTIC_GRPO_BENCH_PYTHON_<NAME>` (e.g. `..._HF`) names an existing interpreter to use instead.
"""

import hashlib
import os
import pathlib
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent


def cache_dir() -> pathlib.Path:
  """Root of the benchmark caches (virtual environments, downloaded nothing else)."""
  explicit = os.environ.get("AGENTIC_GRPO_BENCH_CACHE")
  if explicit:
    return pathlib.Path(explicit)
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return pathlib.Path(base) / "agentic_grpo" / "bench"


def python_for(name: str, *, log=print) -> str:
  """The interpreter of the `name` peer environment (`requirements-<name>.txt`), built if needed.

  Args:
    name: `tunix` or `hf` (a `requirements-<name>.txt` next to this file).
    log: where progress lines go.

  Returns:
    Path of that environment's `python`.

  Raises:
    ValueError: no such requirements file.
    subprocess.CalledProcessError: `venv` or `pip install` failed (its output was shown).
  """
  override = os.environ.get(f"AGENTIC_GRPO_BENCH_PYTHON_{name.upper()}")
  if override:
    return override
  req = HERE / f"requirements-{name}.txt"
  if not req.is_file():
    raise ValueError(f"no requirements file for peer environment {name!r}: {req}")
  digest = hashlib.sha256(req.read_bytes()).hexdigest()[:10]
  env_dir = cache_dir() / "venvs" / f"{name}-{digest}"
  python = env_dir / "bin" / "python"
  if (env_dir / ".ready").is_file():
    return str(python)
  log(f"[venv] creating {name} environment in {env_dir} (first use; a few minutes)")
  env_dir.parent.mkdir(parents=True, exist_ok=True)
  subprocess.run([sys.executable, "-m", "venv", "--clear", str(env_dir)], check=True)
  subprocess.run([str(python), "-m", "pip", "install", "-q", "-r", str(req)], check=True)
  (env_dir / ".ready").write_text(req.read_text())
  return str(python)


if __name__ == "__main__":
  for arg in sys.argv[1:]:
    print(python_for(arg))
