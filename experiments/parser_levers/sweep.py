"""Levers on the treebank-sample parser, chosen by cross-validation over the training files.

  python -m experiments.harness.runner --sweep=experiments/parser_levers --scale=cv0 \
      --out=W/cv0 --parallel=2           # every row on fold 0; then cv1, cv2
  python -m experiments.harness.runner --sweep=experiments/parser_levers --scale=cv0_2400 \
      --out=W/cv0_2400 --parallel=2      # the same folds trained longer (and cv0_3900)
  python -m experiments.harness.runner --sweep=experiments/parser_levers --scale=dev \
      --out=W/dev --rows=base            # the fixed dev split, reported, never chosen on
  python -m experiments.harness.runner --sweep=experiments/parser_levers --scale=dev25 \
      --out=W/dev25 --rows=base          # the learning curve: 25% (and dev50: 50%) of the files
  python -m experiments.harness.runner --sweep=experiments/parser_levers --scale=dev25_2400 \
      --out=W/dev25_2400 --rows=base     # the same at the longer budget (dev_2400, dev50_2400)

The sample's dev split (wsj_0160-wsj_0179, 273 trees) is too small to choose on: a checkpoint's
F1 there and on 245 trees of other files differed by 9 points. So each lever is chosen on three
folds of the training files wsj_0001-wsj_0159 (scales cv0..cv2: train on two thirds, score the
held-back third, ~1100 trees), and the fixed dev split (scale `dev`) is only reported. Each row
changes one setting of the pinned protocol (protocol.py) and trains the same steps (rows that
change only decoding are scored on base's runs); decoding is the constrained search on the first
FOLD_SENTENCES held-back sentences, perplexity on all.
How the folds are combined, and what was measured: README.md.
"""

import ml_collections

from experiments.harness import define

PROTOCOL = "experiments/parser_levers/protocol.py"
TRAIN_FILES = (1, 159)  # wsj_0001-wsj_0159: the sample's training files
FOLDS = 3
FOLD_SENTENCES = 200
# The folds' step budgets: the protocol's (scales cv0..cv2) and each longer one (cv0_2400, ...),
# a family of folds of its own whose verdicts are read across its folds only. 3900 steps make
# about as many passes over a fold's trees (two thirds of the files) as the sample's hour makes
# over all of them (experiments/results/wsj_sample.md): regularisers are judged where the sample
# overfits, which the shorter budgets end before.
FOLD_STEPS = (1200, 2400, 3900)
CURVE = ((25, 40), (50, 80))  # (share of the training files, the last file): wsj_0001-wsj_0040, ...
# A row stacked on an adopted training lever is judged against that lever's row, not base: the
# protocol stays pinned (every result regenerates at it) while levers accumulate.
REFERENCE = {"wp_drop02": "wordpos", "wp_pointer": "wordpos", "wp_bpedrop": "wp_drop02",
             "wp_drop03": "wp_drop02", "wp_attrelu": "wp_drop02", "wp_sub2": "wp_drop02",
             "wp_sub4": "wp_sub2", "wp_sub2_avg2": "wp_sub2", "wp_sub2_avg3": "wp_sub2",
             "wp_sub2_drop01": "wp_sub2", "wp_sub2_drop03": "wp_sub2"}


def fold_files(fold: int, folds: int = FOLDS, first_last: tuple[int, int] = TRAIN_FILES):
  """(train_files, eval_files) of `fold`: the training files cut into `folds` consecutive
  ranges, one held back."""
  first, last = first_last
  size = -(-(last - first + 1) // folds)
  ranges = [(first + i * size, min(last, first + (i + 1) * size - 1)) for i in range(folds)]
  spec = lambda a, b: f"wsj_{a:04d}-wsj_{b:04d}"  # noqa: E731
  held = ranges[fold]
  return ",".join(spec(a, b) for i, (a, b) in enumerate(ranges) if i != fold), spec(*held)


def budget_scale(name: str, steps: int = FOLD_STEPS[0]) -> str:
  """The scale `name` trained for `steps`: `name` at the protocol's steps, else e.g. 'dev_2400'."""
  return name if steps == FOLD_STEPS[0] else f"{name}_{steps}"


def fold_scale(fold: int, steps: int = FOLD_STEPS[0]) -> str:
  """The scale that trains `fold` for `steps`: 'cv0' at the protocol's steps, else 'cv0_2400'."""
  return budget_scale(f"cv{fold}", steps)


def fold_steps(scale_name: str) -> int | None:
  """The step budget of a fold scale (the inverse of fold_scale); None for another scale."""
  return next((steps for steps in FOLD_STEPS for fold in range(FOLDS)
               if fold_scale(fold, steps) == scale_name), None)


def get_config(arg: str = ""):
  del arg
  c = define.new_sweep("parser_levers", "Levers on the treebank-sample parser, three folds",
                       reference={}, report_sections=("experiments/parser_levers/report.py",))
  c.scales = ml_collections.ConfigDict()
  for steps in FOLD_STEPS:
    for fold in range(FOLDS):
      train, held = fold_files(fold)
      c.scales[fold_scale(fold, steps)] = define.scale(
          PROTOCOL, num_steps=0 if steps == FOLD_STEPS[0] else steps,
          bleu_sentences=FOLD_SENTENCES, seeds=(0,),
          overrides={"data.train_files": train, "data.eval_files": held},
          description=f"fold {fold} of {FOLDS}: train {train}, score the held-back {held} "
                      f"(constrained beam-21 F1 on its first {FOLD_SENTENCES} trees, perplexity "
                      f"on all); 3 + 3 pre-LN layers of 256, {steps} steps")
  for steps in FOLD_STEPS:  # the fixed dev split and the learning curve, at each step budget
    c.scales[budget_scale("dev", steps)] = define.scale(
        PROTOCOL, num_steps=0 if steps == FOLD_STEPS[0] else steps, bleu_sentences=0,
        seeds=(0,),
        description=f"the sample's fixed dev split (wsj_0160-wsj_0179, all 273 trees), trained "
                    f"on wsj_0001-wsj_0159 for {steps} steps: reported, never chosen on")
    for share, last in CURVE:  # the learning curve: the first files only, the same steps
      c.scales[budget_scale(f"dev{share}", steps)] = define.scale(
          PROTOCOL, num_steps=0 if steps == FOLD_STEPS[0] else steps, bleu_sentences=0,
          seeds=(0,), overrides={"data.train_files": f"wsj_0001-wsj_{last:04d}"},
          description=f"the learning curve at {share}% of the training files (wsj_0001-wsj_"
                      f"{last:04d}), {steps} steps, scored on the fixed dev split")
  row = lambda *a, **k: define.add_row(c, *a, **k)  # noqa: E731
  row("base", label="the protocol (the sample's settings at 1200 steps)", group="base")
  row("lr10", label="lrate scale 1.0 (base 0.7)", group="rate",
      overrides={"train.learning_rate_scale": 1.0})
  row("lr05", label="lrate scale 0.5 (base 0.7)", group="rate",
      overrides={"train.learning_rate_scale": 0.5})
  row("warm600", label="warmup 600 (base 300)", group="rate",
      overrides={"train.warmup_steps": 600})
  row("drop02", label="dropout 0.2 (base 0.1)", group="regularisation",
      overrides={"model.dropout_rate": 0.2})
  row("drop03", label="dropout 0.3 (base 0.1)", group="regularisation",
      overrides={"model.dropout_rate": 0.3})
  row("ls0", label="no label smoothing (base 0.1)", group="regularisation",
      overrides={"train.label_smoothing": 0.0})
  row("wd0", label="no weight decay (base 0.1)", group="regularisation",
      overrides={"train.weight_decay": 0.0})
  row("bpedrop", label="BPE-dropout 0.1 on the words in (unseen-word handling; base none)",
      group="regularisation", overrides={"data.bpe_dropout": 0.1,
                                         "data.bpe_dropout_target": False})
  row("deep4", label="4 + 4 layers (the paper's parser depth; base 3 + 3)", group="size",
      overrides={"model.num_encoder_layers": 4, "model.num_decoder_layers": 4})
  row("wide384", label="d_model 384, 6 heads of 64, d_ff 1536 (base 256, 4, 1024)",
      group="size", overrides={"model.d_model": 384, "model.num_heads": 6,
                               "model.d_ff": 1536})
  row("wordpos", label="word positions: the next leaf's index embedded (base none)",
      group="linearization", overrides={"model.word_positions": True})
  # Stacked on word positions, each judged against the row wordpos (REFERENCE): with them the
  # held-back perplexity is far above the training one, so regularisation is the next lever.
  wordpos = {"model.word_positions": True}
  row("wp_drop02", label="dropout 0.2, with word positions (against wordpos)",
      group="on word positions", overrides={**wordpos, "model.dropout_rate": 0.2})
  # Stacked on dropout 0.2 with word positions, each judged against the row wp_drop02.
  drop02 = {**wordpos, "model.dropout_rate": 0.2}
  row("wp_bpedrop", label="BPE-dropout 0.1 on the words in, with word positions and dropout 0.2 "
      "(against wp_drop02)", group="on word positions",
      overrides={**drop02, "data.bpe_dropout": 0.1, "data.bpe_dropout_target": False})
  row("wp_drop03", label="dropout 0.3, with word positions (against wp_drop02)",
      group="on word positions", overrides={**wordpos, "model.dropout_rate": 0.3})
  row("wp_attrelu", label="attention and ReLU dropout 0.1 (tensor2tensor's later defaults; base "
      "0), with word positions and dropout 0.2 (against wp_drop02)", group="on word positions",
      overrides={**drop02, "model.attention_dropout_rate": 0.1, "model.relu_dropout_rate": 0.1})
  sub2 = {**drop02, "data.parse_substitute": 2}
  row("wp_sub2", label="two subtree-substituted copies of each training tree, with word positions "
      "and dropout 0.2 (against wp_drop02)", group="on word positions", overrides=sub2)
  row("wp_sub4", label="four subtree-substituted copies of each training tree, with word "
      "positions and dropout 0.2 (against wp_sub2)", group="on word positions",
      overrides={**sub2, "data.parse_substitute": 4})
  # Stacked on the adopted copies, each judged against the row wp_sub2; the averaging rows decode
  # wp_sub2's own runs (decode.* only), so they cost an evaluation, not a training run. With the
  # copies the sample's dev perplexity falls to the end of its hour, so dropout is asked again,
  # both ways.
  row("wp_sub2_avg2", label="the last 2 checkpoints averaged, with two substituted copies "
      "(against wp_sub2)", group="on word positions",
      overrides={**sub2, "decode.average_checkpoints": 2})
  row("wp_sub2_avg3", label="the last 3 checkpoints averaged, with two substituted copies "
      "(against wp_sub2)", group="on word positions",
      overrides={**sub2, "decode.average_checkpoints": 3})
  row("wp_sub2_drop01", label="dropout 0.1, with two substituted copies (against wp_sub2)",
      group="on word positions", overrides={**sub2, "model.dropout_rate": 0.1})
  row("wp_sub2_drop03", label="dropout 0.3, with two substituted copies (against wp_sub2)",
      group="on word positions", overrides={**sub2, "model.dropout_rate": 0.3})
  row("wp_pointer", label="the word pointer: the next word's encoder output into the decoder, "
      "with word positions (against wordpos)", group="on word positions",
      overrides={**wordpos, "model.word_pointer": True})
  # Decoding only: each is scored on base's trained runs (the runner trains them once).
  row("alpha0", label="length penalty alpha 0 (base 0.3)", group="decoding",
      overrides={"decode.alpha": 0.0})
  row("alpha06", label="length penalty alpha 0.6 (base 0.3)", group="decoding",
      overrides={"decode.alpha": 0.6})
  row("beam10", label="beam 10 (base 21)", group="decoding", overrides={"decode.beam_size": 10})
  row("avg2", label="the last 2 checkpoints averaged (base none)", group="decoding",
      overrides={"decode.average_checkpoints": 2})
  row("avg3", label="the last 3 checkpoints averaged (base none)", group="decoding",
      overrides={"decode.average_checkpoints": 3})
  row("opens6", label="at most 6 brackets opened in a row (base 8)", group="decoding",
      overrides={"decode.parse_max_opens_in_a_row": 6})
  row("unary3", label="unary chains of at most 3 phrases (base 4)", group="decoding",
      overrides={"decode.parse_max_unary_chain": 3})
  return c
