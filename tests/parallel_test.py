"""Tests for agentic_grpo.parallel on 8 simulated CPU devices (see conftest.py).

Meshes, logical axis rules, batch placement and the host collectives of one
process; no model code. Multi-process behaviour is tests/multihost_test.py.
"""

import os

from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P
import ml_collections
import numpy as np

from agentic_grpo import parallel

MESHES = (
    ("data8", (8, 1, 1)),
    ("data2_fsdp4", (2, 4, 1)),
    ("data2_fsdp2_tensor2", (2, 2, 2)),
    ("tensor8", (1, 1, 8)),
)


class MeshTest(parameterized.TestCase):

  @parameterized.named_parameters(*MESHES)
  def test_make_mesh_shape_and_axis_types(self, shape):
    mesh = parallel.make_mesh(shape)
    self.assertEqual(mesh.axis_names, parallel.MESH_AXES)
    self.assertEqual(tuple(mesh.shape.values()), shape)
    self.assertTrue(all(t == jax.sharding.AxisType.Auto for t in mesh.axis_types))
    self.assertLen(set(mesh.devices.flat), 8)

  @parameterized.parameters(
      ((-1, 1, 1), (8, 1, 1)),
      ((2, -1, 1), (2, 4, 1)),
      ((1, 2, -1), (1, 2, 4)),
      ((2, 2, 2), (2, 2, 2)),
  )
  def test_minus_one_takes_the_rest(self, sizes, expected):
    self.assertEqual(parallel.resolve_mesh_shape(sizes, 8), expected)

  def test_fixed_sizes_may_use_fewer_devices_in_one_process(self):
    mesh = parallel.make_mesh((1, 2, 1))
    self.assertEqual(list(mesh.devices.flat), jax.devices()[:2])
    with self.assertRaisesRegex(ValueError, "do not divide"):
      parallel.make_mesh((3, -1, 1))

  def test_mesh_from_config_objects(self):
    cd = ml_collections.ConfigDict({"mesh": {"data": 2, "fsdp": -1, "tensor": 2}})
    self.assertEqual(tuple(parallel.make_mesh(cd).shape.values()), (2, 2, 2))
    self.assertEqual(tuple(parallel.make_mesh({"data": 1, "fsdp": 8, "tensor": 1})
                           .shape.values()), (1, 8, 1))
    devices = jax.devices()[:4]
    self.assertEqual(tuple(parallel.make_mesh((-1, 1, 2), devices).shape.values()), (2, 1, 2))

  @parameterized.parameters(
      ((3, 3, 1), "cover 9 devices"),
      ((-1, -1, 1), "at most one"),
      ((3, -1, 1), "do not divide"),
      ((0, 1, 1), "positive int or -1"),
      ((2, 4), "3 entries"),
  )
  def test_bad_mesh_sizes_raise(self, sizes, message):
    with self.assertRaisesRegex(ValueError, message):
      parallel.make_mesh(sizes)


class RulesTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    self.mesh = jax.sharding.AbstractMesh((2, 2, 2), parallel.MESH_AXES)

  def test_rules_map_names_to_axes(self):
    spec = parallel.logical_to_spec(("vocab", "embed"), (64, 32), self.mesh)
    self.assertEqual(spec, P("tensor", "fsdp"))
    spec = parallel.logical_to_spec(("batch", "length"), (8, 5), self.mesh)
    self.assertEqual(spec, P(("data", "fsdp"), None))

  def test_indivisible_dimension_keeps_dividing_prefix(self):
    # 6 rows: data (2) divides, data*fsdp (4) does not.
    self.assertEqual(parallel.logical_to_spec(("batch",), (6,), self.mesh), P("data"))
    self.assertEqual(parallel.logical_to_spec(("heads",), (3,), self.mesh), P(None))

  def test_mesh_axis_used_once_per_array(self):
    rules = (("a", "tensor"), ("b", ("tensor", "fsdp")))
    self.assertEqual(parallel.logical_to_spec(("a", "b"), (4, 4), self.mesh, rules),
                     P("tensor", None))

  def test_custom_rules_from_config(self):
    cfg = ml_collections.ConfigDict(
        {"mesh": {"data": 2, "fsdp": 2, "tensor": 2,
                  "logical_axis_rules": [["embed", ["fsdp", "tensor"]], ["vocab", None]]}})
    rules = parallel.rules_from_config(cfg)
    self.assertEqual(rules, (("embed", ("fsdp", "tensor")), ("vocab", None)))
    self.assertEqual(parallel.logical_to_spec(("vocab", "embed"), (64, 32), self.mesh, rules),
                     P(None, ("fsdp", "tensor")))
    self.assertEqual(parallel.rules_from_config({"mesh": {"data": -1}}),
                     parallel.DEFAULT_RULES)

  @parameterized.parameters(
      ((("embed", "model"),), "unknown mesh axis"),
      ((("embed", "fsdp"), ("embed", None)), "appears twice"),
      ((("embed",),), "pairs"),
      ((("embed", 3),), "must map to"),
  )
  def test_bad_rules_raise(self, rules, message):
    with self.assertRaisesRegex(ValueError, message):
      parallel.logical_to_spec(("embed",), (32,), self.mesh, rules)

  def test_logical_mesh_axes(self):
    self.assertEqual(parallel.logical_mesh_axes("batch"), ("data", "fsdp"))
    self.assertEqual(parallel.logical_mesh_axes("embed"), ("fsdp",))
    self.assertEqual(parallel.logical_mesh_axes("head_dim"), ())
    self.assertEqual(parallel.logical_mesh_axes("experts"), ())
    self.assertEqual(parallel.logical_mesh_axes("embed", (("embed", ["fsdp", "tensor"]),)),
                     ("fsdp", "tensor"))

  def test_tree_shardings_by_logical_axes_and_reference_paths(self):
    f32 = jax.ShapeDtypeStruct((8, 4), jnp.float32)
    tree = {"w": nnx.Param(f32, out_sharding=("embed", "mlp"), eager_sharding=False),
            "step": jax.ShapeDtypeStruct((), jnp.int32)}
    shardings = parallel.tree_shardings(tree, self.mesh)
    self.assertEqual(shardings["w"].get_value().spec, P("fsdp", "tensor"))
    self.assertEqual(shardings["step"].spec, P())
    # Plain arrays follow the reference leaf whose path ends theirs, when shapes agree.
    state = {"mu": {"w": f32}, "nu": {"w": jax.ShapeDtypeStruct((4, 8), jnp.float32)},
             "count": jax.ShapeDtypeStruct((), jnp.int32)}
    got = parallel.tree_shardings(state, self.mesh, reference=(shardings, tree))
    self.assertEqual(got["mu"]["w"].spec, P("fsdp", "tensor"))
    self.assertEqual(got["nu"]["w"].spec, P())  # other shape: replicated
    self.assertEqual(got["count"].spec, P())
    self.assertEqual(parallel.tree_shardings(state, self.mesh)["mu"]["w"].spec, P())
    with self.assertRaisesRegex(ValueError, "differ in structure"):
      parallel.tree_shardings(state, self.mesh, reference=(shardings, {"w": f32}))

  def test_unknown_logical_name_raises(self):
    with self.assertRaisesRegex(ValueError, "no entry"):
      parallel.logical_to_spec(("experts",), (4,), self.mesh)


class BatchTest(absltest.TestCase):

  def test_shard_batch_rows_and_scalars(self):
    mesh = parallel.make_mesh((2, 4, 1))
    batch = {"x": np.arange(16 * 3).reshape(16, 3), "w": np.ones(16, np.float32),
             "step": np.int32(5)}
    out = parallel.shard_batch(batch, mesh)
    self.assertEqual(out["x"].sharding.spec, P(("data", "fsdp"), None))
    self.assertEqual(out["x"].addressable_shards[0].data.shape, (2, 3))
    self.assertEqual(out["step"].sharding.spec, P())
    np.testing.assert_array_equal(np.asarray(out["x"]), batch["x"])
    self.assertEqual(parallel.batch_devices(mesh), 8)
    self.assertEqual(parallel.row_sharding(mesh).spec, P(("data", "fsdp")))

  def test_put_batch_splits_rows_as_far_as_they_divide(self):
    mesh = parallel.make_mesh((2, 4, 1))
    out = parallel.put_batch({"a": np.ones((16, 3)), "b": np.ones((4, 3)), "c": np.int32(1)},
                             mesh)
    self.assertEqual(out["a"].sharding.spec, P(("data", "fsdp"), None))
    self.assertEqual(out["b"].sharding.spec, P("data", None))  # 4 rows: data (2) divides
    self.assertEqual(out["c"].sharding.spec, P())
    np.testing.assert_array_equal(np.asarray(out["b"]), np.ones((4, 3)))

  def test_fetch_returns_host_arrays(self):
    mesh = parallel.make_mesh((2, 2, 2))
    x = parallel.shard_batch({"x": np.arange(24.0).reshape(8, 3)}, mesh)["x"]
    got = parallel.fetch({"x": x, "n": jnp.int32(3)})
    self.assertIsInstance(got["x"], np.ndarray)
    np.testing.assert_array_equal(got["x"], np.arange(24.0).reshape(8, 3))
    self.assertEqual(int(got["n"]), 3)

  def test_local_rows_inverts_shard_batch(self):
    mesh = parallel.make_mesh((2, 2, 2))
    batch = {"x": np.arange(8 * 3).reshape(8, 3), "y": np.arange(8.0), "n": np.int32(4)}
    back = parallel.local_rows(parallel.shard_batch(batch, mesh))
    for k, v in batch.items():
      np.testing.assert_array_equal(back[k], v)
      self.assertIsInstance(back[k], np.ndarray)

  def test_gathers_in_one_process(self):
    np.testing.assert_array_equal(parallel.host_allgather(np.array([3, 5])), [[3, 5]])
    self.assertEqual(parallel.allgather_json({"a": [1, 2.5]}), [{"a": [1, 2.5]}])


class MultiProcessHelpersTest(parameterized.TestCase):

  @parameterized.parameters((10, 3), (3, 4), (0, 2), (8, 2))
  def test_process_slice_partitions(self, n, count):
    slices = [parallel.process_slice(n, p, count) for p in range(count)]
    covered = [i for s in slices for i in range(n)[s]]
    self.assertEqual(covered, list(range(n)))
    sizes = [len(range(n)[s]) for s in slices]
    self.assertLessEqual(max(sizes) - min(sizes), 1)

  def test_process_slice_single_process_is_everything(self):
    self.assertEqual(parallel.process_slice(7), slice(0, 7))
    with self.assertRaisesRegex(ValueError, "process_index"):
      parallel.process_slice(4, 2, 2)

  def test_initialize_distributed_off_without_environment(self):
    env = {k: os.environ.pop(k) for k in (parallel.ENV_DISTRIBUTED, parallel.ENV_COORDINATOR)
           if k in os.environ}
    try:
      self.assertFalse(parallel.initialize_distributed())
      self.assertFalse(parallel.initialize_distributed("off"))
      os.environ[parallel.ENV_DISTRIBUTED] = "0"
      os.environ[parallel.ENV_COORDINATOR] = "127.0.0.1:1"
      self.assertFalse(parallel.initialize_distributed())  # explicit 0 wins
    finally:
      os.environ.pop(parallel.ENV_DISTRIBUTED, None)
      os.environ.pop(parallel.ENV_COORDINATOR, None)
      os.environ.update(env)
    self.assertTrue(parallel.is_primary())

  def test_initialize_distributed_validates(self):
    with self.assertRaisesRegex(ValueError, "enabled"):
      parallel.initialize_distributed("maybe")
    with self.assertRaisesRegex(ValueError, "process_id"):
      parallel.initialize_distributed("on", "127.0.0.1:1", num_processes=2, process_id=2)
    os.environ[parallel.ENV_DISTRIBUTED] = "perhaps"
    try:
      with self.assertRaisesRegex(ValueError, parallel.ENV_DISTRIBUTED):
        parallel.initialize_distributed()
    finally:
      del os.environ[parallel.ENV_DISTRIBUTED]


if __name__ == "__main__":
  absltest.main()
