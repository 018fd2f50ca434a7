"""Parameter counts, exact, from the model's own initializer (nothing is allocated).

  python -m transformer_jax.tools.params --config=configs/big.py [--config.KEY=VALUE]...

JAX and the model are imported when a count is asked for: a mistake in the flags or the config
is reported (one line, exit 2) before they load.
"""

from __future__ import annotations

from absl import flags

from transformer_jax.runtime import cli, overrides as overrides_lib
from transformer_jax.runtime.config import ModelConfig
from transformer_jax.runtime.exceptions import ConfigError

# Its own flag set: other entry points import this module beside their own `--config`.
FLAGS = flags.FlagValues()
flags.DEFINE_string("config", "configs/base.py", "Run config file (with an optional :variant).",
                    flag_values=FLAGS)


def param_shapes(cfg: ModelConfig):
  """The parameter tree of `cfg` as ShapeDtypeStructs (logical-axis boxes removed)."""
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from transformer_jax.model.transformer import Transformer  # pylint: disable=g-import-not-at-top
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
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  return int(sum(np.size(leaf) for leaf in jax.tree.leaves(params)))


def main(argv):
  if len(argv) > 1:
    raise ConfigError(f"unexpected arguments: {' '.join(argv[1:])}")
  cfg = ModelConfig.from_config(overrides_lib.load(FLAGS.config, cli.OVERRIDE_ARGS).model)
  count = count_params(cfg)
  print(f"{count:,} parameters ({count / 1e6:.1f}M)")


if __name__ == "__main__":
  cli.run(main, flag_values=FLAGS)
