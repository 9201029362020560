r"""Exports a trained run's policy as a Hugging Face checkpoint directory.

  python -m launch.export --workdir=WORKDIR --step=N --out=DIR [--master]

Reads the run's `config.json` and its Orbax checkpoint `N` (the newest intact
one with `--step=-1`), and writes `DIR` (`agentic_grpo.exporting.export_run`) as
`models.hf_export.export_hf` does:
safetensors in the parameters' dtype (`--master`: the learner's float32 master
copy of bf16 parameters, in float32), `config.json`, and, for a run started
from a Hugging Face checkpoint (`config.model.source='hf'`), its tokenizer
files and `generation_config.json`; a preset run (byte tokenizer) gets a
`generation_config.json` with the byte tokenizer's eos id and no tokenizer
files. The files are those `save_pretrained` writes; that
`AutoModelForCausalLM.from_pretrained(DIR)` loads them and computes our logits is
checked by `tests/fixtures/check_hf_export.py`.

Exit codes (`agentic_grpo/exit_codes.py`): 0 done, 74 no intact checkpoint (or not step N),
78 an input mistake (one line naming it and the fix): a bad flag, a missing workdir or one
without config.json, an output directory that exists and is not empty, a run whose model
source no longer opens; 1 a crash (a bug, with its traceback). The classification is
`agentic_grpo/errors.py`'s, shared by every entry point.
"""

from absl import app
from absl import flags

from agentic_grpo import exit_codes
from agentic_grpo import exporting
from launch import common_flags

_WORKDIR = common_flags.WORKDIR
_STEP = common_flags.STEP
flags.declare_key_flag("workdir")  # listed by --help, not only --helpfull
flags.declare_key_flag("step")
_OUT = flags.DEFINE_string("out", None, "Directory to write (must not exist or be empty).")
_MASTER = flags.DEFINE_bool(
    "master", False, "Write the learner's float32 master copy of low-precision (e.g. bf16) "
    "parameters, in float32, instead of the parameters in their dtype.")


def _main(held: common_flags.HeldLogs):
  if not _WORKDIR.value or not _OUT.value:
    common_flags.fail(exit_codes.CONFIG_ERROR, "--workdir and --out are required")
  common_flags.quiet_orbax()
  out = exporting.export_run(_WORKDIR.value, _OUT.value, _STEP.value, master=_MASTER.value,
                             on_start=held.release)
  print(out)


# Input mistakes and refusals: one line and their exit code; the startup's logs held until
# its checks pass (`common_flags.entry_point`).
main = common_flags.entry_point(_main)


if __name__ == "__main__":
  app.run(main, flags_parser=common_flags.parse_flags)
