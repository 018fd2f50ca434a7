"""Parsing as a task (paper §6.3): trees in and out (treebank.py, repair.py), EVALB's F1
(parseval.py), bad treebank files, and a tiny parser trained and used through the CLI on trees
written here."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys

import nltk
import pytest
from tensorboardX.proto import event_pb2

from tests.common import DATA_DIR, REPO, TINY_CLI_FLAGS, xla_flags
from transformer_jax.data import tokenizer as tok_lib
from transformer_jax.runtime.exceptions import ConfigError, DataError
from transformer_jax.runtime.overrides import load
from transformer_jax.tasks import registry
from transformer_jax.tasks.parsing import parseval, repair, treebank as trees
from transformer_jax.tasks.parsing.task import TASK
from transformer_jax.training.metrics import MetricsWriter

SAMPLE = os.path.join(DATA_DIR, "ptb-sample", "combined") if DATA_DIR else ""
T = nltk.Tree.fromstring

# A treebank tree with every case preprocessing handles: the unlabeled root, function tags and
# indices, -NONE- elements (one leaves its SBAR's S empty), -LRB-/-RRB-, PRT|ADVP.
RAW = """( (S (NP-SBJ-1 (PRP He) )
    (VP (VBD said)
      (SBAR (-NONE- 0)
        (S (NP-SBJ (-NONE- *T*-1) ) ))
      (PRN (-LRB- -LRB-) (NP (NN sic) ) (-RRB- -RRB-) )
      (PRT|ADVP (RP up) ))
    (. .) ))
"""
CLEAN = ("(TOP (S (NP (PRP He)) (VP (VBD said) (PRN (-LRB- -LRB-) (NP (NN sic)) (-RRB- -RRB-)) "
         "(PRT (RP up))) (. .)))")


def test_preprocess_drops_empty_elements_and_function_tags_keeps_brackets_and_words():
  tree = trees.preprocess(T(RAW))
  assert trees.tree_text(tree) == CLEAN
  assert tree.leaves() == ["He", "said", "-LRB-", "sic", "-RRB-", "up", "."]
  assert [trees.strip_label(x) for x in ("NP-SBJ-1", "S-TPC=2", "-LRB-", "-NONE-", "PRT|ADVP")] \
      == ["NP", "S", "-LRB-", "-NONE-", "PRT"]


def test_linearize_is_vinyals_with_xx_and_delinearize_inverts_it():
  tree = trees.preprocess(T(RAW))
  lin = trees.linearize(tree)
  assert lin == "(S (NP XX )NP (VP XX (PRN XX (NP XX )NP XX )PRN (PRT XX )PRT )VP XX )S"
  parsed = repair.delinearize(lin, tree.leaves())
  assert not parsed.repaired
  assert parsed.text == CLEAN.replace("(PRP ", "(XX ").replace("(VBD ", "(XX ").replace(
      "(-LRB- ", "(XX ").replace("(NN ", "(XX ").replace("(-RRB- ", "(XX ").replace(
          "(RP ", "(XX ").replace("(. ", "(XX ")


@pytest.mark.parametrize("skeleton, expected", [
    # a missing ')' : the open phrases are closed at the end
    ("(S (NP XX XX )NP (VP XX", "(TOP (S (NP (XX a) (XX b)) (VP (XX c))))"),
    # a ')' closes the innermost phrase whatever its label; one with none open is dropped, and
    # so is a token that is not a bracket or XX
    (")S (S (NP XX XX )NP )NP junk XX )S", "(TOP (S (NP (XX a) (XX b))) (XX c))"),
    # too few leaves: the missing words go to the end of the top phrase
    ("(S (NP XX )NP )S", "(TOP (S (NP (XX a)) (XX b) (XX c)))"),
    # too many leaves: the last slots go, and the phrases they leave empty
    ("(S (NP XX XX )NP (VP XX (NP XX XX )NP )VP )S", "(TOP (S (NP (XX a) (XX b)) (VP (XX c))))"),
    # two top-level phrases and too few leaves: the words go under TOP
    ("(NP XX )NP (VP XX )VP", "(TOP (NP (XX a)) (VP (XX b)) (XX c))"),
    # nothing usable: a flat tree
    ("", "(TOP (XX a) (XX b) (XX c))"),
    # a lone leaf and no phrase: the missing words go beside it, under TOP
    ("XX", "(TOP (XX a) (XX b) (XX c))"),
    # an empty phrase is dropped
    ("(S (NP )NP XX XX XX )S", "(TOP (S (XX a) (XX b) (XX c)))"),
])
def test_repair_makes_every_output_a_tree_with_the_source_words(skeleton, expected):
  parsed = repair.delinearize(skeleton, "a b c")
  assert parsed.repaired
  assert parsed.text == expected
  assert repair.delinearize(skeleton, "a b c").text == expected  # deterministic


def test_linearize_with_words_writes_each_word_and_delinearize_inverts_it():
  tree = trees.preprocess(T(RAW))
  lin = trees.linearize(tree, "words")
  assert lin == "(S (NP He )NP (VP said (PRN -LRB- (NP sic )NP -RRB- )PRN (PRT up )PRT )VP . )S"
  parsed = repair.delinearize(lin, tree.leaves(), "words")
  assert not parsed.repaired and parsed.text == repair.delinearize(trees.linearize(tree),
                                                                   tree.leaves()).text
  # any token that is not a bracket is a leaf slot; the source's words fill them, in order
  assert repair.delinearize("(S (NP x y )NP z )S", "a b c", "words").text == \
      "(TOP (S (NP (XX a) (XX b)) (XX c)))"
  repaired = repair.delinearize("(S (NP a )NP b c d )S", "a b c", "words")
  assert repaired.repaired and repaired.text == "(TOP (S (NP (XX a)) (XX b) (XX c)))"
  # a word starting with a bracket is written escaped, never read as one
  odd = nltk.Tree("TOP", [nltk.Tree("S", [nltk.Tree("NN", ["(x)"]), nltk.Tree("NN", ["y"])])])
  assert trees.linearize(odd, "words") == "(S -LRB-x-RRB- y )S"


def test_words_with_brackets_are_escaped_in_output_trees():
  assert repair.delinearize("(NP XX XX )NP", "f(x) )").text == "(TOP (NP (XX f-LRB-x-RRB-) (XX -RRB-)))"


# ----------------------------------------------------------------------------- F1 worked by hand

GOLD = "(TOP (S (NP (DT The) (NN cat)) (VP (VBD sat) (PRT (RP down))) (. .)))"


def _f1(gold: str, test: str) -> dict:
  return parseval.score_trees([T(gold)], [T(test)])


def test_identical_trees_score_100_and_match_exactly():
  r = _f1(GOLD, GOLD.replace("(DT ", "(XX "))  # POS tags are not scored
  assert (r["f1"], r["exact_match"], r["gold_brackets"]) == (100.0, 100.0, 4)  # S NP VP PRT


def test_punctuation_is_deleted_before_spans_are_compared():
  # The output attaches the final '.' inside the VP: with '.' deleted, VP spans 'sat down' in both.
  test = "(TOP (S (NP (XX The) (XX cat)) (VP (XX sat) (ADVP (XX down)) (XX .))))"
  r = _f1(GOLD, test)
  assert r["f1"] == 100.0 and r["matched_brackets"] == 4  # S, NP, VP, ADVP=PRT


def test_a_bracket_over_punctuation_only_is_not_counted():
  gold = "(TOP (S (NP (NN Yes)) (PRN (, ,) (: --)) (VP (VB go))))"
  r = _f1(gold, "(TOP (S (NP (XX Yes)) (XX ,) (XX --) (VP (XX go))))")
  assert (r["gold_brackets"], r["test_brackets"], r["f1"]) == (3, 3, 100.0)


def test_advp_and_prt_are_one_label_other_labels_are_not():
  assert _f1(GOLD, GOLD.replace("(PRT", "(ADVP"))["f1"] == 100.0
  r = _f1(GOLD, GOLD.replace("(PRT", "(PP"))
  assert (r["matched_brackets"], r["gold_brackets"], r["test_brackets"]) == (3, 4, 4)
  assert r["exact_match"] == 0.0


def test_brackets_match_as_a_multiset_and_scores_are_summed_over_the_corpus():
  # Gold: a unary NP over NP (two identical brackets); the output has one.
  gold1 = "(TOP (S (NP (NP (NN it))) (VP (VBZ works))))"
  test1 = "(TOP (S (NP (XX it)) (VP (XX works))))"
  # Sentence 2: 1 output bracket, 2 gold brackets, none matching.
  gold2 = "(TOP (S (NP (NN a)) (NP (NN b))))"
  test2 = "(TOP (VP (XX a) (XX b)))"
  r = parseval.score_trees([T(gold1), T(gold2)], [T(test1), T(test2)])
  assert (r["matched_brackets"], r["gold_brackets"], r["test_brackets"]) == (3, 7, 4)
  assert r["precision"] == pytest.approx(75.0, rel=1e-9)
  assert r["recall"] == pytest.approx(300 / 7, rel=1e-9)
  assert r["f1"] == pytest.approx(2 * 75 * (300 / 7) / (75 + 300 / 7), rel=1e-9)
  assert r["exact_match"] == 0.0
  # Spans by the brackets over them: gold's NP over NP is one span carrying two.
  assert r["brackets_per_span"] == {"1": [5, 4], "2": [1, 0]}


def test_other_words_are_an_error_sentence_left_out_of_the_counts():
  r = parseval.score_trees([T(GOLD)], [T("(TOP (S (XX Other) (XX words)))")])
  assert (r["length_mismatch"], r["scored_sentences"], r["gold_brackets"]) == (1, 0, 0)


def test_evaluate_parses_counts_repaired_outputs():
  report, texts = parseval.evaluate_parses(
      ["The cat sat down .", "The cat sat down ."],
      ["(S (NP XX XX )NP (VP XX (PRT XX )PRT )VP XX )S", "(S (NP XX XX )NP"],
      [GOLD, GOLD])
  assert report["repaired"] == 1 and report["sentences"] == 2
  assert texts[0] == "(TOP (S (NP (XX The) (XX cat)) (VP (XX sat) (PRT (XX down))) (XX .)))"
  assert report["matched_brackets"] == 4 + 2  # the second: S and NP; '.' deleted


def test_evalbs_second_summary_scores_the_sentences_of_at_most_40_words():
  long_words = " ".join(f"(NN w{i})" for i in range(41))
  gold_long, test_long = f"(TOP (S (NP {long_words})))", f"(TOP (S (VP {long_words})))"
  gold_short, test_short = "(TOP (S (NP (NN a)) (VP (VB b))))", "(TOP (S (NP (XX a)) (VP (XX b))))"
  r = parseval.score_trees([T(gold_long), T(gold_short)], [T(test_long), T(test_short)])
  assert (r["matched_brackets"], r["gold_brackets"]) == (1 + 3, 2 + 3)  # S matches, NP != VP
  assert r["le40"]["scored_sentences"] == 1 and r["le40"]["f1"] == 100.0
  assert r["le40"]["exact_match"] == 100.0 and r["exact_match"] == 50.0


def test_paired_bootstrap_of_two_parsers():
  golds = [T("(TOP (S (NP (NN a)) (VP (VB b) (NP (NN c)))))")] * 30
  good = [T("(TOP (S (NP (XX a)) (VP (XX b) (NP (XX c)))))")] * 30
  flat = [T("(TOP (S (XX a) (XX b) (XX c)))")] * 20 + good[:10]
  r = parseval.paired_bootstrap(golds, flat, good)["f1"]
  assert r["system"] == 100.0 and r["delta"] == pytest.approx(100.0 - r["baseline"], rel=1e-12)
  assert 0 < r["baseline"] < 100 and r["p_value"] < 0.01
  assert parseval.paired_bootstrap(golds, flat, good) == parseval.paired_bootstrap(golds, flat, good)
  same = parseval.paired_bootstrap(golds, good, good)["f1"]
  assert same["delta"] == 0.0 and same["system_ci"] == 0.0
  with pytest.raises(ValueError, match="one tree per gold tree"):
    parseval.paired_bootstrap(golds, flat[:3], good)


# ----------------------------------------------------------------------------- the sample

requires_sample = pytest.mark.skipif(not (SAMPLE and os.path.isdir(SAMPLE)),
                                     reason="no ptb-sample in TRANSFORMER_JAX_DATA_DIR")


def test_the_cli_starts_without_loading_nltk_until_a_tree_is_read():
  """NLTK's package __init__ imports scipy.stats (slow at every start): the CLI's and the sweep
  reports' modules load it only when the parsing paths first touch nltk.Tree."""
  code = ("import sys; import transformer_jax.main, transformer_jax.train, "
          "transformer_jax.inference.evaluate, transformer_jax.inference.translate, "
          "experiments.harness.report; "
          "from transformer_jax.tasks.parsing import treebank as trees; "
          "print('scipy.stats' in sys.modules, 'nltk.tree' in sys.modules); "
          "t = trees.nltk.Tree.fromstring('(S (NP the) (VP sat))'); "
          "print('nltk.tree' in sys.modules, isinstance(t, trees.nltk.Tree), t.leaves())")
  out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
  assert out.returncode == 0, out.stderr[-2000:]
  assert out.stdout.splitlines() == ["False False", "True True ['the', 'sat']"]


@requires_sample
def test_every_sample_tree_reads_and_comes_back_from_its_linearization():
  paths = trees.select_files(SAMPLE, "wsj_0001-wsj_0179", "sample")
  assert len(paths) == 179
  examples = trees.read_examples(tuple(paths))
  assert len(examples) == 3669
  for ex in examples:
    gold = T(ex.tree)
    assert "-NONE-" not in ex.tree and gold.label() == "TOP"
    assert all(trees.strip_label(t.label()) == t.label() for t in gold.subtrees())
    parsed = repair.delinearize(ex.linearized, ex.words)
    assert not parsed.repaired, (ex.path, ex.line)
    with_words = repair.delinearize(ex.linearized_words, ex.words, "words")
    assert not with_words.repaired and with_words.tree == parsed.tree, (ex.path, ex.line)
    assert len(ex.linearized_words.split()) == len(ex.linearized.split())
    for t in gold.subtrees(trees.is_preterminal):
      t.set_label(trees.POS_PLACEHOLDER)
    assert parsed.tree == gold, (ex.path, ex.line)


@requires_sample
def test_sample_config_splits_are_fixed_and_disjoint():
  c = load("configs/wsj_parsing.py:sample", [f"--config.data.data_dir={DATA_DIR}"])
  train = trees.select_files(SAMPLE, c.data.train_files, "train")
  dev = trees.select_files(SAMPLE, c.data.eval_files, "dev")
  assert (len(train), len(dev)) == (159, 20) and not set(train) & set(dev)
  assert c.data.test_files == ""


# ----------------------------------------------------------------------------- bad input


def _mrg(tmp_path, name, text):
  folder = tmp_path / "tb"
  folder.mkdir(exist_ok=True)
  (folder / name).write_text(text)
  return str(folder)


@pytest.mark.parametrize("text, where, what", [
    ("( (S (NP (NN a)) (VP (VB b)) )\n( (S (NN c)) )\n", "line 1", "unbalanced"),
    ("( (S (NN a)) )\n( (S (NN c))) )\n", "line 2", "unbalanced"),
    ("( (S (NN a)) )\nthis is not a tree\n", "line 2", "not a bracketed tree"),
    ("( (S (NN a)) )\n\n( (S (NP a b)) )\n", "line 3", "no POS tag"),
    ("", "", "empty"),
])
def test_a_bad_file_is_one_line_naming_the_file_and_line(tmp_path, text, where, what):
  folder = _mrg(tmp_path, "x_01.mrg", text)
  with pytest.raises(DataError) as e:
    trees.split_records(folder, "x_01", "train split")
  msg = str(e.value)
  assert "\n" not in msg and os.path.join(folder, "x_01.mrg") in msg and what in msg
  assert where in msg


def test_missing_folder_or_no_matching_file_is_one_line(tmp_path):
  with pytest.raises(DataError, match="data folder not found: .*nowhere"):
    trees.select_files(str(tmp_path / "nowhere"), "wsj_0001", "train split")
  folder = _mrg(tmp_path, "x_01.mrg", "( (S (NN a)) )\n")
  with pytest.raises(DataError, match="no .mrg file .* matches 'y_01'"):
    trees.select_files(folder, "y_01", "train split")
  with pytest.raises(DataError, match="file range is empty"):
    trees.select_files(folder, "", "test split")


def test_parsing_needs_local_files():
  c = load("configs/wsj_parsing.py:sample", [])
  c.data.dataset = "wmt14_translate/de-en"
  with pytest.raises(ConfigError, match="data.task"):
    registry.get(c)
  c.data.dataset, c.data.task = "local", "grammar"
  with pytest.raises(ConfigError, match="data.task"):
    registry.get(c)
  c.data.task, c.data.parse_leaves = "parsing", "pos"
  with pytest.raises(ConfigError, match="data.parse_leaves"):
    registry.get(c)


# ----------------------------------------------------------------------------- a tiny parser

DETS, NOUNS, VERBS, ADJS = ("the", "a"), ("cat", "dog", "man", "bird"), ("saw", "liked"), ("big", "red")


def _fixture_trees(n: int, offset: int) -> str:
  out = []
  for i in range(offset, offset + n):
    d1, n1 = DETS[i % 2], NOUNS[i % 4]
    d2, n2, v = DETS[(i // 2) % 2], NOUNS[(i // 3) % 4], VERBS[(i // 4) % 2]
    obj = (f"(NP (DT {d2}) (JJ {ADJS[i % 2]}) (NN {n2}))" if i % 3 else f"(NP (DT {d2}) (NN {n2}))")
    out.append(f"( (S (NP-SBJ (DT {d1}) (NN {n1})) (VP (VBD {v}) {obj}) (. .)) )")
  return "\n".join(out) + "\n"


def _main(*args, stdin=None):
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=xla_flags(), PYTHONPATH=REPO)
  return subprocess.run([sys.executable, "-m", "transformer_jax.main", *args], cwd=REPO, env=env,
                        capture_output=True, timeout=300, input=stdin)


def _parser_flags(data_dir) -> list[str]:
  tiny = [f for f in TINY_CLI_FLAGS if not f.startswith(("--config=", "--config.model.vocab_size",
                                                         "--config.data.max_"))]
  return ["--config=configs/wsj_parsing.py:sample", *tiny, f"--config.data.data_dir={data_dir}",
          "--config.data.local_corpus=tb", "--config.data.train_files=f_01-f_02",
          "--config.data.eval_files=f_03", "--config.model.vocab_size=60",
          "--config.model.max_len=64", "--config.data.max_source_len=32",
          "--config.data.max_target_len=64", "--config.train.max_train_minutes=0",
          "--config.train.eval_every_steps=4", "--config.train.eval_bleu_sentences=2",
          "--config.decode.beam_size=2", "--config.decode.max_extra_len=12",
          "--config.decode.batch_size=4"]


@pytest.mark.slow
def test_a_tiny_parser_trains_evaluates_and_parses_through_the_cli(tmp_path):
  for k, (n, offset) in enumerate(((24, 0), (24, 24), (6, 48))):
    _mrg(tmp_path, f"f_0{k + 1}.mrg", _fixture_trees(n, offset))
  # one training tree (line 25 of f_02) with a unary chain of 5 phrases, above the sample
  # config's limit for the constrained search: training says which limit and what it needs
  with open(tmp_path / "tb" / "f_02.mrg", "a", encoding="utf-8") as f:
    f.write("( (S (NP (NP (NP (NP (NP (DT the) (NN cat)))))) (VP (VBD saw)) (. .)) )\n")
  w = str(tmp_path / "w")
  # with word positions (model.word_positions): every later load reads the ids from the config
  r = _main(f"--workdir={w}", *_parser_flags(tmp_path), "--config.train.num_steps=4",
            "--config.model.word_positions=True")
  assert r.returncode == 0, r.stderr.decode()[-3000:]
  saved = json.load(open(os.path.join(w, "config.json")))["model"]
  leaves = TASK.word_starts(tok_lib.load_tokenizer(w))
  assert saved["word_positions"] and tuple(saved["word_starts"]) == leaves
  assert 0 < len(leaves) < len(tok_lib.load_tokenizer(w).word_start_ids())  # brackets are not
  warned = [l for l in r.stderr.decode().splitlines() if "training trees exceed" in l]
  assert len(warned) == 1 and "1 of 49 training trees exceed decode.parse_max_unary_chain=3" in warned[0]
  assert warned[0].endswith("f_02.mrg line 25): decode with --config.decode.parse_max_unary_chain=5")
  dev = [json.loads(l) for l in open(os.path.join(w, "metrics.jsonl")) if '"dev"' in l]
  assert dev and {"f1", "precision", "recall", "exact_match", "repaired"} <= set(dev[-1])

  r = _main("--mode=eval", f"--workdir={w}", "--split=validation")
  assert r.returncode == 0, r.stderr.decode()[-3000:]
  report = json.load(open(os.path.join(w, "eval", "validation_step4.json")))
  assert report["sentences"] == 6 and 0 <= report["repaired"] <= 6
  assert 0.0 <= report["f1"] <= 100.0 and report["length_mismatch"] == 0
  lines = open(os.path.join(w, "eval", "validation_step4.txt")).read().splitlines()
  assert len(lines) == 6 and all(l.startswith("(TOP ") for l in lines)
  assert 0.0 <= report["le40"]["f1"] <= 100.0

  # A file of other text for --compare is one line naming it, found before decoding.
  words = tmp_path / "words.txt"
  words.write_text("".join("ein Satz\n" for _ in lines))
  r = _main("--mode=eval", f"--workdir={w}", "--split=validation", f"--compare={words}")
  err = r.stderr.decode().strip().splitlines()
  assert r.returncode == 2 and err[-1].startswith("error: --compare=") and "line 1" in err[-1]
  assert "translate:" not in r.stderr.decode()  # found before decoding (tqdm's bar: none)

  # The constrained search writes trees (none repaired), into its own report beside the free one;
  # --compare with the free search's trees: the paired bootstrap of bracket F1 between the two.
  free_text = open(os.path.join(w, "eval", "validation_step4.json")).read()
  free = json.loads(free_text)
  own = os.path.join(w, "eval", "validation_step4.txt")
  r = _main("--mode=eval", f"--workdir={w}", "--split=validation",
            "--config.decode.parse_constraint=True", f"--compare={own}")
  assert r.returncode == 0, r.stderr.decode()[-3000:]
  report = json.load(open(os.path.join(w, "eval", "validation_step4_constrained.json")))
  assert report["repaired"] == 0 and report["overrides"] == {"decode.parse_constraint": True}
  compare = report["compare"]
  assert "bleu" not in compare and 0.0 <= compare["f1"]["p_value"] <= 1.0
  assert compare["f1"]["baseline"] == pytest.approx(free["f1"], rel=1e-9)
  assert compare["f1"]["delta"] == pytest.approx(report["f1"] - free["f1"], rel=1e-9, abs=1e-9)
  assert open(os.path.join(w, "eval", "validation_step4.json")).read() == free_text  # kept

  r = _main("--mode=translate", f"--workdir={w}", stdin=b"the big cat saw a dog .\n\na man liked it\n")
  assert r.returncode == 0, r.stderr.decode()[-3000:]
  out = r.stdout.decode().split("\n")
  assert len(out) == 4 and out[1] == ""
  assert T(out[0]).leaves() == "the big cat saw a dog .".split()
  assert T(out[2]).leaves() == "a man liked it".split()

  # A malformed training file: one line naming it, and the trained workdir is not touched.
  _mrg(tmp_path, "f_02.mrg", _fixture_trees(3, 0) + "( (S (NN broken) )\n")
  before = sorted(os.listdir(os.path.join(w, "checkpoints")))
  w2 = str(tmp_path / "w2")
  for workdir in (w, w2):
    r = _main(f"--workdir={workdir}", *_parser_flags(tmp_path), "--config.train.num_steps=8")
    err = r.stderr.decode().strip().splitlines()
    assert r.returncode == 2 and err[-1].startswith("error:"), r.stderr.decode()[-2000:]
    assert "f_02.mrg line 4" in err[-1] and "unbalanced" in err[-1]
  assert sorted(os.listdir(os.path.join(w, "checkpoints"))) == before
  assert not os.path.exists(os.path.join(w2, "checkpoints"))


# ----------------------------------------------------------------------------- TensorBoard samples


def test_dev_samples_are_written_as_tensorboard_text(tmp_path):
  writer = MetricsWriter(str(tmp_path))
  writer.write(7, {"f1": 50.0}, "dev")
  writer.write_samples(7, ["the cat", "a dog", "x"], ["(TOP (NP (DT the) (NN cat)))"] * 3,
                       ["(TOP (NP (XX the) (XX cat)))", "(TOP (XX a) (XX dog))", "(TOP (XX x))"],
                       count=2)
  writer.close()
  texts = []
  for name in os.listdir(tmp_path / "tb"):
    data = (tmp_path / "tb" / name).read_bytes()
    while data:
      (n,) = struct.unpack("<Q", data[:8])
      event = event_pb2.Event.FromString(data[12:12 + n])
      data = data[16 + n:]
      texts += [(event.step, v.tag, v.tensor.string_val[0].decode()) for v in event.summary.value
                if v.tensor.string_val]
  assert len(texts) == 1
  step, tag, text = texts[0]
  assert step == 7 and tag.startswith("dev/samples")
  assert "(TOP (NP (XX the) (XX cat)))" in text and "a dog" in text and "(TOP (XX x))" not in text
