"""Loading the flax WMT example's own modules (models.py, train.py, decode.py) unchanged, for the
side-by-side benchmarks (flax_wmt.py: the train step; flax_wmt_decode.py: beam-search decoding)."""

import importlib
import importlib.util
import os
import sys
import types

from transformer_jax.config import ConfigError


def _module(name: str, **attributes) -> types.ModuleType:
  module = types.ModuleType(name)
  module.__dict__.update(attributes)
  return module


def load_flax_wmt(folder: str, with_decode: bool = False):
  """Their (models, train) modules.

  What train.py touches at import gets a stand-in while it loads, removed again afterwards:
  their bleu and input_pipeline modules always (they read data through TensorFlow and only the
  evaluation functions use them), and decode.py unless `with_decode` (it needs only jax, so
  the decoding side-by-side loads the real one); TensorFlow, when not installed, as a
  module whose `data.Dataset` exists (train.py's signatures annotate with it); clu, when not
  installed, with the `metric_writers` and `periodic_actions` it imports.
  """
  for name in ("models.py", "train.py"):
    if not os.path.isfile(os.path.join(folder, name)):
      raise ConfigError(f"--flax_wmt_dir={folder}: no {name} (expected flax's examples/wmt)")
  # What train.py imports from flax, first: their optional TensorFlow imports must see the truth.
  for name in ("flax.jax_utils", "flax.training.checkpoints", "flax.training.dynamic_scale"):
    importlib.import_module(name)
  stubbed = ("bleu", "input_pipeline") + (() if with_decode else ("decode",))
  stubs = {name: _module(name) for name in stubbed}
  if importlib.util.find_spec("tensorflow") is None:
    dataset = type("Dataset", (), {"__module__": "tensorflow.data"})
    stubs["tensorflow"] = _module("tensorflow", data=_module("tensorflow.data", Dataset=dataset))
  if importlib.util.find_spec("clu") is None:
    parts = {p: _module(f"clu.{p}") for p in ("metric_writers", "periodic_actions")}
    stubs.update({f"clu.{p}": m for p, m in parts.items()}, clu=_module("clu", **parts))
  added = [name for name in stubs if name not in sys.modules]
  sys.modules.update({name: stubs[name] for name in added})
  sys.path.insert(0, folder)
  try:
    return importlib.import_module("models"), importlib.import_module("train")
  finally:
    sys.path.remove(folder)
    for name in added + (["decode"] if with_decode else []):
      sys.modules.pop(name, None)  # their top-level names must not shadow anything later


def check_command_line(argv, flax_wmt_dir: str | None) -> None:
  """The side-by-sides' one-line errors: stray arguments, no --flax_wmt_dir."""
  if len(argv) > 1:
    raise ConfigError(f"unexpected arguments {' '.join(argv[1:])}")
  if not flax_wmt_dir:
    raise ConfigError("--flax_wmt_dir is required (a checkout of flax's examples/wmt)")

