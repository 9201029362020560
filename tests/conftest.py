"""Pytest setup shared by all tests: eight simulated CPU devices, programs compiled fast.

See `tests/fixtures/xla_flags.py` for why the suite compiles at XLA optimisation level 0. An
`XLA_FLAGS` already set in the environment is kept as it is.
"""

import os

from tests.fixtures import xla_flags

# Must happen before JAX initialises its backends.
os.environ.setdefault("XLA_FLAGS", xla_flags.suite_flags(8))
os.environ.setdefault("JAX_PLATFORMS", "cpu")

# absltest helpers (create_tempdir, flag defaults) need parsed flags; pytest never parses them.
from absl import flags  # pylint: disable=g-import-not-at-top

if not flags.FLAGS.is_parsed():
  flags.FLAGS.mark_as_parsed()
