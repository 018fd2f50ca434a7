"""Bad input gives one clear line (DataError / ConfigError) and leaves nothing half-written.

Small corpora written to tmp_path; no real data needed.
"""

from __future__ import annotations

import gzip
import os
import socket

import numpy as np
import pytest

from transformer_jax.data import pipeline, sources, tokenizer
from transformer_jax.runtime.config import default_config, validate
from transformer_jax.runtime.exceptions import ConfigError, DataError

WORDS = ("a man woman dog cat runs walks sits on the in red blue green small big street park "
         "house tree water ball car").split()


def _sentences(n: int, seed: int) -> list[str]:
  rng = np.random.default_rng(seed)
  return [" ".join(rng.choice(WORDS, size=rng.integers(3, 9))) for _ in range(n)]


def _write(path, lines, gz=False, raw: bytes | None = None):
  data = raw if raw is not None else ("\n".join(lines) + "\n").encode()
  if gz:
    with gzip.open(str(path) + ".gz", "wb") as f:
      f.write(data)
  else:
    path.write_bytes(data)


def _corpus(tmp_path, n=60, gz=True):
  folder = tmp_path / "data" / "corpus"
  folder.mkdir(parents=True, exist_ok=True)
  for stem, count in (("train", n), ("val", 10), ("test", 10)):
    for lang, seed in (("en", 1), ("de", 2)):
      _write(folder / f"{stem}.{lang}", _sentences(count, seed + len(stem)), gz=gz)
  return folder


def _config(tmp_path, **data):
  c = default_config()
  d = c.data
  d.dataset, d.local_corpus = "local", "corpus"
  d.train_files, d.eval_files, d.test_files = "train", "val", "test"
  d.data_dir = str(tmp_path / "data")
  d.tfds_data_dir = str(tmp_path / "tfds")
  d.max_source_len = d.max_target_len = 32
  d.tokens_per_batch = 256
  c.model.vocab_size = 40
  c.model.max_len = 64
  for k, v in data.items():
    d[k] = v
  return c


def _one_line(excinfo) -> str:
  msg = str(excinfo.value)
  assert msg and "\n" not in msg
  assert excinfo.value.__suppress_context__ or excinfo.value.__cause__ is None
  return msg


def _nothing_prepared(tmp_path):
  root = tmp_path / "tfds" / "parallel_text"
  return not root.exists() or not list(root.rglob("dataset_info.json"))


def test_a_good_small_corpus_works(tmp_path):
  _corpus(tmp_path)
  c = _config(tmp_path)
  tok = tokenizer.load_or_train_tokenizer(c, str(tmp_path / "wd"))
  batch = next(pipeline.make_train_iterator(c, tok))
  assert batch["inputs"].shape[0] * batch["inputs"].shape[1] <= 256
  assert len(sources.load_split_texts(c, "validation")[0]) == 10


def test_mismatched_line_counts_name_both_files(tmp_path):
  folder = _corpus(tmp_path)
  _write(folder / "train.de", _sentences(59, 3), gz=True)
  with pytest.raises(DataError) as e:
    sources.load_split_texts(_config(tmp_path), "train")
  msg = _one_line(e)
  assert "train.en.gz has 60 lines" in msg and "train.de.gz has 59" in msg
  assert _nothing_prepared(tmp_path)


def test_missing_file_folder_and_data_dir(tmp_path):
  folder = _corpus(tmp_path, gz=False)
  os.remove(folder / "val.de")
  with pytest.raises(DataError) as e:
    sources.load_split_texts(_config(tmp_path), "train")
  assert "data file not found" in _one_line(e) and "val.de" in str(e.value)
  with pytest.raises(DataError) as e:
    sources.load_split_texts(_config(tmp_path, local_corpus="nope"), "train")
  assert "data folder not found" in _one_line(e) and "nope" in str(e.value)
  with pytest.raises(DataError) as e:
    sources.load_split_texts(_config(tmp_path, data_dir=str(tmp_path / "absent")), "train")
  assert "data folder not found" in _one_line(e)
  assert _nothing_prepared(tmp_path)


def test_extra_training_files_mistakes_are_one_line(tmp_path):
  _corpus(tmp_path)
  for extra, match in (("corpus/nosuch", "data file not found: {}/corpus/nosuch.en[.gz] "
                                         "(data.extra_train_files)"),
                       ("nosuch/train",
                        "data folder not found: {}/nosuch (data.extra_train_files)"),
                       ("train", "'data.extra_train_files': 'train' is not 'folder/stem'")):
    with pytest.raises(DataError) as e:
      sources.split_source(_config(tmp_path, extra_train_files=extra), "train")
    assert match.format(tmp_path / "data") in _one_line(e), extra
  assert _nothing_prepared(tmp_path)
  for data, match in (({"upsample_primary": 2}, "'data.upsample_primary'=2 weighs the corpus"),
                      ({"extra_train_files": "corpus/train", "upsample_primary": 0},
                       "'data.upsample_primary' must be > 0"),
                      ({"extra_train_files": "corpus/train", "upsample_primary": 2,
                        "bpe_dropout": 0.1}, "does not work with data.bpe_dropout"),
                      ({"extra_train_files": "corpus/train", "dataset": "wmt14_translate/de-en"},
                       "'data.extra_train_files' needs data.dataset='local'")):
    with pytest.raises(ConfigError) as e:
      validate(_config(tmp_path, **data))
    assert match in _one_line(e), data
  assert validate(_config(tmp_path, extra_train_files="corpus/train", upsample_primary=3))


def test_a_missing_wmt_test_set_is_fetched_through_sacrebleu(tmp_path, monkeypatch):
  """newstest2014 absent from the corpus folder: sacreBLEU's copy (English source of en-de, German
  reference of en-de) is gzipped into it, and no temporary file is left."""
  from sacrebleu import utils
  folder = _corpus(tmp_path)
  en, de = tmp_path / "wmt14.en", tmp_path / "wmt14.de"
  en.write_text("A house .\nA tree .\n")
  de.write_text("Ein Haus .\nEin Baum .\n")
  asked = []
  monkeypatch.setattr(utils, "get_source_file", lambda test_set, pair: asked.append(
      ("source", test_set, pair)) or (str(en) if pair == "en-de" else 1 / 0))
  monkeypatch.setattr(utils, "get_reference_files", lambda test_set, pair: asked.append(
      ("reference", test_set, pair)) or [str(de)])
  src, tgt = sources.local_split_files(_config(tmp_path, test_files="newstest2014"), "test")
  assert (src, tgt) == (str(folder / "newstest2014.en.gz"), str(folder / "newstest2014.de.gz"))
  assert gzip.open(src).read() == en.read_bytes() and gzip.open(tgt).read() == de.read_bytes()
  assert asked == [("source", "wmt14/full", "en-de"), ("source", "wmt14/full", "de-en"),
                   ("reference", "wmt14/full", "en-de")]
  assert not [n for n in os.listdir(folder) if ".tmp" in n]


def test_plain_text_files_work_too(tmp_path):
  _corpus(tmp_path, gz=False)
  src, tgt = sources.load_split_texts(_config(tmp_path), "train")
  assert len(src) == len(tgt) == 60


def test_bad_utf8_names_file_and_line_or_is_skipped(tmp_path):
  folder = _corpus(tmp_path)
  lines = _sentences(60, 3)
  raw = ("\n".join(lines[:2]) + "\n").encode() + b"caf\xe9 au lait\n" + ("\n".join(lines[3:]) + "\n").encode()
  _write(folder / "train.de", None, gz=True, raw=raw)
  with pytest.raises(DataError) as e:
    sources.load_split_texts(_config(tmp_path), "train")
  msg = _one_line(e)
  assert "train.de.gz line 3 is not valid UTF-8" in msg and "skip_bad_utf8" in msg
  assert _nothing_prepared(tmp_path)
  src, tgt = sources.load_split_texts(_config(tmp_path, skip_bad_utf8=True), "train")
  assert len(src) == len(tgt) == 59 and tgt[2] == lines[3]


def test_empty_corpus_after_filtering(tmp_path):
  folder = _corpus(tmp_path)
  c = _config(tmp_path)
  tok = tokenizer.load_or_train_tokenizer(c, str(tmp_path / "wd"))
  with pytest.raises(DataError) as e:  # every pair longer than the limit
    pipeline.make_train_iterator(_config(tmp_path, max_source_len=3, max_target_len=3), tok)
  assert "no training pairs left" in _one_line(e) and "max_source_len=3" in str(e.value)
  _write(folder / "train.de", [""] * 60, gz=True)  # every target empty
  with pytest.raises(DataError) as e:
    pipeline.make_train_iterator(c, tok)
  assert "60 empty" in _one_line(e)


def test_vocabulary_too_large_says_what_fits(tmp_path):
  _corpus(tmp_path)
  for vocab_type in ("bpe", "unigram"):
    c = _config(tmp_path, vocab_type=vocab_type)
    c.model.vocab_size = 5000
    with pytest.raises(ConfigError) as e:
      tokenizer.load_or_train_tokenizer(c, str(tmp_path / "wd"))
    msg = _one_line(e)
    assert "model.vocab_size'=5000 is too large" in msg
    fits = int(msg.rsplit(" ", 1)[-1])
    assert 0 < fits < 5000
  vocab_dir = tmp_path / "wd" / "vocab"
  assert not vocab_dir.exists() or not os.listdir(vocab_dir)  # nothing half-written
  c.model.vocab_size = fits  # the size named in the message works
  assert tokenizer.load_or_train_tokenizer(c, str(tmp_path / "wd")).vocab_size == fits


def test_workdir_vocabulary_of_another_size_is_refused(tmp_path):
  _corpus(tmp_path)
  c = _config(tmp_path)
  tokenizer.load_or_train_tokenizer(c, str(tmp_path / "wd"))
  c.model.vocab_size = 41
  with pytest.raises(ConfigError) as e:
    tokenizer.load_or_train_tokenizer(c, str(tmp_path / "wd"))
  assert "holds a vocabulary of 40" in _one_line(e)


def test_tfds_wmt14_language_mismatch_and_offline_prepare(tmp_path, monkeypatch):
  c = _config(tmp_path, dataset="wmt14_translate/de-en", source_lang="fr")
  with pytest.raises(DataError) as e:
    sources.split_source(c, "train")
  assert "do not match" in _one_line(e)

  def offline(*args, **kwargs):
    raise socket.gaierror("no network")

  monkeypatch.setattr(socket, "getaddrinfo", offline)
  c = _config(tmp_path, dataset="wmt14_translate/de-en")
  with pytest.raises(DataError) as e:
    sources.split_source(c, "validation")
  msg = _one_line(e)
  assert "wmt14_translate/de-en is not prepared" in msg and "no internet" in msg


# ----------------------------------------------------------------------------- any two files


@pytest.mark.parametrize("gz", [False, True])
def test_read_parallel_files_plain_or_gz(tmp_path, gz):
  src, ref = ["a  b &amp; c", " d\te "], ["x &lt; y", "z"]
  _write(tmp_path / "t.en", src, gz=gz)
  _write(tmp_path / "t.de", ref, gz=gz)
  paths = [str(tmp_path / f"t.{lang}") + (".gz" if gz else "") for lang in ("en", "de")]
  assert sources.read_parallel_files(*paths) == (["a b &amp; c", "d e"], ["x &lt; y", "z"])
  assert sources.read_parallel_files(*paths, html_unescape=True) == (["a b & c", "d e"],
                                                                     ["x < y", "z"])


def test_read_parallel_files_errors_name_the_file_and_line(tmp_path):
  good, short = tmp_path / "good.en", tmp_path / "short.de"
  _write(good, ["one", "two", "three"])
  _write(short, ["eins", "zwei"])
  with pytest.raises(DataError) as e:
    sources.read_parallel_files(str(good), str(tmp_path / "absent.de"))
  assert _one_line(e) == f"file not found: {tmp_path / 'absent.de'}"
  with pytest.raises(DataError) as e:
    sources.read_parallel_files(str(good), str(short))
  assert _one_line(e) == f"line counts differ: {good} has 3 lines but {short} has 2"
  with pytest.raises(DataError) as e:
    sources.read_parallel_files(str(short), str(good))
  assert f"{short} has 2 lines but {good} has 3" in _one_line(e)
  bad = tmp_path / "bad.de"
  _write(bad, None, raw=b"eins\nzwei\ndr\xe9i\n")
  with pytest.raises(DataError) as e:
    sources.read_parallel_files(str(good), str(bad))
  msg = _one_line(e)
  assert msg.startswith(f"{bad} line 3 is not valid UTF-8") and "skip_bad_utf8" not in msg
  not_gz = tmp_path / "plain.de.gz"
  not_gz.write_bytes(b"eins\nzwei\ndrei\n")
  with pytest.raises(DataError) as e:
    sources.read_parallel_files(str(good), str(not_gz))
  assert _one_line(e).startswith(f"cannot read {not_gz}:")


def test_eval_batches_of_texts_hold_every_pair(tmp_path):
  _corpus(tmp_path)
  c = _config(tmp_path, eval_batch_size=4)
  tok = tokenizer.load_or_train_tokenizer(c, str(tmp_path / "wd"))
  texts = (_sentences(10, 7), _sentences(10, 8))
  batches = pipeline.make_eval_batches(c, tok, None, texts=texts)
  index = np.concatenate([b["example_index"] for b in batches])
  assert sorted(index[index >= 0].tolist()) == list(range(10))
  for b in batches:
    for row, i in enumerate(b["example_index"]):
      if i >= 0:
        ids = tok.encode_with_eos(texts[1][i])
        assert b["targets"][row].tolist() == ids + [0] * (b["targets"].shape[1] - len(ids))
  with pytest.raises(DataError) as e:
    pipeline.make_eval_batches(c, tok, None, texts=(texts[0], texts[1][:9]))
  assert "10 source texts but 9 references" in _one_line(e)
  assert pipeline.make_eval_batches(c, tok, None, texts=([], [])) == []


def test_load_tokenizer_refuses_a_bad_vocabulary_file(tmp_path):
  (tmp_path / "wd" / "vocab").mkdir(parents=True)
  (tmp_path / "wd" / "vocab" / "spm.model").write_bytes(b"not a model")
  with pytest.raises(DataError) as e:
    tokenizer.load_tokenizer(str(tmp_path / "wd"))
  assert "spm.model is not a SentencePiece model" in _one_line(e)
