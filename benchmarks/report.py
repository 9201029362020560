"""What every benchmark reports: a printed table and one JSON line in the results file.

The JSON line carries the machine (CPU model, cores, accelerator), the load average before and
after the benchmark (a shared machine makes absolute numbers noisy: ratios measured interleaved
are the headline), package versions, the UTC date, the benchmark's name, its settings and rows.
"""

import datetime
import importlib.metadata
import json
import os
import pathlib
import platform
import sys
from typing import Any, Mapping, Sequence

RESULTS = pathlib.Path(__file__).resolve().parent / "results.jsonl"
_PACKAGES = ("jax", "jaxlib", "flax", "optax", "numpy")


def _cpu_model() -> str:
  try:
    for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
      if line.startswith("model name"):
        return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or platform.machine()


def _versions(extra: Mapping[str, str]) -> dict[str, str]:
  out = {}
  for name in _PACKAGES:
    try:
      out[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      pass
  out.update(extra)
  return out


def machine() -> dict[str, Any]:
  """CPU model, core count, platform, and the JAX backend's devices where JAX is in use."""
  info = {"cpu": _cpu_model(), "cores": os.cpu_count(), "platform": platform.platform(),
          "python": platform.python_version()}
  if "jax" not in sys.modules:  # a benchmark without JAX (the sandbox forks: keep it threadless)
    return info
  try:
    import jax  # pylint: disable=g-import-not-at-top
    devices = jax.devices()
    info["jax_backend"] = jax.default_backend()
    info["devices"] = f"{len(devices)} x {devices[0].device_kind}"
  except Exception as e:  # pylint: disable=broad-except
    info["jax_backend"] = f"unavailable: {e}"
  return info


def load_average() -> list[float]:
  """1, 5 and 15 minute load averages (empty where the OS has none)."""
  try:
    return [round(x, 2) for x in os.getloadavg()]
  except OSError:
    return []


def table(title: str, header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
  """A Markdown table (what docs/benchmarks.md holds), floats to 3 significant digits."""
  def cell(x):
    if isinstance(x, float):
      return f"{x:.3g}" if abs(x) < 1e4 else f"{x:,.0f}"
    return str(x)

  lines = [f"### {title}", "", "| " + " | ".join(header) + " |",
           "|" + "---|" * len(header)]
  lines += ["| " + " | ".join(cell(x) for x in row) + " |" for row in rows]
  return "\n".join(lines)


def record(name: str, *, settings: Mapping[str, Any], header: Sequence[str],
           rows: Sequence[Sequence[Any]], summary: Mapping[str, Any], load_before: Sequence[float],
           versions: Mapping[str, str] = (), results: pathlib.Path | None = None,
           quiet: bool = False) -> dict[str, Any]:
  """Prints the table and appends the JSON line; returns the line as a dict.

  Args:
    name: the benchmark (`update_flops`, `grpo_step`, ...).
    settings: shapes and options it ran with.
    header, rows: the table.
    summary: headline numbers (ratios first).
    load_before: `load_average()` taken when the benchmark started.
    versions: peer packages' versions (e.g. `{"google-tunix": "0.1.7"}`), added to ours.
    results: the JSON-lines file appended to (default: the module's `RESULTS`).
    quiet: do not print.
  """
  line = {
      "benchmark": name,
      "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
      "machine": machine(),
      "load_average": {"before": list(load_before), "after": load_average()},
      "versions": _versions(dict(versions)),
      "settings": dict(settings),
      "summary": dict(summary),
      "header": list(header),
      "rows": [list(r) for r in rows],
  }
  if not quiet:
    print()
    print(table(f"{name} ({line['date']}, load {line['load_average']['before']} -> "
                f"{line['load_average']['after']})", header, rows))
    print("summary:", json.dumps(line["summary"]))
  results = pathlib.Path(results or RESULTS)
  results.parent.mkdir(parents=True, exist_ok=True)
  with open(results, "a", encoding="utf-8") as f:
    f.write(json.dumps(line, default=str) + "\n")
  return line
