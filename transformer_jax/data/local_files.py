"""Aligned local text files: where they are, whether they are sound, and fetching known ones.

A split of a 'local' dataset is ``{stem}.{lang}.gz`` or ``{stem}.{lang}`` in
``data.data_dir/data.local_corpus`` (dev/test in ``data.data_dir/data.eval_data_dir`` when set).
:func:`scan_pair` checks a pair of files before anything is built from them. Files of corpora
with a public home (Multi30k on GitHub, WMT test sets via sacrebleu) are downloaded when missing.
"""

from __future__ import annotations

import gzip
import os
import shutil
import tempfile
import urllib.request
from typing import Iterator

from absl import logging

from transformer_jax.config import DATA_DIR_ENV
from transformer_jax.data import DataError

SPLITS = ("train", "validation", "test")
# Public homes of the local corpora this project uses; only reached when a file is missing.
MULTI30K_URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/{stem}.{lang}.gz"
SACREBLEU_TEST_SETS = {"newstest2013": "wmt13", "newstest2014": "wmt14/full"}


def open_lines(path: str) -> Iterator[bytes]:
  opener = gzip.open if path.endswith(".gz") else open
  with opener(path, "rb") as f:
    for line in f:
      yield line.rstrip(b"\r\n")


def scan_pair(source_path: str, target_path: str, skip_bad_utf8: bool) -> tuple[int, list[int]]:
  """Checks two aligned files: same line count, UTF-8. Returns (lines, skipped 0-based lines)."""
  n, bad = 0, []
  src_it, tgt_it = open_lines(source_path), open_lines(target_path)
  try:
    while True:
      s, t = next(src_it, None), next(tgt_it, None)
      if s is None or t is None:
        if s is None and t is None:
          return n, bad
        rest = 1 + sum(1 for _ in (tgt_it if s is None else src_it))
        n_src, n_tgt = (n, n + rest) if s is None else (n + rest, n)
        raise DataError(f"line counts differ: {source_path} has {n_src} lines but {target_path} "
                        f"has {n_tgt}")
      for path, raw in ((source_path, s), (target_path, t)):
        try:
          raw.decode("utf-8")
        except UnicodeDecodeError as e:
          if not skip_bad_utf8:
            raise DataError(f"{path} line {n + 1} is not valid UTF-8 ({e.reason} at byte {e.start});"
                            " fix the file or set data.skip_bad_utf8=True to skip such pairs") from None
          bad.append(n)
          break
      n += 1
  except (OSError, EOFError, gzip.BadGzipFile) as e:
    raise DataError(f"cannot read {source_path} / {target_path}: {e}") from None


def _find_file(folder: str, stem: str, lang: str) -> str | None:
  for name in (f"{stem}.{lang}.gz", f"{stem}.{lang}"):
    if os.path.isfile(os.path.join(folder, name)):
      return os.path.join(folder, name)
  return None


def _download(url: str, dest: str) -> None:
  """Downloads url to dest atomically (temp file + rename)."""
  os.makedirs(os.path.dirname(dest), exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=os.path.dirname(dest), prefix=".download-")
  try:
    with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=60) as resp:
      shutil.copyfileobj(resp, out)
    os.replace(tmp, dest)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)


def _download_known(folder: str, stem: str, lang: str, other: str) -> str | None:
  """Fetches a missing `lang` file of a corpus with a public home (Multi30k, WMT test sets)."""
  corpus = os.path.basename(os.path.normpath(folder))
  dest = os.path.join(folder, f"{stem}.{lang}.gz")
  try:
    if corpus == "multi30k":
      url = MULTI30K_URL.format(stem=stem, lang=lang)
      logging.info("downloading %s", url)
      _download(url, dest)
      return dest
    if stem in SACREBLEU_TEST_SETS:
      from sacrebleu.utils import get_reference_files, get_source_file  # pylint: disable=g-import-not-at-top
      test_set = SACREBLEU_TEST_SETS[stem]
      try:  # `lang` is the source side of lang-other, or the reference side of other-lang
        path = get_source_file(test_set, f"{lang}-{other}")
      except Exception:  # pylint: disable=broad-except
        path = get_reference_files(test_set, f"{other}-{lang}")[0]
      os.makedirs(folder, exist_ok=True)
      with open(path, "rb") as src, gzip.open(dest + ".tmp", "wb") as out:
        shutil.copyfileobj(src, out)
      os.replace(dest + ".tmp", dest)
      return dest
  except Exception as e:  # pylint: disable=broad-except
    logging.warning("download of %s failed: %s", dest, (str(e).splitlines() or [type(e).__name__])[0])
  return None


def local_split_files(config, split: str) -> tuple[str, str]:
  """(source path, target path) of one split of a 'local' dataset; DataError when missing."""
  d = config.data
  if split not in SPLITS:
    raise DataError(f"unknown split {split!r}; expected one of {', '.join(SPLITS)}")
  if not d.local_corpus:
    raise DataError("config key 'data.local_corpus' is empty; name a folder under data.data_dir "
                    "(e.g. 'multi30k') for data.dataset='local'")
  data_dir = os.path.abspath(os.path.expanduser(d.data_dir))
  if not os.path.isdir(data_dir):
    raise DataError(f"data folder not found: {data_dir} (set data.data_dir or ${DATA_DIR_ENV})")
  corpus = d.eval_data_dir if (split != "train" and d.eval_data_dir) else d.local_corpus
  folder = os.path.join(data_dir, corpus)
  stem = {"train": d.train_files, "validation": d.eval_files, "test": d.test_files}[split]
  paths = []
  for lang, other in ((d.source_lang, d.target_lang), (d.target_lang, d.source_lang)):
    path = _find_file(folder, stem, lang) or _download_known(folder, stem, lang, other)
    if path is None:
      what = "data file" if os.path.isdir(folder) else "data folder"
      missing = os.path.join(folder, f"{stem}.{lang}[.gz]") if os.path.isdir(folder) else folder
      raise DataError(f"{what} not found: {missing} ({split} split)")
    paths.append(path)
  return paths[0], paths[1]
