"""Pytest setup shared by all tests: eight simulated CPU devices for sharding tests."""

import os

# Must happen before JAX initialises its backends.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

# absltest helpers (create_tempdir, flag defaults) need parsed flags; pytest never parses them.
from absl import flags  # pylint: disable=g-import-not-at-top

if not flags.FLAGS.is_parsed():
  flags.FLAGS.mark_as_parsed()
