"""What went wrong, classified once for every entry point (`launch/*.py`).

Two kinds of failure reach an entry point:

* **Reported errors**: an exception whose class carries an `exit_code` (`exit_codes`). The
  entry point prints its message as one line (`error: ...` on stderr) and exits with that
  code; no traceback. `InputError` is the input mistake: a config field, a flag, a file or a
  directory the user gave that cannot work (a missing data file or model directory, a
  checkpoint without `tokenizer.json` or of an unsupported architecture, a data file whose rows
  are not of the layout asked for, an empty held-out split, a context too short for
  `rl.buckets`); its message names the field and the fix, and its code is
  `exit_codes.CONFIG_ERROR`. The other reported errors are refusals and ends of a run that a
  scheduler acts on (config drift, a held workdir, damaged or missing checkpoints, preemption,
  no progress); each class sets its own code.
* **Bugs**: any other exception. It propagates: Python prints the traceback and the process
  exits with `exit_codes.CRASH`, never with the code of an input mistake.

`code_of(error)` is the classification; `launch.common_flags.reported_errors` applies it.
"""

from typing import Optional

from agentic_grpo import exit_codes


class InputError(ValueError):
  """An input mistake (module docstring): exit code `exit_codes.CONFIG_ERROR`, one line.

  A `ValueError`, so that code catching `ValueError` for a bad argument keeps working.
  """
  exit_code = exit_codes.CONFIG_ERROR


def code_of(error: BaseException) -> Optional[int]:
  """The exit code an entry point reports `error` with, or None for a bug (a traceback).

  The code is the `exit_code` attribute of the error's class (inherited, e.g. by every
  subclass of `InputError`).
  """
  code = getattr(type(error), "exit_code", None)
  return code if isinstance(code, int) and not isinstance(code, bool) else None


def one_line(error: BaseException) -> str:
  """`str(error)` on one line (line breaks and runs of spaces folded to one space)."""
  return " ".join(str(error).split()) or type(error).__name__
