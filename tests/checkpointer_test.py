"""Tests for agentic_grpo.checkpoint.checkpointer."""

import json
import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import time
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from agentic_grpo import config as config_lib
from agentic_grpo import learner
from agentic_grpo.checkpoint import checkpointer
from agentic_grpo.checkpoint import integrity as checkpoint_integrity
from agentic_grpo.checkpoint import layout as checkpoint_layout
from agentic_grpo.models import presets
from agentic_grpo.models import transformer
from agentic_grpo.parallel import collectives
from tests.fixtures import old_checkpoints
from tests.fixtures import xla_flags

ROOT = pathlib.Path(__file__).resolve().parent.parent

# Saves checkpoint 1, then starts checkpoint 2 and stops right before Orbax commits it (the
# rename of the temporary directory), so that the parent can SIGKILL it mid-save.
_CHILD = textwrap.dedent("""
    import sys, time
    import numpy as np
    from orbax.checkpoint._src.path import atomicity
    from agentic_grpo.checkpoint import checkpointer

    ck = checkpointer.Checkpointer(sys.argv[1])
    ck.save(1, {"w": np.full((4,), 1.0, np.float32)}, {"replay": {"x": np.arange(3)}},
            {"step": 1})

    async def hang(self, *args, **kwargs):
      print("COMMITTING", flush=True)
      time.sleep(600)

    atomicity.AtomicRenameTemporaryPath.finalize = hang
    ck.save(2, {"w": np.full((4,), 2.0, np.float32)}, {"replay": {"x": np.arange(5)}},
            {"step": 2})
""")


class CheckpointingTest(absltest.TestCase):

  def test_round_trip_of_train_state_and_host_state(self):
    cfg = presets.get_model_config("tiny", d_model=16, n_layers=1, n_heads=1, n_kv_heads=1,
                                   head_dim=16, mlp_dim=32)
    _, params = transformer.init_model(cfg, 0)
    opt = learner.make_optimizer(config_lib.OptimSection())
    state = learner.init_state(params, opt, 3)
    state = state.replace(step=jnp.int32(7))
    host = {"replay": {"tokens": np.arange(5, dtype=np.int32), "empty": np.zeros((0,), bool)},
            "loop": {"lp": np.linspace(-1, 0, 4).astype(np.float32)}}
    meta = {"phase": "rl", "position": 12, "nested": {"a": [1, None, 2.5]}}
    ck = checkpointer.Checkpointer(self.create_tempdir().full_path)
    ck.save(7, state, host, meta)
    abstract = learner.init_state(transformer.init_model(cfg, 1)[1], opt, 0)
    got_state, got_host, got_meta = ck.restore(None, abstract)
    self.assertEqual(got_meta, meta)
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(got_state), strict=True):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
      self.assertEqual(np.asarray(a).dtype, np.asarray(b).dtype)
    self.assertEqual(jax.tree.structure(state), jax.tree.structure(got_state))
    for group, arrays in host.items():
      for name, v in arrays.items():
        np.testing.assert_array_equal(got_host[group][name], v)
        self.assertEqual(got_host[group][name].dtype, v.dtype)

  def test_only_reads_the_selected_leaves(self):
    cfg = _tiny(jnp.bfloat16)
    _, params = transformer.init_model(cfg, 0)
    opt = learner.make_optimizer(config_lib.OptimSection())
    state = learner.init_state(params, opt, 3)
    moments = lambda x: x + 0.5 if jnp.issubdtype(x.dtype, jnp.floating) else x
    state = state.replace(opt_state=jax.tree.map(moments, state.opt_state))
    ck = checkpointer.Checkpointer(self.create_tempdir().full_path)
    ck.save(1, {"state": state, "ref": params}, {}, {"phase": "rl"})
    abstract = {"state": learner.init_state(transformer.init_model(cfg, 1)[1], opt, 0),
                "ref": transformer.init_model(cfg, 1)[1]}
    got, _, _ = ck.restore(None, abstract,
                           only=checkpointer.state_field("params"))
    self.assertEqual(jax.tree.structure(got["state"].params), jax.tree.structure(params))
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(got["state"].params), strict=True):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
      self.assertEqual(b.dtype, jnp.bfloat16)
    skipped = [got["state"].opt_state, got["state"].master, got["state"].step, got["ref"]]
    leaves = jax.tree.leaves(skipped)
    self.assertNotEmpty(leaves)
    self.assertTrue(all(x is ocp.PLACEHOLDER for x in leaves), [type(x) for x in leaves])

  def test_keeps_newest(self):
    ck = checkpointer.Checkpointer(self.create_tempdir().full_path, max_to_keep=2)
    for step in (1, 2, 3):
      ck.save(step, {"w": np.full((2,), step, np.float32)}, {}, {"step": step})
    self.assertEqual(ck.all_steps(), [2, 3])
    state, _, meta = ck.restore(2, {"w": np.zeros((2,), np.float32)})
    np.testing.assert_array_equal(state["w"], [2, 2])
    self.assertEqual(meta["step"], 2)
    with self.assertRaisesRegex(ValueError, "host array"):
      ck.save(4, {"w": np.zeros(2)}, {"r": {"x": np.zeros((2, 2))}}, {})

  def test_kept_steps_survive_rotation_and_damage_handling(self):
    directory = self.create_tempdir().full_path
    ck = checkpointer.Checkpointer(directory, max_to_keep=1, keep_steps=(2,))
    for step in (1, 2, 3, 4, 5):
      ck.save(step, {"w": np.full((2,), step, np.float32)}, {}, {"step": step})
    self.assertEqual(ck.all_steps(), [2, 5])
    state, _, meta = ck.restore(2, {"w": np.zeros((2,), np.float32)})
    np.testing.assert_array_equal(state["w"], [2, 2])
    self.assertEqual(meta["step"], 2)
    # A damaged newest checkpoint: the latest restore falls back past it to the kept one and
    # sets the damaged one aside; later saves rotate around the kept step again.
    _delete_manifest(pathlib.Path(directory) / "5")
    reopened = checkpointer.Checkpointer(directory, max_to_keep=1, keep_steps=(2,))
    with self.assertLogs(level="WARNING"):
      _, _, meta = reopened.restore(None, {"w": np.zeros((2,), np.float32)})
    self.assertEqual(meta["step"], 2)
    self.assertEqual(reopened.all_steps(), [2])
    for step in (3, 4):
      reopened.save(step, {"w": np.full((2,), step, np.float32)}, {}, {"step": step})
    self.assertEqual(reopened.all_steps(), [2, 4])
    # Without keep_steps the same saves rotate it away.
    plain = checkpointer.Checkpointer(self.create_tempdir().full_path, max_to_keep=1)
    for step in (1, 2, 3):
      plain.save(step, {"w": np.full((2,), step, np.float32)}, {}, {"step": step})
    self.assertEqual(plain.all_steps(), [3])
    with self.assertRaisesRegex(ValueError, "keep_steps"):
      checkpointer.Checkpointer(self.create_tempdir().full_path, keep_steps=(-1,))

  def test_sigkill_during_save_leaves_previous_checkpoint(self):
    directory = self.create_tempdir().full_path
    env = xla_flags.child_env(PYTHONPATH=str(ROOT))
    child = subprocess.Popen([sys.executable, "-c", _CHILD, directory], cwd=ROOT, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
      deadline = time.monotonic() + 120
      line = ""
      while "COMMITTING" not in line and time.monotonic() < deadline:
        line = child.stdout.readline()
        if not line and child.poll() is not None:
          break
      self.assertIn("COMMITTING", line, "the child never reached the commit of checkpoint 2")
      self.assertTrue(any(p.name.startswith("2") for p in pathlib.Path(directory).iterdir()),
                      "checkpoint 2 was not being written")
      child.send_signal(signal.SIGKILL)
      child.wait(timeout=30)
    finally:
      if child.poll() is None:
        child.kill()
        child.wait()
      child.stdout.close()
    self.assertEqual(child.returncode, -signal.SIGKILL)
    ck = checkpointer.Checkpointer(directory)
    self.assertEqual(ck.latest_step(), 1)
    state, host, meta = ck.restore(None, {"w": np.zeros((4,), np.float32)})
    np.testing.assert_array_equal(state["w"], np.ones(4))
    np.testing.assert_array_equal(host["replay"]["x"], np.arange(3))
    self.assertEqual(meta["step"], 1)
    # The next save after a crash works and becomes the latest.
    ck.save(2, {"w": np.full((4,), 3.0, np.float32)}, {}, {"step": 2})
    self.assertEqual(ck.latest_step(), 2)



def _data_file(step_dir: pathlib.Path) -> pathlib.Path:
  """The largest array data file of the `state` item."""
  files = [p for p in (step_dir / "state").rglob("*") if p.is_file() and p.parent.name == "d"]
  return max(files, key=lambda p: p.stat().st_size)


def _flip(step_dir: pathlib.Path) -> str:
  path = _data_file(step_dir)
  data = bytearray(path.read_bytes())
  for i in range(len(data) // 4, len(data)):
    data[i] ^= 0xFF
  path.write_bytes(bytes(data))
  return str(path.relative_to(step_dir))


def _truncate(path: pathlib.Path) -> None:
  data = path.read_bytes()
  path.write_bytes(data[:len(data) // 2])


def _truncate_data(step_dir: pathlib.Path) -> str:
  path = _data_file(step_dir)
  _truncate(path)
  return str(path.relative_to(step_dir))


def _truncate_metadata(step_dir: pathlib.Path) -> str:
  _truncate(step_dir / "state" / "_METADATA")
  return "state/_METADATA"


def _truncate_manifest(step_dir: pathlib.Path) -> str:
  _truncate(step_dir / checkpoint_integrity.MANIFEST)
  return checkpoint_integrity.MANIFEST


def _delete_manifest(step_dir: pathlib.Path) -> str:
  (step_dir / checkpoint_integrity.MANIFEST).unlink()
  return checkpoint_integrity.MANIFEST


_DAMAGE = (("flipped_data", _flip), ("truncated_data", _truncate_data),
           ("truncated_metadata", _truncate_metadata),
           ("truncated_manifest", _truncate_manifest), ("deleted_manifest", _delete_manifest))


def _state(value: float) -> dict[str, np.ndarray]:
  return {"w": np.full((4096,), value, np.float32)}


def _tiny(param_dtype, d_model=16):
  return presets.get_model_config("tiny", d_model=d_model, n_layers=1, n_heads=1,
                                  n_kv_heads=1, head_dim=16, mlp_dim=32,
                                  param_dtype=param_dtype)


class EarlierLayoutTest(parameterized.TestCase):
  """Checkpoints written before `TrainState.master` existed (tests/fixtures/old_checkpoints)."""

  def _pre_master(self, directory, param_dtype, steps=(1,)):
    """Saves pre-master states at `steps`; returns the last one saved."""
    _, params = transformer.init_model(_tiny(param_dtype), 0)
    opt = learner.make_optimizer(config_lib.OptimSection())
    old = old_checkpoints.pre_master_state(params, opt, 3)
    moments = lambda x: x + 0.5 if jnp.issubdtype(x.dtype, jnp.floating) else x
    old = old.replace(step=jnp.int32(5), opt_state=jax.tree.map(moments, old.opt_state))
    ck = checkpointer.Checkpointer(directory, max_to_keep=3)
    for step in steps:
      ck.save(step, {"state": old}, {"replay": {"x": np.arange(3)}}, {"phase": "rl"})
    ck.close()
    return old, opt

  @parameterized.named_parameters(("float32", jnp.float32), ("bfloat16", jnp.bfloat16))
  def test_pre_master_checkpoint_restores(self, param_dtype):
    directory = self.create_tempdir().full_path
    old, opt = self._pre_master(directory, param_dtype)
    abstract = {"state": learner.init_state(transformer.init_model(_tiny(param_dtype), 1)[1],
                                            opt, 0)}
    ck = checkpointer.Checkpointer(directory)
    low_precision = param_dtype != jnp.float32
    if low_precision:  # The failure: today's tree has a master the checkpoint lacks.
      with self.assertRaisesRegex(checkpoint_layout.LayoutError,
                                  r"missing from the checkpoint, with no derivation: "
                                  r"state\.master \(11 arrays\)"):
        ck.restore(None, abstract)
    got, host, meta = ck.restore(None, abstract, derivations=learner.STATE_DERIVATIONS)
    state = got["state"]
    self.assertEqual(jax.tree.structure(state), jax.tree.structure(abstract["state"]))
    for a, b in zip(jax.tree.leaves(old.params), jax.tree.leaves(state.params), strict=True):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
      self.assertEqual(b.dtype, param_dtype)
    # The moments were saved in the parameters' dtype: read exactly as today's float32.
    for a, b in zip(jax.tree.leaves(old.opt_state), jax.tree.leaves(state.opt_state), strict=True):
      np.testing.assert_array_equal(np.asarray(a).astype(np.asarray(b).dtype), np.asarray(b))
    self.assertEqual(int(state.step), 5)
    np.testing.assert_array_equal(np.asarray(state.rng), np.asarray(old.rng))
    np.testing.assert_array_equal(host["replay"]["x"], np.arange(3))
    self.assertEqual(meta, {"phase": "rl"})
    if not low_precision:
      self.assertIsNone(state.master)
      self.assertEmpty(ck.last_restore_notes)
      return
    for p, m in zip(jax.tree.leaves(state.params), jax.tree.leaves(state.master), strict=True):
      self.assertEqual(m.dtype, jnp.float32)
      np.testing.assert_array_equal(np.asarray(m), np.asarray(p).astype(np.float32))
    notes = "\n".join(ck.last_restore_notes)
    self.assertIn("derived state.master (11 arrays) from state.params", notes)
    self.assertIn("read 22 arrays saved as bfloat16 as float32", notes)

  def test_only_the_parameters_of_a_pre_master_checkpoint(self):
    # An earlier layout (no master) read for evaluation: the master is neither read nor derived.
    directory = self.create_tempdir().full_path
    old, opt = self._pre_master(directory, jnp.bfloat16)
    abstract = {"state": learner.init_state(
        transformer.init_model(_tiny(jnp.bfloat16), 1)[1], opt, 0)}
    got, _, _ = checkpointer.Checkpointer(directory).restore(
        None, abstract, derivations=learner.STATE_DERIVATIONS,
        only=checkpointer.state_field("params"))
    for a, b in zip(jax.tree.leaves(old.params), jax.tree.leaves(got["state"].params), strict=True):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    leaves = jax.tree.leaves([got["state"].master, got["state"].opt_state])
    self.assertNotEmpty(leaves)
    self.assertTrue(all(x is ocp.PLACEHOLDER for x in leaves))

  def test_a_checkpoint_that_cannot_fit_is_named_and_nothing_moves(self):
    # A bfloat16 run's checkpoints (the newest damaged) restored into float32 models.
    directory = self.create_tempdir().full_path
    opt = learner.make_optimizer(config_lib.OptimSection())
    saved = learner.init_state(transformer.init_model(_tiny(jnp.bfloat16), 0)[1], opt, 0)
    ck = checkpointer.Checkpointer(directory, max_to_keep=3)
    for step in (1, 2):
      ck.save(step, {"state": saved}, {}, {"phase": "rl"})
    _truncate_data(pathlib.Path(directory) / "2")
    f32 = lambda width: {"state": learner.init_state(
        transformer.init_model(_tiny(jnp.float32, d_model=width), 1)[1], opt, 0)}
    with self.assertRaises(checkpoint_layout.LayoutError) as raised:
      ck.restore(None, f32(16), derivations=learner.STATE_DERIVATIONS)
    self.assertStartsWith(str(raised.exception), f"checkpoint 1 in {directory}: the saved state "
                          f"does not fit today's tree")
    self.assertIn("in the checkpoint, not in today's tree: state.master (11 arrays)",
                  str(raised.exception))
    with self.assertRaises(checkpoint_layout.LayoutError) as raised:
      ck.restore(1, f32(32), derivations=learner.STATE_DERIVATIONS)
    self.assertIn("another shape: state.opt_state.inner_state.1.0.mu.embed.value saved "
                  "[269, 16], today [269, 32]", str(raised.exception))
    # Nothing was moved aside: not even the damaged newer checkpoint.
    self.assertEqual(ck.all_steps(), [1, 2])
    self.assertFalse(os.path.exists(directory + "-damaged"))

class IntegrityTest(parameterized.TestCase):

  def _save(self, directory, steps):
    ck = checkpointer.Checkpointer(directory, max_to_keep=3)
    for step in steps:
      ck.save(step, _state(step), {"replay": {"x": np.arange(step)}}, {"step": step})
    ck.close()

  def test_manifest_lists_every_file(self):
    directory = self.create_tempdir().full_path
    self._save(directory, [1])
    step_dir = pathlib.Path(directory) / "1"
    manifest = json.loads((step_dir / checkpoint_integrity.MANIFEST).read_text())
    on_disk = {str(p.relative_to(step_dir)) for p in step_dir.rglob("*") if p.is_file()}
    self.assertEqual(set(manifest["files"]) | {checkpoint_integrity.MANIFEST}, on_disk)
    self.assertEqual(checkpoint_integrity.verify(step_dir), [])

  @parameterized.named_parameters(*_DAMAGE)
  def test_damaged_latest_falls_back_to_older(self, damage):
    directory = self.create_tempdir().full_path
    self._save(directory, [1, 2])
    name = damage(pathlib.Path(directory) / "2")
    ck = checkpointer.Checkpointer(directory, max_to_keep=3)
    with self.assertLogs(level="WARNING") as logs:
      state, host, meta = ck.restore(None, _state(0.0))
    self.assertTrue(any("checkpoint 2" in line and name in line for line in logs.output),
                    logs.output)
    np.testing.assert_array_equal(state["w"], _state(1.0)["w"])
    np.testing.assert_array_equal(host["replay"]["x"], np.arange(1))
    self.assertEqual(meta["step"], 1)
    # The damaged checkpoint was moved aside, so the resumed run can save step 2 again.
    self.assertEqual(ck.all_steps(), [1])
    self.assertTrue((pathlib.Path(directory + "-damaged") / "2").is_dir())
    ck.save(2, _state(5.0), {}, {"step": 2})
    self.assertEqual(checkpointer.Checkpointer(directory).intact_step(), 2)

  @parameterized.named_parameters(*_DAMAGE)
  def test_damaged_only_checkpoint_is_a_clear_error(self, damage):
    directory = self.create_tempdir().full_path
    self._save(directory, [1])
    name = damage(pathlib.Path(directory) / "1")
    ck = checkpointer.Checkpointer(directory)
    with self.assertRaisesRegex(checkpointer.CheckpointIntegrityError,
                                rf"no intact checkpoint(.|\n)*checkpoint 1: {name}"):
      ck.restore(None, _state(0.0))
    with self.assertRaisesRegex(checkpointer.CheckpointIntegrityError, f"checkpoint 1: {name}"):
      ck.read_meta(1)
    self.assertEqual(ck.all_steps(), [1])  # nothing is moved when nothing is restored

  def test_adopt_a_checkpoint_without_manifest(self):
    directory = self.create_tempdir().full_path
    self._save(directory, [1])
    _delete_manifest(pathlib.Path(directory) / "1")
    ck = checkpointer.Checkpointer(directory)
    with self.assertRaises(checkpointer.CheckpointIntegrityError):
      ck.intact_step()
    ck.adopt(1)
    state, _, _ = ck.restore(None, _state(0.0))
    np.testing.assert_array_equal(state["w"], _state(1.0)["w"])

  @parameterized.named_parameters(("intact", None), ("unreadable", "{not json"),
                                  ("stale", '{"version": 1, "files": {}}'))
  def test_adopt_replaces_an_existing_manifest(self, manifest_text):
    directory = self.create_tempdir().full_path
    self._save(directory, [1])
    step_dir = pathlib.Path(directory) / "1"
    manifest = step_dir / checkpoint_integrity.MANIFEST
    written = manifest.read_text()
    if manifest_text is not None:
      manifest.write_text(manifest_text)
    ck = checkpointer.Checkpointer(directory)
    self.assertEqual(ck.problems(1) == [], manifest_text is None)
    ck.adopt(1)
    self.assertEqual(json.loads(manifest.read_text()), json.loads(written))
    self.assertFalse((step_dir / (checkpoint_integrity.MANIFEST + ".tmp")).exists())
    self.assertEqual(ck.problems(1), [])
    state, _, _ = ck.restore(None, _state(0.0))
    np.testing.assert_array_equal(state["w"], _state(1.0)["w"])

  def test_damaged_again_is_set_aside_beside_the_first(self):
    directory = self.create_tempdir().full_path
    self._save(directory, [1, 2])
    for value in (2.0, 3.0):
      _flip(pathlib.Path(directory) / "2")
      ck = checkpointer.Checkpointer(directory, max_to_keep=3)
      state, _, _ = ck.restore(None, _state(0.0))
      np.testing.assert_array_equal(state["w"], _state(1.0)["w"])
      ck.save(2, _state(value), {}, {"step": 2})
    aside = pathlib.Path(directory + "-damaged")
    first, second = sorted(aside.iterdir(), key=lambda p: len(p.name))
    self.assertEqual(first.name, "2")
    self.assertRegex(second.name, r"^2-\d{8}-\d{6}$")
    for moved in (first, second):  # each still a whole (damaged) checkpoint
      self.assertTrue((moved / checkpoint_integrity.MANIFEST).is_file())
      self.assertNotEmpty(checkpoint_integrity.verify(moved))

  def test_set_aside_never_overwrites(self):
    root = pathlib.Path(self.create_tempdir().full_path)
    aside = root / "aside"
    moved = []
    for k in range(3):
      (root / "7").mkdir()
      (root / "7" / "marker").write_text(str(k))
      moved.append(checkpoint_integrity.set_aside(root / "7", aside, stamp="T"))
    self.assertEqual([p.name for p in moved], ["7", "7-T", "7-T-1"])
    self.assertEqual([(aside / p.name / "marker").read_text() for p in moved], ["0", "1", "2"])
    self.assertFalse((root / "7").exists())

  def test_set_aside_names_a_target_taken_meanwhile(self):
    root = pathlib.Path(self.create_tempdir().full_path)
    (root / "7").mkdir()
    path_type = type(checkpointer.epath.Path(root))
    with mock.patch.object(path_type, "rename", side_effect=FileExistsError("taken")):
      with self.assertRaisesRegex(FileExistsError, f"{root / '7'}: {root / 'aside' / '7'} was "
                                                   "created meanwhile"):
        checkpoint_integrity.set_aside(root / "7", root / "aside", stamp="T")
    self.assertTrue((root / "7").is_dir())

  def test_every_process_restores_process_0s_choice(self):
    # Process 1 of 2: it does not verify and takes the step process 0 broadcast (1), even
    # though its own newest checkpoint is 2.
    directory = self.create_tempdir().full_path
    self._save(directory, [1, 2])
    ck = checkpointer.Checkpointer(directory, max_to_keep=3)
    broadcast = mock.Mock(return_value=np.int64(1))
    with mock.patch.object(jax, "process_count", return_value=2), \
         mock.patch.object(jax, "process_index", return_value=1), \
         mock.patch.object(collectives.multihost_utils, "broadcast_one_to_all", broadcast), \
         mock.patch.object(checkpointer.integrity, "verify") as verify:
      self.assertEqual(ck.intact_step(), 1)
      broadcast.return_value = np.int64(-1)
      with self.assertRaisesRegex(checkpointer.CheckpointIntegrityError, "process 0"):
        ck.intact_step()
    verify.assert_not_called()
    self.assertEqual(broadcast.call_count, 2)


if __name__ == "__main__":
  absltest.main()
