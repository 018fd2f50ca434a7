"""A published parser trained from scratch on our treebank split, scored beside ours.

  python -m benchmarks.parser_peer --config=configs/wsj_parsing.py:sample --minutes=60 \
      --threads=2 [--ours=W/eval/validation_stepN.txt]

The peer is supar's CRF constituency parser (Zhang, Zhou and Li 2020, "Fast and Accurate Neural
CRF Constituency Parsing": a BiLSTM over word and character-LSTM embeddings, biaffine span
scores, a tree CRF; `pip install -e ".[peer]"`). It trains on the config's training files,
preprocessed by our treebank reader (tasks/parsing/treebank.py) so both parsers see the same
trees, with no pretrained vectors (ours uses none, and none are available offline), the
paper's hyperparameters (PEER_SETTINGS), for `--minutes` of training, whole epochs only: an
epoch starts only while the last epoch's time still fits. No epoch is chosen on a dev split
(supar's own `train` keeps the epoch best on dev, which would choose on the split reported
here): the last epoch is scored, as our runs score their last checkpoint.

Its dev trees are scored twice, by our EVALB reimplementation (tasks/parsing/parseval.py) and by
supar's own span metric; `--ours` (a file of our trees, one per dev sentence, as `--mode=eval`
writes them) is scored by both too, so each metric cross-checks the other on both parsers.
`--clock=process` counts the training budget in CPU seconds of this process (with --threads=1
the time an idle core would take), so that a run beside other work still gets its budget.
"""

from __future__ import annotations

import os
import tempfile
import time

from absl import flags, logging

from transformer_jax.runtime import cli, overrides as overrides_lib
from transformer_jax.runtime.exceptions import ConfigError
from transformer_jax.tasks import registry
from transformer_jax.tasks.parsing import parseval, treebank

from benchmarks import report, settings as settings_lib

# Zhang et al. 2020, section 4 and supar's released CRF constituency config (char features):
# Adam(2e-3, 0.9, 0.9, eps 1e-12), learning rate x0.75 every 5000 steps, gradients clipped at
# 5, batches of 5000 tokens; words seen at least twice get an embedding; the model's sizes are
# supar's CRFConstituencyModel defaults (3 BiLSTM layers of 400, dropout 0.33, span MLP 500,
# label MLP 100, char LSTM 50 -> 100). MBR decoding, as their released model.
PEER_SETTINGS = {
    "feat": ["char"], "encoder": "lstm", "n_embed": 100, "n_char_embed": 50,
    "n_char_hidden": 100, "n_feat_embed": 100, "embed_dropout": 0.33, "n_lstm_hidden": 400,
    "n_lstm_layers": 3, "encoder_dropout": 0.33, "n_span_mlp": 500, "n_label_mlp": 100,
    "mlp_dropout": 0.33, "lr": 2e-3, "mu": 0.9, "nu": 0.9, "eps": 1e-12, "weight_decay": 0.0,
    "decay": 0.75, "decay_steps": 5000, "clip": 5.0, "batch_size": 5000, "buckets": 32,
    "min_freq": 2, "fix_len": 20, "mbr": True, "update_steps": 1,
}
# supar's evaluation conventions (its CRFConstituencyParser.evaluate defaults): EVALB's
# COLLINS.prm deletions and ADVP = PRT.
PEER_DELETE = frozenset({"TOP", "S1", "-NONE-", ",", ":", "``", "''", ".", "?", "!", ""})
PEER_EQUAL = {"ADVP": "PRT"}


def define_flags(values: flags.FlagValues) -> None:
  """The command's flags, in `values` (flags.FLAGS when it runs; a fresh set to resolve a
  recorded command)."""
  def define(kind, name, default, help_text, **kwargs):
    getattr(flags, f"DEFINE_{kind}")(name, default, help_text, flag_values=values, **kwargs)
  define("string", "config", "configs/wsj_parsing.py:sample",
         "a parsing run config: its data.local_corpus, train_files and eval_files are the trees")
  define("float", "minutes", 50.0, "training budget (whole epochs that fit)", lower_bound=0.0)
  flags.DEFINE_enum("clock", "wall", ["wall", "process"], "what the budget counts: wall time, "
                    "or this process's CPU time", flag_values=values)
  define("integer", "threads", 1, "torch threads", lower_bound=1)
  define("integer", "seed", 1, "torch seed")
  define("integer", "max_epochs", 1000, "at most this many epochs", lower_bound=1)
  define("string", "ours", None, "our parser's dev trees (one per line, in dev order), scored "
         "beside the peer's by both metrics")
  define("string", "out", "experiments/results/parser_peer",
         "writes OUT.json and OUT.md ('' to write nothing)")


def settings(values: flags.FlagValues, override_args) -> dict:
  """What a run with these flags measures (benchmarks/settings.py): the budget, the peer's
  hyperparameters and the run config's treebank keys."""
  config = overrides_lib.load(values.config, override_args)
  if registry.get(config).name != "parsing":
    raise ConfigError(f"--config={values.config}: config key 'data.task' is "
                      f"{config.data.task!r}; the peer is a parser")
  own = {k: values[k].value for k in ("minutes", "clock", "threads", "seed", "max_epochs")}
  own.update({f"peer.{k}": v for k, v in PEER_SETTINGS.items()})
  data = {k: config.data[k] for k in ("local_corpus", "train_files", "eval_files")}
  return settings_lib.normalized({**settings_lib.benchmark_settings(own),
                                  **settings_lib.config_settings("data", {"data": data})})


def _supar():
  try:
    import supar  # pylint: disable=g-import-not-at-top
    import torch  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ConfigError(f"benchmarks.parser_peer needs the 'peer' extra (supar and torch): "
                      f"pip install -e \".[peer]\" ({e})") from None
  return supar, torch


def write_trees(path: str, trees) -> None:
  """Tree texts one per line: the file format supar reads."""
  with open(path, "w", encoding="utf-8") as f:
    for t in trees:
      f.write(t + "\n")


def peer_tree_text(tree) -> str:
  """A supar output tree as our scorer reads it: one line, rooted at TOP."""
  if tree.label() != treebank.ROOT:
    tree = type(tree)(treebank.ROOT, [tree])
  return treebank.tree_text(tree)


def with_gold_tags(test, gold):
  """`test` with `gold`'s part-of-speech tags on its preterminals. EVALB deletes punctuation by
  the gold tags; supar's metric reads them off each tree it scores, so a parser that predicts
  no tags (ours writes XX) would keep its punctuation and shift every span after it."""
  test = test.copy(deep=True)
  for leaf, (_, tag) in zip(test.treepositions("leaves"), gold.pos()):
    test[leaf[:-1]].set_label(tag)
  return test


def peer_metric(golds, tests) -> dict:
  """supar's own labeled span metric (its Tree.factorize with its EVALB-like deletions, by the
  gold tags as EVALB's) over nltk trees: LP, LR, LF and complete match, in percent."""
  from supar.utils.metric import SpanMetric  # pylint: disable=g-import-not-at-top
  from supar.utils.transform import Tree  # pylint: disable=g-import-not-at-top
  metric = SpanMetric()
  tests = [with_gold_tags(t, g) for t, g in zip(tests, golds)]
  metric([Tree.factorize(t, PEER_DELETE, PEER_EQUAL) for t in tests],
         [Tree.factorize(g, PEER_DELETE, PEER_EQUAL) for g in golds])
  return {"precision": 100 * metric.lp, "recall": 100 * metric.lr, "f1": 100 * metric.lf,
          "exact_match": 100 * metric.lcm}


def score(golds, tests) -> dict:
  """Both metrics of one parser's dev trees."""
  ours = parseval.score_trees(golds, tests)
  return {"parseval": {k: ours[k] for k in ("f1", "precision", "recall", "exact_match")}
          | {"le40_f1": ours["le40"]["f1"], "matched": ours["matched_brackets"],
             "gold": ours["gold_brackets"], "test": ours["test_brackets"]},
          "supar_metric": peer_metric(golds, tests)}


def read_ours(path: str, golds) -> list:
  """Our dev trees from `path`, checked to be over the dev sentences' words."""
  try:
    with open(path, encoding="utf-8-sig") as f:
      lines = [line.rstrip("\n") for line in f]
  except OSError as e:
    raise ConfigError(f"--ours={path}: cannot read it ({e.strerror or e})") from None
  if len(lines) != len(golds):
    raise ConfigError(f"--ours={path}: {len(lines)} lines for {len(golds)} dev trees")
  trees = treebank.read_tree_texts(lines, f"--ours={path}")
  for i, (t, g) in enumerate(zip(trees, golds)):
    if t.leaves() != g.leaves():
      raise ConfigError(f"--ours={path}: the tree on line {i + 1} is over other words than dev "
                        "sentence {i + 1}")
  return trees


def train_peer(train_path: str, folder: str, minutes: float, clock: str, threads: int, seed: int,
               max_epochs: int) -> tuple[object, list[dict]]:
  """supar's parser built on `train_path` and trained epoch by epoch within the budget:
  (the parser, one record per epoch)."""
  supar, torch = _supar()
  from supar.utils import Dataset  # pylint: disable=g-import-not-at-top
  from supar.utils.parallel import init_device  # pylint: disable=g-import-not-at-top
  torch.set_num_threads(threads)
  torch.manual_seed(seed)
  init_device("-1")
  now = time.process_time if clock == "process" else time.time
  parser = supar.CRFConstituencyParser.build(
      os.path.join(folder, "model"), build=True, train=train_path, embed=None, unk="unk",
      checkpoint=False, verbose=False, **PEER_SETTINGS)
  args = parser.args
  args.update({"delete": set(PEER_DELETE), "equal": dict(PEER_EQUAL)})
  parser.transform.train()
  train = Dataset(parser.transform, train_path).build(args.batch_size, args.buckets, True, False)
  parser.optimizer = torch.optim.Adam(parser.model.parameters(), args.lr, (args.mu, args.nu),
                                      args.eps, args.weight_decay)
  parser.scheduler = torch.optim.lr_scheduler.ExponentialLR(
      parser.optimizer, args.decay**(1 / args.decay_steps))
  budget, used, epochs = 60.0 * minutes, 0.0, []
  while len(epochs) < max_epochs:
    last = epochs[-1]["seconds"] if epochs else 0.0
    if epochs and used + last > budget:
      break
    start = now()
    parser._train(train.loader)  # pylint: disable=protected-access
    seconds = now() - start
    used += seconds
    epochs.append({"epoch": len(epochs) + 1, "seconds": seconds, "budget_used_s": used,
                   "steps": len(train.loader) * (len(epochs) + 1)})
    print(f"peer epoch {len(epochs)}: {seconds:.0f} s ({used / 60:.1f} of {minutes:g} "
          f"minutes)", flush=True)
  return parser, epochs


def predict_peer(parser, dev_path: str) -> tuple[list, float]:
  """(the peer's dev trees, sentences/s)."""
  start = time.time()
  dataset = parser.predict(dev_path, verbose=False, buckets=8, batch_size=5000,
                           mbr=PEER_SETTINGS["mbr"])
  seconds = time.time() - start
  return list(dataset.trees), len(dataset.trees) / max(seconds, 1e-9)


def run(config_spec: str, values, command: str, recorded: dict) -> dict:
  _supar()
  import nltk  # pylint: disable=g-import-not-at-top
  config = overrides_lib.load(config_spec, cli.OVERRIDE_ARGS)
  task = registry.get(config)
  train = task.read_split(config, "train").records.examples
  dev = task.read_split(config, "validation").records.examples
  golds = [nltk.Tree.fromstring(e.tree) for e in dev]
  ours = read_ours(values.ours, golds) if values.ours else None  # before an hour of training
  result = report.start(command, recorded)
  with tempfile.TemporaryDirectory() as folder:
    train_path, dev_path = os.path.join(folder, "train.pid"), os.path.join(folder, "dev.pid")
    write_trees(train_path, [e.tree for e in train])
    write_trees(dev_path, [e.tree for e in dev])
    parser, epochs = train_peer(train_path, folder, values.minutes, values.clock,
                                values.threads, values.seed, values.max_epochs)
    trees, sents_per_s = predict_peer(parser, dev_path)
  tests = [nltk.Tree.fromstring(peer_tree_text(t)) for t in trees]
  result.update(
      train_trees=len(train), dev_trees=len(dev), epochs=epochs,
      peer={"name": "supar CRFConstituencyParser", "version": _supar()[0].__version__,
            "dev": score(golds, tests), "decode_sentences_per_s": sents_per_s,
            "trees": [treebank.tree_text(t) for t in tests]},
      ours=({"file": values.ours, "dev": score(golds, ours)} if ours is not None else None))
  p = result["peer"]["dev"]
  print(f"peer dev F1 {p['parseval']['f1']:.2f} (parseval), {p['supar_metric']['f1']:.2f} "
        f"(supar) after {len(epochs)} epochs", flush=True)
  return report.finish(result)


def markdown(r: dict) -> str:
  lines = report.header("supar's CRF constituency parser beside ours, on the same trees", r)
  last = r["epochs"][-1] if r["epochs"] else {"epoch": 0, "steps": 0, "budget_used_s": 0.0}
  lines += [
      f"Trained from scratch on {r['train_trees']} trees (no pretrained vectors), "
      f"{last['epoch']} epochs ({last['steps']} steps) in {last['budget_used_s'] / 60:.1f} "
      f"minutes ({r['settings']['benchmark.clock']} clock, {r['settings']['benchmark.threads']} "
      f"thread); the last epoch scored on {r['dev_trees']} dev trees by both metrics.", "",
      "| parser | F1 (parseval) | P | R | F1 <= 40 words | exact | F1 (supar's metric) | "
      "brackets matched / gold / output |", "|---|---|---|---|---|---|---|---|"]
  sides = [("supar CRF (peer)", r["peer"]["dev"])]
  if r.get("ours"):
    sides.append((f"ours (`{r['ours']['file']}`)", r["ours"]["dev"]))
  for name, s in sides:
    p, m = s["parseval"], s["supar_metric"]
    lines.append(f"| {name} | {p['f1']:.2f} | {p['precision']:.2f} | {p['recall']:.2f} | "
                 f"{p['le40_f1']:.2f} | {p['exact_match']:.2f} | {m['f1']:.2f} | "
                 f"{p['matched']} / {p['gold']} / {p['test']} |")
  lines += ["", f"Peer decoding: {r['peer']['decode_sentences_per_s']:.1f} sentences/s."]
  return "\n".join(lines) + "\n"


def main(argv):
  report.main(argv, "benchmarks.parser_peer", settings,
              lambda values, command, recorded: run(values.config, values, command, recorded),
              markdown)


if __name__ == "__main__":
  define_flags(flags.FLAGS)
  cli.run(main, verbosity=logging.WARNING)
