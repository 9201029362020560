"""Tests for agentic_grpo.checkpoint.host_rows (in one process: one row)."""

from absl.testing import absltest
import jax
import numpy as np

from agentic_grpo.checkpoint import host_rows

_FLAT = {"replay/tokens": np.arange(7, dtype=np.int32), "loop/done": np.array([True, False]),
         "replay/empty": np.zeros((0,), np.float32)}
_META = {"step": 3, "loop": {"slots": [None, {"positions": [1, 3]}]}}


class HostRowsTest(absltest.TestCase):

  def _assert_round_trip(self, flat, meta):
    self.assertEqual(sorted(flat), sorted(_FLAT))
    for k, v in _FLAT.items():
      np.testing.assert_array_equal(flat[k], v)
      self.assertEqual(flat[k].dtype, v.dtype)
    self.assertEqual(meta, _META)

  def test_encode_decode_round_trip_ignores_padding(self):
    row = host_rows.encode_row(_FLAT, _META)
    self.assertEqual(row.dtype, np.uint8)
    self._assert_round_trip(*host_rows.decode_row(row))
    padded = np.concatenate([row, np.zeros((100,), np.uint8)])
    self._assert_round_trip(*host_rows.decode_row(padded))

  def test_truncated_row_is_named(self):
    row = host_rows.encode_row(_FLAT, _META)
    with self.assertRaisesRegex(ValueError, "bytes follow its length"):
      host_rows.decode_row(row[:-1])
    with self.assertRaisesRegex(ValueError, "has no 8-byte length"):
      host_rows.decode_row(row[:3])

  def test_meta_entry_is_reserved(self):
    with self.assertRaisesRegex(ValueError, "'_meta' is reserved"):
      host_rows.encode_row({host_rows.META_ENTRY: np.zeros((1,))}, {})

  def test_global_rows_pad_to_a_power_of_two_and_read_back(self):
    row = host_rows.encode_row(_FLAT, _META)
    rows, width = host_rows.global_rows(row)
    self.assertEqual(width, max(1024, 1 << (row.size - 1).bit_length()))
    self.assertGreaterEqual(width, row.size)
    self.assertEqual(rows.shape, (jax.process_count(), width))
    self.assertEqual(rows.dtype, np.uint8)
    own = host_rows.own_row(rows)
    np.testing.assert_array_equal(own[:row.size], row)
    self.assertFalse(own[row.size:].any())
    self._assert_round_trip(*host_rows.decode_row(own))
    abstract = host_rows.abstract_rows(jax.process_count(), width)
    self.assertEqual((abstract.shape, abstract.dtype), (rows.shape, rows.dtype))
    self.assertEqual(abstract.sharding, rows.sharding)


if __name__ == "__main__":
  absltest.main()
