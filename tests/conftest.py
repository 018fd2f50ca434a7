"""The suite's XLA flags (tests/common.py says why), and one compilation cache for the whole
test session, and only for it.

A module whose module-scoped fixture is costly (a trained workdir, a vocabulary, the 8-device
sharding report) is marked `pytest.mark.xdist_group(__name__)`, and pyproject.toml runs xdist
with --dist=loadgroup: its tests then run on one worker, which builds the fixture once. Spread
over both workers, each built it (or, for the sharding report, one waited for the other's).

The CLI tests start a fresh process per command, and `main.py` turns JAX's persistent
compilation cache on for users (`distributed.enable_compilation_cache`, by default in
~/.cache). Sharing that user cache, the suite's wall time would depend on what earlier runs
left there, and a stale entry could reach a test. So the session gets an empty directory of its
own and every run starts cold, as CI does; pytest-xdist workers and the subprocesses the tests
start inherit it through TRANSFORMER_JAX_JIT_CACHE. In-process tests use it too (each
`jit_train_step` call is a new jitted function: a repeated program is a disk read), which pays
off in the tests that compile one program several times; for the whole suite it is about even
with the warm user cache it replaces.
"""

import os
import shutil
import tempfile

from tests.common import SUITE_XLA_FLAGS, xla_flags
from transformer_jax.runtime import distributed

_OWNED = "_TRANSFORMER_JAX_TEST_JIT_CACHE_OWNER"


def pytest_configure(config):
  del config
  # Before any test starts a backend; xdist workers and subprocesses inherit it.
  flags = os.environ.get("XLA_FLAGS", "")
  if SUITE_XLA_FLAGS not in flags:  # xdist workers find it set by the controller
    os.environ["XLA_FLAGS"] = xla_flags(flags)
  if distributed.JIT_CACHE_ENV not in os.environ:  # "" turns the cache off
    os.environ[distributed.JIT_CACHE_ENV] = tempfile.mkdtemp(prefix="transformer_jax_test_jit_")
    os.environ[_OWNED] = str(os.getpid())
  # Every program, however quickly compiled: CLI runs compile the same small programs again and
  # again (enable_compilation_cache reads it, here and in every subprocess).
  os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
  distributed.enable_compilation_cache()


def pytest_unconfigure(config):
  del config
  if os.environ.get(_OWNED) == str(os.getpid()):  # the process that made it (xdist's controller)
    shutil.rmtree(os.environ[distributed.JIT_CACHE_ENV], ignore_errors=True)
