"""One compilation cache for the whole test session.

Many tests compile the same tiny programs again: each `jit_train_step` call is a new jitted
function, and the CLI tests start a fresh process per command. JAX's persistent compilation
cache (the one `main.py` turns on for users, `distributed.enable_compilation_cache`) turns each
repeat into a disk read. The session gets an empty directory of its own, so a test run neither
reads nor fills the user's cache and always starts cold, as CI does; pytest-xdist workers and
the subprocesses the tests start inherit it through TRANSFORMER_JAX_JIT_CACHE.
"""

import os
import shutil
import tempfile

import jax

from transformer_jax import distributed

_OWNED = "_TRANSFORMER_JAX_TEST_JIT_CACHE_OWNER"


def pytest_configure(config):
  del config
  if distributed.JIT_CACHE_ENV not in os.environ:  # "" turns the cache off
    os.environ[distributed.JIT_CACHE_ENV] = tempfile.mkdtemp(prefix="transformer_jax_test_jit_")
    os.environ[_OWNED] = str(os.getpid())
  distributed.enable_compilation_cache()


def pytest_unconfigure(config):
  del config
  if os.environ.get(_OWNED) == str(os.getpid()):  # the process that made it (xdist's controller)
    shutil.rmtree(os.environ[distributed.JIT_CACHE_ENV], ignore_errors=True)
