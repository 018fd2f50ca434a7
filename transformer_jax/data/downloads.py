"""Files of the corpora with a public home, fetched when a local split's file is missing.

Multi30k's files come from its GitHub repository; WMT test sets (newstest2013/2014) from
sacreBLEU's copy. Only reached when `sources.local_split_files` finds no file: users with
internet get the corpus they named, machines without it get the usual "not found" error.
"""

from __future__ import annotations

import gzip
import os
import shutil
import tempfile
import urllib.request

from absl import logging

from transformer_jax.runtime import files

MULTI30K_URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/{stem}.{lang}.gz"
SACREBLEU_TEST_SETS = {"newstest2013": "wmt13", "newstest2014": "wmt14/full"}


def download(url: str, dest: str) -> None:
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


def fetch_known(folder: str, stem: str, lang: str, other: str) -> str | None:
  """Fetches a missing `lang` file of a corpus with a public home (Multi30k, WMT test sets)."""
  corpus = os.path.basename(os.path.normpath(folder))
  dest = os.path.join(folder, f"{stem}.{lang}.gz")
  try:
    if corpus == "multi30k":
      url = MULTI30K_URL.format(stem=stem, lang=lang)
      logging.info("downloading %s", url)
      download(url, dest)
      return dest
    if stem in SACREBLEU_TEST_SETS:
      from sacrebleu.utils import get_reference_files, get_source_file  # pylint: disable=g-import-not-at-top
      test_set = SACREBLEU_TEST_SETS[stem]
      try:  # `lang` is the source side of lang-other, or the reference side of other-lang
        path = get_source_file(test_set, f"{lang}-{other}")
      except Exception:  # pylint: disable=broad-except
        path = get_reference_files(test_set, f"{other}-{lang}")[0]
      os.makedirs(folder, exist_ok=True)
      with open(path, "rb") as src:  # a test set: a few hundred KB
        files.write_bytes(dest, gzip.compress(src.read()))  # every host may write it at once
      return dest
  except Exception as e:  # pylint: disable=broad-except
    logging.warning("download of %s failed: %s", dest, (str(e).splitlines() or [type(e).__name__])[0])
  return None
