"""Levers on the Multi30k recipe, as a sweep: each row one change to the pinned recipe
(experiments/multi30k_levers/protocol.py), trained the same 2700 steps, scored on all of dev.

  python -m experiments.harness.runner --sweep=experiments/multi30k_levers --scale=at2700 \
      --out=W --parallel=2                     # every row; base with seeds 0, 1 and 2
  python -m experiments.harness.runner --sweep=experiments/multi30k_levers --scale=at2700 \
      --out=W --rows=lr05 --seeds=1            # one row at another seed

Rows compare at equal steps, not equal minutes, so a row's result does not depend on the
machine's load. What each lever measured: experiments/multi30k_levers/README.md.
"""

import ml_collections

from experiments.harness import define

# Paths that results committed before this study had its folder recorded in their commands.
FORMER_PATHS = {"experiments/multi30k_levers.py": "experiments/multi30k_levers",
                "configs/multi30k_levers.py": "experiments/multi30k_levers/protocol.py"}


def get_config(arg: str = ""):
  del arg
  c = define.new_sweep("multi30k_levers", "Levers on the Multi30k recipe at 2700 steps, dev split",
                       reference={})
  c.scales = ml_collections.ConfigDict()
  c.scales.at2700 = define.scale(
      "experiments/multi30k_levers/protocol.py", num_steps=0, bleu_sentences=0, seeds=(0,),
      base_seeds=(0, 1, 2), overrides={"train.progress_bar": False},
      description="Multi30k en-de, the recipe pinned in experiments/multi30k_levers/protocol.py "
                  "(d_model 256, "
                  "3 + 3 layers, ~2048 + 2048 tokens a batch, lrate scale 0.7, weight decay "
                  "0.1), 2700 steps, a checkpoint every 90, BLEU (alpha 0.6) on all 1014 dev "
                  "sentences; base with seeds 0-2, the seed spread every row is judged against")
  row = lambda *a, **k: define.add_row(c, *a, **k)  # noqa: E731
  row("base", label="the recipe", group="base")
  row("drop01_lr05", label="dropout 0.1 (recipe 0.2), lrate scale 0.5", group="regularisation",
      overrides={"model.dropout_rate": 0.1, "train.learning_rate_scale": 0.5})
  row("ls02", label="label smoothing 0.2 (paper 0.1)", group="regularisation",
      overrides={"train.label_smoothing": 0.2})
  row("preln", label="pre-LN (paper post-LN)", group="architecture",
      overrides={"model.pre_ln": True})
  row("lr10", label="lrate scale 1.0 (peak 3.1e-3)", group="rate",
      overrides={"train.learning_rate_scale": 1.0})
  row("lr05", label="lrate scale 0.5 (peak 1.6e-3; measured at --seeds=1)", group="rate",
      overrides={"train.learning_rate_scale": 0.5})
  row("news_x6", label="31k WMT news pairs mixed in, Multi30k upsampled x6", group="data",
      overrides={"data.extra_train_files": "wmt-news/train", "data.upsample_primary": 6})
  return c
