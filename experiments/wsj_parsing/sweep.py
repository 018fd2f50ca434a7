"""Settings of the treebank-sample parser (configs/wsj_parsing.py:sample), chosen on dev.

  python -m experiments.harness.runner --sweep=experiments/wsj_parsing --scale=pilot \
      --out=W --parallel=2                     # every row, seed 0

Each row changes one setting of the pinned pilot protocol (configs/wsj_parsing.py:pilot, the
sample parser's settings before this sweep) and trains the same 900 steps; the runner scores the
last checkpoint on the sample's dev split (wsj_0160-wsj_0179: perplexity on all 273 trees, bracket
F1 of beam-21 parses of the first 100). Rows compare at equal steps, so a result does not depend
on the machine's load; every row costs the same per step. The sample has no test split: nothing
here is chosen on test. What was measured: experiments/wsj_parsing/README.md.
"""

import ml_collections

from experiments.harness import define

# Paths that results committed before this study had its folder recorded in their commands.
FORMER_PATHS = {"experiments/wsj_parsing.py": "experiments/wsj_parsing"}


def get_config(arg: str = ""):
  del arg
  c = define.new_sweep("wsj_parsing", "The treebank-sample parser's settings, dev split",
                       reference={})
  c.scales = ml_collections.ConfigDict()
  c.scales.pilot = define.scale(
      "configs/wsj_parsing.py:pilot", num_steps=900, bleu_sentences=100, seeds=(0,),
      description="WSJ parsing on the treebank sample (train wsj_0001-0159, dev wsj_0160-0179): "
                  "3 + 3 pre-LN layers, d_model 256, 4000 shared BPE pieces, ~2048 target tokens "
                  "a batch, 900 steps; dev perplexity on all 273 trees, F1 (EVALB COLLINS.prm) of "
                  "beam-21 parses (alpha 0.3) of the first 100")
  row = lambda *a, **k: define.add_row(c, *a, **k)  # noqa: E731
  row("base", label="the pilot protocol (lrate scale 0.7, dropout 0.1)", group="base")
  row("lr10", label="lrate scale 1.0 (peak 3.6e-3; base 2.5e-3)", group="rate",
      overrides={"train.learning_rate_scale": 1.0})
  row("drop03", label="dropout 0.3 (paper 0.1; chosen on dev in §6.3)", group="regularisation",
      overrides={"model.dropout_rate": 0.3})
  row("words", label="targets write each word, not XX (data.parse_leaves='words')",
      group="linearization", overrides={"data.parse_leaves": "words"})
  row("words_constrained", label="words, and a search that writes only trees over them "
      "(decode.parse_constraint)", group="decoding",
      overrides={"data.parse_leaves": "words", "decode.parse_constraint": True})
  return c
