"""Tests for agentic_grpo.checkpoint.layout (saved array trees fitted to today's) and
agentic_grpo.checkpoint.records (JSON records with required keys and safe defaults)."""

import os

from absl.testing import absltest
import jax
import jax.numpy as jnp
import numpy as np

from agentic_grpo.checkpoint import checkpointer
from agentic_grpo.checkpoint import layout
from agentic_grpo.checkpoint import records


def _opt_state(counter=True):
  """An optimizer-like state: moments per parameter and (optionally) a step counter."""
  state = {"mu": {"w": np.full((3,), 0.5, np.float32), "b": np.full((2,), 0.25, np.float32)}}
  if counter:
    state["skipped"] = np.zeros((), np.int32)
  return state


def _tree(counter=True):
  return {"state": {"params": {"w": np.arange(3, dtype=np.float32),
                               "b": np.arange(2, dtype=np.float32)},
                    "opt_state": _opt_state(counter)}}


class PlanTest(absltest.TestCase):

  def _saved(self, tree):
    ck = checkpointer.Checkpointer(self.create_tempdir().full_path)
    ck.save(1, tree, {}, {"step": 1})
    return ck, layout.saved_tree(os.path.join(ck.directory, "1", "state"))

  def test_todays_layout_is_restored_as_it_is(self):
    _, saved = self._saved(_tree())
    plan = layout.plan(saved, _tree())
    self.assertTrue(plan.same)
    self.assertEmpty(plan.notes)
    self.assertEqual(jax.tree.structure(plan.item), jax.tree.structure(_tree()))

  def test_constant_derivation_fills_a_counter_added_later(self):
    ck, saved = self._saved(_tree(counter=False))
    counter = layout.Derivation("skipped", "skipped updates, counted since", constant=0)
    plan = layout.plan(saved, _tree(), [counter])
    self.assertFalse(plan.same)
    self.assertEqual(plan.notes, ["derived state.opt_state.skipped (1 arrays) as 0: skipped "
                                  "updates, counted since"])
    with self.assertLogs(level="WARNING") as logs:
      got, _, _ = ck.restore(1, _tree(), derivations=[counter])
    self.assertIn("derived state.opt_state.skipped", "\n".join(logs.output))
    self.assertEqual(ck.last_restore_notes, plan.notes)
    self.assertEqual(jax.tree.structure(got), jax.tree.structure(_tree()))
    for a, b in zip(jax.tree.leaves(_tree()), jax.tree.leaves(got), strict=True):
      np.testing.assert_array_equal(a, b)
      self.assertEqual(np.asarray(a).dtype, np.asarray(b).dtype)

  def test_source_derivation_casts_the_sibling_into_todays_sharding(self):
    sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    params = {"w": jnp.arange(3, dtype=jnp.bfloat16) / 3}
    ck, saved = self._saved({"params": params})
    abstract = {"params": params,
                "master": {"w": jax.ShapeDtypeStruct((3,), jnp.float32, sharding=sharding)}}
    master = layout.Derivation("master", "f32 copy", source="params")
    got, _, _ = ck.restore(1, abstract, derivations=[master])
    self.assertEqual(got["master"]["w"].dtype, jnp.float32)
    self.assertEqual(got["master"]["w"].sharding, sharding)
    np.testing.assert_array_equal(np.asarray(got["master"]["w"]),
                                  np.asarray(params["w"]).astype(np.float32))

  def test_what_cannot_fit_is_named_before_anything_is_read(self):
    _, saved = self._saved(_tree())
    today = _tree()
    del today["state"]["opt_state"]["mu"]  # the checkpoint has it: extra
    today["state"]["params"]["w"] = np.zeros((4,), np.float32)  # another shape
    today["state"]["ema"] = {"w": np.zeros((3,), np.float32), "b": np.zeros((2,), np.float32)}
    with self.assertRaises(layout.LayoutError) as raised:
      layout.plan(saved, today, where="checkpoint 1")
    error = raised.exception
    self.assertEqual(error.missing, [("state", "ema", "b"), ("state", "ema", "w")])
    self.assertEqual(error.extra, [("state", "opt_state", "mu", "b"),
                                   ("state", "opt_state", "mu", "w")])
    self.assertEqual(error.reshaped, [(("state", "params", "w"), (3,), (4,))])
    text = str(error)
    self.assertIn("missing from the checkpoint, with no derivation: state.ema (2 arrays)", text)
    self.assertIn("in the checkpoint, not in today's tree: state.opt_state.mu (2 arrays)", text)
    self.assertIn("another shape: state.params.w saved [3], today [4]", text)
    self.assertIn("Nothing was restored, moved or deleted.", text)

  def test_a_derivation_needs_exactly_one_rule(self):
    with self.assertRaisesRegex(ValueError, "exactly one of source and constant"):
      layout.Derivation("master", "note")
    with self.assertRaisesRegex(ValueError, "exactly one of source and constant"):
      layout.Derivation("master", "note", source="params", constant=0)


class RecordsTest(absltest.TestCase):

  def test_absent_keys_with_defaults_are_filled_and_logged(self):
    default = {"a": []}
    with self.assertLogs(level="WARNING") as logs:
      got = records.read({"step": 3}, "meta", required=("step",),
                         defaults={"counters": default, "step": 0})
    self.assertEqual(got, {"step": 3, "counters": {"a": []}})
    got["counters"]["a"].append(1)
    self.assertEqual(default, {"a": []})  # a copy, not the shared default
    self.assertLen(logs.output, 1)
    self.assertIn("meta lacks 'counters'", logs.output[0])

  def test_absent_required_keys_are_named(self):
    with self.assertRaisesRegex(records.RecordError,
                                r"meta\.loop lacks cursor, slots, which have no safe default"
                                r"(.|\n)*Present: phase"):
      records.read({"phase": "rl"}, "meta.loop", required=("cursor", "phase", "slots"))
    with self.assertRaisesRegex(records.RecordError, "meta.rl_phase is list, not a mapping"):
      records.read([], "meta.rl_phase")


if __name__ == "__main__":
  absltest.main()
