r"""Exports a trained run's policy as a Hugging Face checkpoint directory.

  python -m launch.export --workdir=WORKDIR --step=N --out=DIR

Reads the run's `config.json` and its Orbax checkpoint `N` (the newest intact
one with `--step=-1`), and writes `DIR` as `models.hf_export.export_hf` does:
safetensors in the parameters' dtype, `config.json`, and, for a run started
from a Hugging Face checkpoint (`config.model.source='hf'`), its tokenizer
files and `generation_config.json`; a preset run (byte tokenizer) gets a
`generation_config.json` with the byte tokenizer's eos id and no tokenizer
files. The files are those `save_pretrained` writes; that
`AutoModelForCausalLM.from_pretrained(DIR)` loads them and computes our logits is
checked by `tests/fixtures/check_hf_export.py`.

Exit codes: 0 done, 1 a crash, 74 no intact checkpoint (or not step N),
78 a bad flag or an output directory that exists and is not empty.
"""

import json
import os
import sys

from absl import app
from absl import flags
import jax

from agentic_grpo import checkpointing
from agentic_grpo import config as config_lib
from agentic_grpo import exit_codes
from agentic_grpo import learner
from agentic_grpo import parallel
from agentic_grpo.models import hf_export
from agentic_grpo.models import sources

_WORKDIR = flags.DEFINE_string("workdir", None, "The run's workdir (holds config.json).")
_STEP = flags.DEFINE_integer("step", -1, "Checkpoint step to export; -1: the newest intact.")
_OUT = flags.DEFINE_string("out", None, "Directory to write (must not exist or be empty).")


def restore_params(workdir: str, step: int = -1):
  """`(cfg, source, step, params)` of a run's checkpoint, parameters in their shardings.

  Args:
    workdir: the run's directory (its `config.json` and `checkpoints/`).
    step: the checkpoint step, or -1 for the newest intact one.

  Raises:
    ValueError: no config.json in `workdir`, or an invalid one.
    FileNotFoundError: no checkpoint.
    checkpointing.CheckpointIntegrityError: a damaged checkpoint.
  """
  file = os.path.join(workdir, "config.json")
  if not os.path.isfile(file):
    raise ValueError(f"no config.json in workdir {workdir!r}")
  with open(file, encoding="utf-8") as f:
    cfg = config_lib.from_config_dict(json.load(f))
  source = sources.open_model(
      cfg.model, min_seq_len=cfg.rl.buckets[-1] + cfg.workflow.max_new_tokens)
  ckpt = checkpointing.Checkpointer(os.path.join(workdir, "checkpoints"))
  chosen = None if step < 0 else step
  meta = ckpt.read_meta(chosen)
  with_ref = cfg.loss.kl_beta > 0 and meta["phase"] == "rl"
  mesh = parallel.make_mesh(cfg)
  # Every optimizer of a run (warm-start, RL) has this state structure.
  optimizer = learner.make_optimizer(cfg.optim)
  sm, sh = learner.learner_shardings(source.model_config, mesh, optimizer, cfg.mesh.rules(),
                                     with_reference=with_ref)
  plain = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), sm.abstract_params)
  state = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                       jax.eval_shape(lambda p: learner.init_state(p, optimizer, 0), plain),
                       sh.state)
  abstract = {"state": state, "ref": sm.abstract_params} if with_ref else {"state": state}
  restored, _, meta = ckpt.restore(chosen, abstract)
  return cfg, source, int(meta["step"]), restored["state"].params


def export_run(workdir: str, out_dir: str, step: int = -1) -> str:
  """Writes checkpoint `step` of the run in `workdir` to `out_dir`; returns `out_dir`."""
  if os.path.isdir(out_dir) and os.listdir(out_dir):
    raise ValueError(f"--out {out_dir!r} exists and is not empty")
  _, source, _, params = restore_params(workdir, step)
  tok = source.tokenizer
  generation = None
  if source.local_dir is None:
    generation = hf_export.generation_config([tok.eos_id], pad_id=tok.pad_id, bos_id=tok.bos_id)
  return hf_export.export_hf(out_dir, source.model_config, params, source_dir=source.local_dir,
                             generation=generation)


def main(argv):
  if len(argv) > 1:
    print(f"error: unexpected arguments {argv[1:]}", file=sys.stderr)
    sys.exit(exit_codes.CONFIG_ERROR)
  if not _WORKDIR.value or not _OUT.value:
    print("error: --workdir and --out are required", file=sys.stderr)
    sys.exit(exit_codes.CONFIG_ERROR)
  try:
    out = export_run(_WORKDIR.value, _OUT.value, _STEP.value)
  except ValueError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(exit_codes.CONFIG_ERROR)
  except (FileNotFoundError, checkpointing.CheckpointIntegrityError) as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(exit_codes.CHECKPOINT_DAMAGED)
  print(out)


if __name__ == "__main__":
  app.run(main)
