"""A trained run's policy as a Hugging Face checkpoint directory.

`restore_params(workdir, step)` reads a run's `config.json` and its Orbax checkpoint `step` (the
newest intact one with -1) into the learner's shardings; `export_run(workdir, out_dir, step)`
writes them as `models.hf_export.export_hf` does: safetensors in the parameters' dtype (with
`master=True`, the learner's float32 master copy of low-precision parameters, in float32),
`config.json`, and, for a run started from a Hugging Face checkpoint (`config.model.source='hf'`),
its tokenizer files and `generation_config.json`; a preset run (byte tokenizer) gets a
`generation_config.json` with the byte tokenizer's eos id and no tokenizer files. Command line:
`python -m launch.export`.
"""

import dataclasses
import json
import os
from typing import Callable, Optional

from absl import logging
import jax.numpy as jnp

from agentic_grpo import config as config_lib
from agentic_grpo import errors
from agentic_grpo import learner
from agentic_grpo import parallel
from agentic_grpo.checkpoint import checkpointer
from agentic_grpo.models import hf_export
from agentic_grpo.models import sources


def restore_params(workdir: str, step: int = -1, *, master: bool = False):
  """`(cfg, source, step, params)` of a run's checkpoint, parameters in their shardings.

  Only that one field of the learner state is read (`Checkpointer.restore(only=...)`): the
  optimizer's moments and the KL reference stay on disk. This is the call that loads a run's
  checkpoint into a model:

    cfg, source, step, params = exporting.restore_params("workdirs/my-run")
    graphdef, _ = transformer.abstract_model(source.model_config)
    ids = source.tokenizer.encode("def add(a, b):")
    tokens = jnp.asarray([ids], jnp.int32)                       # [1, T]
    positions = jnp.arange(len(ids), dtype=jnp.int32)[None]      # [1, T]
    logits, _ = transformer.apply(graphdef, params, tokens, positions)  # [1, T, V] float32

  Args:
    workdir: the run's directory (its `config.json` and `checkpoints/`).
    step: the checkpoint step, or -1 for the newest intact one.
    master: read the learner's float32 master copy (`TrainState.master`, kept when the
      parameters are stored in a lower precision) instead of the parameters; for float32
      parameters, which have no master, the parameters themselves.

  Returns:
    `cfg` (the run's `config.TrainConfig`), `source` (its `models.sources.ModelSource`:
    `model_config`, `tokenizer`, `local_dir`), `step` (the checkpoint's global step), and
    `params` (an `nnx.State` of `jax.Array`s in the run's shardings over this machine's
    devices, in `model_config.param_dtype`, or float32 with `master`).

  Raises:
    errors.InputError (a ValueError): no `workdir`, no config.json in it, or an invalid one;
      a model source that no longer opens (`models.sources.open_model`).
    checkpointer.MissingCheckpointError (a FileNotFoundError): no checkpoint, or none at
      `step`.
    checkpointer.CheckpointIntegrityError: a damaged checkpoint.
  """
  file = os.path.join(workdir, "config.json")
  if not os.path.isfile(file):
    what = "does not exist" if not os.path.isdir(workdir) else "has no config.json"
    raise errors.InputError(f"workdir {workdir!r} {what}: not a run's workdir (--workdir)")
  with open(file, encoding="utf-8") as f:
    cfg = config_lib.from_config_dict(json.load(f))
  source = sources.open_model(
      cfg.model, min_seq_len=cfg.rl.buckets[-1] + cfg.workflow.max_new_tokens)
  ckpt = checkpointer.Checkpointer(os.path.join(workdir, "checkpoints"))
  chosen = None if step < 0 else step
  mesh = parallel.make_mesh(cfg)
  # Every optimizer of a run (warm-start, RL) has this state structure.
  optimizer = learner.make_optimizer(cfg.optim)
  sm, sh = learner.learner_shardings(source.model_config, mesh, optimizer, cfg.mesh.rules())
  # One field of the learner state: the rest stays on disk, so exporting needs the memory of
  # the parameters alone (a float32 state's `master` is its parameters).
  params, meta = learner.restore_field(
      ckpt, chosen, sm.abstract_params, optimizer, sh.state,
      reference_in_rl=cfg.loss.kl_beta > 0, field="master" if master else "params")
  return cfg, source, int(meta["step"]), params


def export_run(workdir: str, out_dir: str, step: int = -1, *, master: bool = False,
               on_start: Optional[Callable[[], None]] = None) -> str:
  """Writes checkpoint `step` of the run in `workdir` to `out_dir`; returns `out_dir`.

  With `master`, the float32 master copy is written (`restore_params`) and `config.json` names
  float32; otherwise the parameters in their dtype. `on_start` is called once the checkpoint
  is restored, before anything is written (`launch.export` then lets the held logs out).

  Raises:
    errors.InputError (a ValueError): `out_dir` exists and is not empty; as `restore_params`.
    ValueError: as `hf_export.export_hf`.
    checkpointer.MissingCheckpointError, checkpointer.CheckpointIntegrityError: as
      `restore_params`.
  """
  if os.path.isdir(out_dir) and os.listdir(out_dir):
    raise errors.InputError(f"--out {out_dir!r} exists and is not empty: name a new or empty "
                            f"directory")
  _, source, chosen, params = restore_params(workdir, step, master=master)
  if on_start is not None:
    on_start()
  model_config = source.model_config
  if master and jnp.dtype(model_config.param_dtype) == jnp.float32:
    logging.info("--master: the parameters are float32 (the learner keeps no master copy of "
                 "them); exporting the parameters")
  if master:
    model_config = dataclasses.replace(model_config, param_dtype=jnp.float32)
  tok = source.tokenizer
  generation = None
  if source.local_dir is None:
    generation = hf_export.generation_config([tok.eos_id], pad_id=tok.pad_id, bos_id=tok.bos_id)
  hf_export.export_hf(out_dir, model_config, params, source_dir=source.local_dir,
                      generation=generation)
  logging.info("exported checkpoint %d of %s (%s in %s) to %s: %s", chosen, workdir,
               "the float32 master" if master else "the parameters",
               jnp.dtype(model_config.param_dtype).name, out_dir,
               ", ".join(sorted(os.listdir(out_dir))))
  return out_dir
