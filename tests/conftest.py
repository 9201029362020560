"""Pytest setup shared by all tests: eight simulated CPU devices, programs compiled fast.

See `tests/fixtures/xla_flags.py` for why the suite compiles at XLA optimisation level 0. An
`XLA_FLAGS` already set in the environment is kept as it is.
"""

import atexit
import os
import shutil
import tempfile

from tests.fixtures import xla_flags

# Must happen before JAX initialises its backends.
os.environ.setdefault("XLA_FLAGS", xla_flags.suite_flags(8))
os.environ.setdefault("JAX_PLATFORMS", "cpu")

# Each test process (`make test` runs several) gets its own absltest temp root, inside the
# given TEST_TMPDIR or the system's: absltest names a test's directories by class and method,
# and cleans them up, so two processes sharing one root could remove each other's files. Must
# happen before absltest is imported (it reads TEST_TMPDIR once).
os.environ["TEST_TMPDIR"] = tempfile.mkdtemp(prefix="agentic_grpo_tests_",
                                             dir=os.environ.get("TEST_TMPDIR") or None)
atexit.register(shutil.rmtree, os.environ["TEST_TMPDIR"], ignore_errors=True)

# absltest helpers (create_tempdir, flag defaults) need parsed flags; pytest never parses them.
from absl import flags  # pylint: disable=g-import-not-at-top

if not flags.FLAGS.is_parsed():
  flags.FLAGS.mark_as_parsed()


import gc  # pylint: disable=g-import-not-at-top,g-bad-import-order

import jax  # pylint: disable=g-import-not-at-top
import pytest  # pylint: disable=g-import-not-at-top


@pytest.fixture(autouse=True, scope="module")
def _free_compiled_programs():
  """Drops JAX's compiled programs after each test file.

  Each XLA:CPU executable holds about six memory mappings; a test process compiles thousands of
  programs over the files it runs, and past the kernel's `vm.max_map_count` (65,530 by default)
  LLVM cannot map the next one ("LLVM compilation error: Cannot allocate memory") and the
  process crashes. Clearing the caches (and what only they held) frees those mappings.
  """
  yield
  jax.clear_caches()
  gc.collect()
