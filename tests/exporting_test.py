"""A run's checkpoint exported to Hugging Face format: the parameters, or the float32 master."""

import json
import os
import pathlib
import subprocess
import sys

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

from agentic_grpo import config as config_lib
from agentic_grpo import exit_codes
from agentic_grpo import exporting
from agentic_grpo import learner
from agentic_grpo.checkpoint import checkpointer
from agentic_grpo.models import hf_import
from agentic_grpo.models import sources
from agentic_grpo.models import transformer


ROOT = pathlib.Path(__file__).resolve().parent.parent


def _leaves(tree):
  return [np.asarray(jax.device_get(x)) for x in jax.tree.leaves(tree)]


class ExportRunTest(parameterized.TestCase):

  def _run(self, param_dtype: str):
    """A preset run's workdir with checkpoint 1; returns (workdir, saved state)."""
    workdir = self.create_tempdir().full_path
    cfg = config_lib.from_config_dict({
        "model": {"preset": "tiny", "d_model": 32, "n_layers": 1, "n_heads": 2,
                  "n_kv_heads": 1, "head_dim": 16, "mlp_dim": 64, "param_dtype": param_dtype},
        "mesh": {"data": 1}})
    with open(os.path.join(workdir, "config.json"), "w") as f:
      json.dump(config_lib.to_dict(cfg), f)
    source = sources.open_model(cfg.model)
    _, params = transformer.init_model(source.model_config, 0)
    optimizer = learner.make_optimizer(cfg.optim)
    master = None
    if learner.needs_master(params):
      # A master that the parameters' dtype cannot hold: the export must read it, not a cast.
      master = jax.tree.map(lambda p: p.astype(jnp.float32) + 1e-4, params)
    state = learner.init_state(params, optimizer, 0, master=master)
    ckpt = checkpointer.Checkpointer(os.path.join(workdir, "checkpoints"))
    ckpt.save(1, {"state": state}, {}, {"phase": "warmstart", "step": 1, "counters": {}})
    ckpt.close()
    return workdir, state

  def test_restore_params_loads_a_runs_checkpoint_into_a_model_as_documented(self):
    workdir, state = self._run("float32")
    # The docstring's example (and docs/smoke_test.md's).
    cfg, source, step, params = exporting.restore_params(workdir)
    graphdef, _ = transformer.abstract_model(source.model_config)
    ids = source.tokenizer.encode("print(1)")
    logits, _ = transformer.apply(graphdef, params, jnp.asarray([ids]),
                                  jnp.arange(len(ids))[None])
    self.assertEqual((cfg.model.preset, step), ("tiny", 1))
    self.assertEqual(logits.shape, (1, len(ids), source.model_config.vocab_size))
    self.assertEqual(logits.dtype, jnp.float32)
    for a, b in zip(_leaves(params), _leaves(state.params), strict=True):
      np.testing.assert_array_equal(a, b)

  def test_bfloat16_run_exports_its_parameters_or_its_float32_master(self):
    workdir, state = self._run("bfloat16")
    self.assertIsNotNone(state.master)
    out = exporting.export_run(workdir, os.path.join(workdir, "hf"), 1)
    config, params = hf_import.load_hf_checkpoint(out)
    self.assertEqual(config.param_dtype, jnp.bfloat16)
    for got, want in zip(_leaves(params), _leaves(state.params), strict=True):
      self.assertEqual(got.dtype, jnp.bfloat16)
      np.testing.assert_array_equal(got, want)

    out = exporting.export_run(workdir, os.path.join(workdir, "hf_master"), 1, master=True)
    with open(os.path.join(out, "config.json")) as f:
      hf = json.load(f)
    self.assertEqual(hf.get("torch_dtype") or hf.get("dtype"), "float32")
    config, params = hf_import.load_hf_checkpoint(out)
    self.assertEqual(config.param_dtype, jnp.float32)
    for got, want, low in zip(_leaves(params), _leaves(state.master), _leaves(state.params),
                              strict=True):
      self.assertEqual(got.dtype, np.float32)
      np.testing.assert_array_equal(got, want)
      self.assertFalse(np.array_equal(got, low.astype(np.float32)))

  def test_float32_run_has_no_master_and_exports_its_parameters_either_way(self):
    workdir, state = self._run("float32")
    self.assertIsNone(state.master)
    out = exporting.export_run(workdir, os.path.join(workdir, "hf"), 1, master=True)
    config, params = hf_import.load_hf_checkpoint(out)
    self.assertEqual(config.param_dtype, jnp.float32)
    for got, want in zip(_leaves(params), _leaves(state.params), strict=True):
      np.testing.assert_array_equal(got, want)

  def test_restore_field_reads_the_parameters_or_the_master_only(self):
    workdir, _ = self._run("float32")
    ckpt = checkpointer.Checkpointer(os.path.join(workdir, "checkpoints"))
    with self.assertRaisesRegex(ValueError, "field must be 'params' or 'master', got 'opt_state'"):
      learner.restore_field(ckpt, 1, None, None, None, reference_in_rl=False, field="opt_state")
    ckpt.close()

  def test_command_line(self):
    workdir, state = self._run("bfloat16")
    out = os.path.join(workdir, "hf")
    command = [sys.executable, "-m", "launch.export", f"--workdir={workdir}", "--step=1",
               f"--out={out}", "--master"]
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300, check=False)
    self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
    self.assertEqual(proc.stdout.strip().splitlines()[-1], out)
    _, params = hf_import.load_hf_checkpoint(out)
    for got, want in zip(_leaves(params), _leaves(state.master), strict=True):
      np.testing.assert_array_equal(got, want)
    again = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=300, check=False)
    self.assertEqual(again.returncode, exit_codes.CONFIG_ERROR, again.stderr[-3000:])
    self.assertIn("exists and is not empty", again.stderr)
    missing = subprocess.run(command[:4] + ["--step=7", f"--out={out}_7"], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=300, check=False)
    self.assertEqual(missing.returncode, exit_codes.CHECKPOINT_DAMAGED, missing.stderr[-3000:])
    # A step that was never saved is named as missing, with the steps there (not "damaged").
    self.assertEqual(missing.stderr.strip().splitlines()[-1],
                     f"error: no checkpoint at step 7 in {workdir}/checkpoints; steps there: [1]")
    self.assertNotIn("Traceback", missing.stderr)
    self.assertFalse(os.path.exists(f"{out}_7"))
    # Every exported file is readable like any file the process creates (0666 less the umask).
    umask = os.umask(0)
    os.umask(umask)
    for name in os.listdir(out):
      self.assertEqual(os.stat(os.path.join(out, name)).st_mode & 0o777, 0o666 & ~umask, name)
    # The shared flags are listed by --help.
    shown = subprocess.run([sys.executable, "-m", "launch.export", "--help"], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=300, check=False)
    for flag in ("workdir", "step", "out", "master"):
      self.assertRegex(shown.stdout + shown.stderr, rf"(?m)^\s+--(\[no\])?{flag}:")


if __name__ == "__main__":
  absltest.main()
