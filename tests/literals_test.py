"""Tests for agentic_grpo.tasks.literals: the one equality of plain literals."""

from absl.testing import absltest
from absl.testing import parameterized

from agentic_grpo.tasks import literals


class ValuesEqualTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("int_vs_bool", 1, True, False),
      ("int_vs_float", 1, 1.0, False),
      ("list_vs_tuple", [1], (1,), False),
      ("nested_types", {"a": [1, (2, 3.0)]}, {"a": [1, (2, 3.0)]}, True),
      ("nested_type_differs", {"a": [1, (2, 3)]}, {"a": [1, (2, 3.0)]}, False),
      ("float_close", 0.1 + 0.2, 0.3, True),
      ("float_far", 0.3001, 0.3, False),
      ("nan", float("nan"), float("nan"), True),
      ("inf_sign", float("inf"), float("-inf"), False),
      ("set_exact", {1, 2}, {2, 1}, True),
      ("set_bool_vs_int", {True}, {1}, False),
      ("dict_key_bool_vs_int", {True: "a"}, {1: "a"}, False),
      ("dict_order_free", {1: "a", 2: "b"}, {2: "b", 1: "a"}, True),
      ("str_vs_bytes", "a", b"a", False),
      ("complex", 1 + 2j, 1 + 2j, True),
      ("none", None, None, True),
  )
  def test_values_equal(self, actual, expected, equal):
    self.assertEqual(literals.values_equal(actual, expected), equal)

  def test_values_equal_is_strict(self):
    self.assertFalse(literals.values_equal(True, 1))
    self.assertFalse(literals.values_equal([1], [1.0]))
    self.assertFalse(literals.values_equal((1, 2), [1, 2]))
    self.assertFalse(literals.values_equal([1, 2], [1, 2, 3]))
    self.assertTrue(literals.values_equal({"a": [1, (2,)]}, {"a": [1, (2,)]}))
    self.assertTrue(literals.values_equal(float("nan"), float("nan")))

  def test_symmetric_and_hashable_forms(self):
    pairs = [(0.1 + 0.2, 0.3), ({1.0: "a"}, {1: "a"}), ({(1, 2.0)}, {(1, 2.0)}),
             ([float("nan")], [float("nan")]), (frozenset({True}), frozenset({1}))]
    for a, b in pairs:
      self.assertEqual(literals.values_equal(a, b), literals.values_equal(b, a), (a, b))
    self.assertNotEqual(literals.canonical(True), literals.canonical(1))
    self.assertEqual(literals.canonical(float("nan")), literals.canonical(float("nan")))


if __name__ == "__main__":
  absltest.main()
