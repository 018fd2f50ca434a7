"""Shared test settings: where the real data is (the same setting users and CI use)."""

import os

import pytest

DATA_DIR = os.environ.get("TRANSFORMER_JAX_DATA_DIR", "")

requires_data = pytest.mark.skipif(
    not (DATA_DIR and os.path.isdir(os.path.join(DATA_DIR, "multi30k"))),
    reason="set TRANSFORMER_JAX_DATA_DIR to the shared data folder (CI sets ../shared/data)")
