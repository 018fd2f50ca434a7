"""Parallel corpora as TFDS ArrayRecord datasets, read with ``tfds`` data sources (no TensorFlow).

Two kinds of ``config.data.dataset``:

- a TFDS catalog name such as ``'wmt14_translate/de-en'`` (or ``'wmt14_translate/fr-en'``),
  prepared with ``file_format='array_record'`` in ``data.tfds_data_dir`` (TFDS's default folder
  when empty). Preparing WMT needs the internet; prepared files load without TensorFlow.
- ``'local'``: any pair of aligned text files (plain or ``.gz``), one sentence per line,
  ``{stem}.{lang}[.gz]`` in ``data_dir/local_corpus`` (dev/test optionally from
  ``data_dir/eval_data_dir``). :class:`ParallelText` (a ``GeneratorBasedBuilder``) turns them into
  ArrayRecord files once, in a folder keyed by the files' paths, sizes and mtimes under
  ``data.tfds_data_dir`` (default ``$TRANSFORMER_JAX_CACHE_DIR`` or ``~/.cache/transformer_jax``).

Lines are checked before anything is written: equal line counts on both sides, valid UTF-8
(bad pairs are skipped and counted with ``data.skip_bad_utf8``). Cleanup (:func:`clean_text`:
HTML entities, whitespace) happens when reading, so it is not baked into the prepared files.
"""

from __future__ import annotations

import dataclasses
import hashlib
import html
import importlib
import os
import socket
import urllib.parse
from typing import Any, Iterator

import numpy as np
import tensorflow_datasets as tfds
from absl import logging

from transformer_jax.data import DataError
from transformer_jax.data.local_files import SPLITS, local_split_files, open_lines, scan_pair

CACHE_DIR_ENV = "TRANSFORMER_JAX_CACHE_DIR"
_READ_CHUNK = 8192



def clean_text(text: str, html_unescape: bool = False) -> str:
  """Strips, collapses runs of whitespace (tabs included) to one space, optionally unescapes HTML."""
  if html_unescape and "&" in text:
    text = html.unescape(text)
  return " ".join(text.split())


# ----------------------------------------------------------------------------- TFDS builder


class ParallelTextConfig(tfds.core.BuilderConfig):
  """A set of aligned file pairs, one per split, made into one TFDS config."""

  def __init__(self, *, name: str, files: dict[str, tuple[str, str]], source_lang: str,
               target_lang: str, skip_bad_utf8: bool):
    super().__init__(name=name, description="aligned text files: " + ", ".join(
        f"{s}={p[0]}|{p[1]}" for s, p in files.items()))
    self.files, self.source_lang, self.target_lang = files, source_lang, target_lang
    self.skip_bad_utf8 = skip_bad_utf8


class ParallelText(tfds.core.GeneratorBasedBuilder):
  """TFDS builder for aligned local text files; features {source_lang, target_lang, 'line'}."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Aligned text files, lines checked for count and UTF-8."}

  def _info(self) -> tfds.core.DatasetInfo:
    c = self.builder_config
    return tfds.core.DatasetInfo(
        builder=self,
        description="Aligned sentence pairs read from local text files.",
        features=tfds.features.FeaturesDict({
            c.source_lang: tfds.features.Text(), c.target_lang: tfds.features.Text(),
            "line": tfds.features.Scalar(dtype=np.int64)}),
        supervised_keys=(c.source_lang, c.target_lang),
        disable_shuffling=True)  # keep file order: line i is example i

  def _split_generators(self, dl_manager):
    del dl_manager
    return {split: self._generate_examples(*paths) for split, paths in self.builder_config.files.items()}

  def _generate_examples(self, source_path: str, target_path: str):
    c = self.builder_config
    for i, (s, t) in enumerate(zip(open_lines(source_path), open_lines(target_path))):
      try:
        example = {c.source_lang: s.decode("utf-8"), c.target_lang: t.decode("utf-8"), "line": i}
      except UnicodeDecodeError:
        continue  # only reached with skip_bad_utf8 (scan_pair raised otherwise)
      yield i, example


def cache_root(config) -> str:
  """Where prepared data (local TFDS builds, token caches) goes."""
  if config.data.tfds_data_dir:
    return os.path.abspath(os.path.expanduser(config.data.tfds_data_dir))
  base = os.environ.get(CACHE_DIR_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "transformer_jax")
  return os.path.join(base, "tfds")


def _local_builder_config(config) -> ParallelTextConfig:
  d = config.data
  files = {split: local_split_files(config, split) for split in SPLITS}
  key = hashlib.sha256(repr((ParallelText.VERSION, d.source_lang, d.target_lang, d.skip_bad_utf8, [
      (split, p, os.path.getsize(p), os.stat(p).st_mtime_ns) for split in SPLITS for p in files[split]
  ])).encode()).hexdigest()[:12]
  slug = "".join(ch if ch.isalnum() else "_" for ch in d.local_corpus)
  return ParallelTextConfig(name=f"{slug}_{d.source_lang}{d.target_lang}_{key}", files=files,
                            source_lang=d.source_lang, target_lang=d.target_lang,
                            skip_bad_utf8=d.skip_bad_utf8)


def _prepare_local(config) -> str:
  """Builds the ArrayRecord files once (checked first); returns the prepared folder."""
  cfg = _local_builder_config(config)
  prepared = os.path.join(cache_root(config), "parallel_text", cfg.name, str(ParallelText.VERSION))
  if os.path.isfile(os.path.join(prepared, "dataset_info.json")):
    return prepared
  for split, (src, tgt) in cfg.files.items():
    n, bad = scan_pair(src, tgt, config.data.skip_bad_utf8)
    if bad:
      logging.warning("%s: skipped %d of %d pairs with bad UTF-8 (first at line %d of %s)",
                      split, len(bad), n, bad[0] + 1, src)
  logging.info("preparing %s (ArrayRecord) in %s", cfg.name, prepared)
  builder = ParallelText(config=cfg, data_dir=cache_root(config), file_format="array_record")
  tfds.disable_progress_bar()
  try:
    builder.download_and_prepare()
  except Exception as e:  # pylint: disable=broad-except
    if not os.path.isfile(os.path.join(prepared, "dataset_info.json")):  # else: another process won
      raise DataError(f"cannot prepare {cfg.name} in {prepared}: {type(e).__name__}: "
                      f"{(str(e).splitlines() or [''])[0][:200]}") from e
  return prepared


@dataclasses.dataclass(frozen=True)
class SplitSource:
  """One split as a random-access source of {lang: bytes} records."""

  source: Any              # tfds ArrayRecordDataSource
  source_key: str
  target_key: str
  dataset_id: str          # unique name of the prepared data (used for token caches)

  def __len__(self) -> int:
    return len(self.source)


def _tfds_catalog_source(config, split: str) -> SplitSource:
  d = config.data
  name = d.dataset
  langs = name.split("/")[-1].split("-")
  if len(langs) != 2 or {d.source_lang, d.target_lang} != set(langs):
    raise DataError(f"data.source_lang/target_lang ({d.source_lang}->{d.target_lang}) do not match "
                    f"the language pair of data.dataset={name!r}")
  if name.startswith("wmt"):
    importlib.import_module("tensorflow_datasets.translate")  # registers the wmt* builders
  data_dir = cache_root(config) if d.tfds_data_dir else None
  try:
    builder = tfds.builder(name, data_dir=data_dir, file_format="array_record")
  except Exception as e:  # pylint: disable=broad-except
    raise DataError(f"unknown TFDS dataset {name!r}: {str(e).splitlines()[0]}") from None
  if not builder.is_prepared():
    _download_and_prepare_catalog(builder, name)
  try:
    source = builder.as_data_source(split=split)
  except Exception as e:  # pylint: disable=broad-except
    raise DataError(f"cannot read split {split!r} of {name} in {builder.data_dir}: "
                    f"{str(e).splitlines()[0]} (was it prepared with file_format='array_record'?)") from None
  dataset_id = f"{name.replace('/', '_')}_{builder.version}"
  return SplitSource(source, d.source_lang, d.target_lang, dataset_id)


def _download_and_prepare_catalog(builder, name: str) -> None:
  """The real TFDS preparation (internet needed); one-line DataError when it cannot run."""
  hint = (f"TFDS dataset {name} is not prepared in {builder.data_dir} and cannot be prepared here")
  advice = ("prepare it on a machine with internet access (pip install 'transformer_jax[wmt]'; "
            f"tfds build {name} --file_format=array_record) and set data.tfds_data_dir")
  host = urllib.parse.urlparse(builder.info.homepage or "").hostname
  if host:
    try:
      socket.getaddrinfo(host, 443)  # fail in a second, not after minutes of download retries
    except OSError:
      raise DataError(f"{hint}: no internet ({host} unreachable); {advice}") from None
  try:
    tfds.disable_progress_bar()
    builder.download_and_prepare()
  except Exception as e:  # pylint: disable=broad-except
    reason = (str(e).splitlines() or [type(e).__name__])[0][:200]
    raise DataError(f"{hint}: {type(e).__name__}: {reason}; {advice}") from None


def split_source(config, split: str) -> SplitSource:
  """The prepared split as a TFDS ArrayRecord data source (prepared first when needed)."""
  if split not in SPLITS:
    raise DataError(f"unknown split {split!r}; expected one of {', '.join(SPLITS)}")
  d = config.data
  if d.dataset != "local":
    return _tfds_catalog_source(config, split)
  prepared = _prepare_local(config)
  source = tfds.builder_from_directory(prepared).as_data_source(split=split)
  name = os.path.basename(os.path.dirname(prepared))
  return SplitSource(source, d.source_lang, d.target_lang, f"parallel_text_{name}")


def iter_raw_pairs(src: SplitSource, chunk: int = _READ_CHUNK) -> Iterator[tuple[list[str], list[str]]]:
  """Yields the split in order as chunks of (source texts, target texts), not yet cleaned."""
  n = len(src)
  for start in range(0, n, chunk):
    records = src.source.__getitems__(list(range(start, min(n, start + chunk))))
    yield ([_text(r[src.source_key]) for r in records], [_text(r[src.target_key]) for r in records])


def _text(value) -> str:
  return value.decode("utf-8") if isinstance(value, (bytes, np.bytes_)) else str(value)


def load_split_texts(config, split: str) -> tuple[list[str], list[str]]:
  """Cleaned (source texts, target texts) of a split, in corpus order, nothing filtered."""
  src = split_source(config, split)
  unescape = config.data.html_unescape
  sources, targets = [], []
  for s_chunk, t_chunk in iter_raw_pairs(src):
    sources.extend(clean_text(s, unescape) for s in s_chunk)
    targets.extend(clean_text(t, unescape) for t in t_chunk)
  return sources, targets


def sample_train_texts(config, max_sentences: int) -> Iterator[str]:
  """Up to max_sentences cleaned sentences (both sides of random pairs) of the training split."""
  src = split_source(config, "train")
  n = len(src)
  pairs = min(n, max(1, max_sentences // 2))
  rng = np.random.default_rng(config.seed)
  picked = np.sort(rng.choice(n, size=pairs, replace=False)) if pairs < n else np.arange(n)
  unescape = config.data.html_unescape
  for start in range(0, len(picked), _READ_CHUNK):
    for r in src.source.__getitems__(picked[start:start + _READ_CHUNK].tolist()):
      for key in (src.source_key, src.target_key):
        text = clean_text(_text(r[key]), unescape)
        if text:
          yield text
