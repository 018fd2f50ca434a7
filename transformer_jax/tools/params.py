"""Parameter counts, exact, from the model's own initializer (nothing is allocated).

  python -m transformer_jax.tools.params --config=configs/big.py
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from transformer_jax.model.transformer import Transformer
from transformer_jax.runtime.config import ModelConfig


def param_shapes(cfg: ModelConfig):
  """The parameter tree of `cfg` as ShapeDtypeStructs (logical-axis boxes removed)."""
  ids = jnp.ones((1, 4), jnp.int32)
  variables = jax.eval_shape(lambda: Transformer(cfg).init(jax.random.key(0), ids, ids))
  return nn.meta.unbox(variables["params"])


def count_params(cfg: ModelConfig) -> int:
  """Counted on the one-layer twin: every layer of a stack has the same parameters, so N layers
  are the twin's count plus N-1 more of its layer_0. One layer a stack is traced, whatever N
  (Table 3's reports count 20 paper-scale models; the `scan_layers` twin traced slower)."""
  one = param_shapes(cfg.replace(num_encoder_layers=1, num_decoder_layers=1, scan_layers=False))
  per_layer = {stack: count_tree(one[stack]["layer_0"]) for stack in ("encoder", "decoder")}
  return (count_tree(one) + (cfg.num_encoder_layers - 1) * per_layer["encoder"]
          + (cfg.num_decoder_layers - 1) * per_layer["decoder"])


def count_tree(params) -> int:
  return int(sum(np.size(leaf) for leaf in jax.tree.leaves(params)))


def main(argv):
  del argv
  cfg = ModelConfig.from_config(_CONFIG.value.model)
  print(f"{count_params(cfg):,} parameters ({count_params(cfg) / 1e6:.1f}M)")


if __name__ == "__main__":
  from absl import app  # pylint: disable=g-import-not-at-top
  from ml_collections import config_flags  # pylint: disable=g-import-not-at-top
  _CONFIG = config_flags.DEFINE_config_file("config", "configs/base.py", "Run config file.")
  app.run(main)
