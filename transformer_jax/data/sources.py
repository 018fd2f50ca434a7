"""Stage 1 of the input side: raw parallel text -> cleaned, aligned sentence pairs.

Where a split's pairs come from (``config.data.dataset``):

- a TFDS catalog name such as ``'wmt14_translate/de-en'`` (or ``'wmt14_translate/fr-en'``),
  prepared with ``file_format='array_record'`` in ``data.tfds_data_dir`` (TFDS's default folder
  when empty). Preparing WMT needs TensorFlow (the ``[wmt]`` extra) and the internet; prepared
  files are read without TensorFlow.
- ``'local'``: a pair of aligned text files (plain or ``.gz``), one sentence per line,
  ``{stem}.{lang}[.gz]`` in ``data_dir/local_corpus`` (dev/test from ``data_dir/eval_data_dir``
  when set), and more training pairs from other folders (``data.extra_train_files``: the
  training split is then the corpus's own pairs followed by theirs, ``train_parts``); files of
  corpora with a public home (Multi30k, WMT test sets via sacrebleu) are downloaded when
  missing (``downloads``). :class:`ParallelText` (a ``GeneratorBasedBuilder``) turns them into
  ArrayRecord files once, in a folder keyed by the files' paths, sizes and mtimes under
  ``data.tfds_data_dir`` (default ``$TRANSFORMER_JAX_CACHE_DIR/tfds`` or
  ``~/.cache/transformer_jax/tfds``).

Both are read with ``tfds`` data sources (:func:`parallel_text_split`: how translation reads a
split). A task that reads its splits another way hands its own ``reader`` (a
:data:`SplitReader`, returning a :class:`SplitSource`) to every function here that reads a
split; without one, a split is parallel text. Any other two files (a test set to score) are
read by :func:`read_parallel_files`. Lines are checked before anything is built from them
(:func:`aligned_lines`): equal line counts, valid UTF-8 (with ``data.skip_bad_utf8``, bad pairs
are skipped and counted); a problem is a one-line :class:`DataError` naming the file and line.
Cleaning (:func:`clean_text`: whitespace, optionally HTML entities) happens when reading, so it
is not baked into the prepared files.
"""

from __future__ import annotations

import codecs
import dataclasses
import gzip
import hashlib
import html
import importlib
import os
import socket
import urllib.parse
from typing import Any, Callable, Iterator

import numpy as np
import tensorflow_datasets as tfds
from absl import logging

from transformer_jax.data import downloads
from transformer_jax.runtime.config import DATA_DIR_ENV
from transformer_jax.runtime.exceptions import DataError

SPLITS = ("train", "validation", "test")
EXTRA = "train_extra"  # prepared split k of data.extra_train_files: f"{EXTRA}{k}", k = 1, 2, ...
CACHE_DIR_ENV = "TRANSFORMER_JAX_CACHE_DIR"
CHUNK = 8192  # records read (and tokenized) at a time


def clean_text(text: str, html_unescape: bool = False) -> str:
  """Strips, collapses runs of whitespace (tabs included) to one space, optionally unescapes HTML."""
  if html_unescape and "&" in text:
    text = html.unescape(text)
  return " ".join(text.split())


# ----------------------------------------------------------------------------- aligned text files


def open_lines(path: str) -> Iterator[bytes]:
  """The lines of a plain or .gz text file, without line ends and without a UTF-8 byte-order
  mark at its start (files saved on Windows); DataError naming the file."""
  opener = gzip.open if path.endswith(".gz") else open
  try:
    with opener(path, "rb") as f:
      for n, line in enumerate(f):
        if n == 0 and line.startswith(codecs.BOM_UTF8):
          line = line[len(codecs.BOM_UTF8):]
        yield line.rstrip(b"\r\n")
  except FileNotFoundError:
    raise DataError(f"file not found: {path}") from None
  except (OSError, EOFError) as e:  # gzip.BadGzipFile is an OSError
    raise DataError(f"cannot read {path}: {e}") from None


def aligned_lines(source_path: str, target_path: str, *, skip_bad_utf8: bool = False,
                  skipped: list[int] | None = None,
                  utf8_hint: str = "fix the file") -> Iterator[tuple[int, str, str]]:
  """Yields (0-based line, source line, target line) of two aligned files, in order.

  A line that is not UTF-8 is a DataError naming the file and line (with `utf8_hint` as the
  advice), or with skip_bad_utf8 its pair is left out and its line appended to `skipped`.
  Different line counts are a DataError naming both files and both counts.
  """
  src_it, tgt_it = open_lines(source_path), open_lines(target_path)
  n = 0
  while True:
    s, t = next(src_it, None), next(tgt_it, None)
    if s is None or t is None:
      if s is None and t is None:
        return
      rest = 1 + sum(1 for _ in (tgt_it if s is None else src_it))
      n_src, n_tgt = (n, n + rest) if s is None else (n + rest, n)
      raise DataError(f"line counts differ: {source_path} has {n_src} lines but {target_path} "
                      f"has {n_tgt}")
    try:
      pair = (s.decode("utf-8"), t.decode("utf-8"))
    except UnicodeDecodeError:
      for path, raw in ((source_path, s), (target_path, t)):
        try:
          raw.decode("utf-8")
        except UnicodeDecodeError as e:
          if not skip_bad_utf8:
            raise DataError(f"{path} line {n + 1} is not valid UTF-8 ({e.reason} at byte "
                            f"{e.start}); {utf8_hint}") from None
      if skipped is not None:
        skipped.append(n)
    else:
      yield n, *pair
    n += 1


def read_parallel_files(source_path: str, reference_path: str,
                        html_unescape: bool = False) -> tuple[list[str], list[str]]:
  """(sources, references) of any two aligned text files (plain or .gz, one sentence a line),
  cleaned as splits are (pass config.data.html_unescape). DataError (one line) for a missing
  file, bytes that are not UTF-8 (file and line) or different line counts (both files)."""
  sources, references = [], []
  for _, s, r in aligned_lines(source_path, reference_path):
    sources.append(clean_text(s, html_unescape))
    references.append(clean_text(r, html_unescape))
  if not sources:
    raise DataError(f"{source_path} and {reference_path} hold no lines: nothing to evaluate")
  return sources, references


def _find_file(folder: str, stem: str, lang: str) -> str | None:
  for name in (f"{stem}.{lang}.gz", f"{stem}.{lang}"):
    if os.path.isfile(os.path.join(folder, name)):
      return os.path.join(folder, name)
  return None


def extra_train_files(config) -> list[str]:
  """data.extra_train_files as a list of 'folder/stem' (a DataError for an entry without both)."""
  entries = [e.strip() for e in config.data.extra_train_files.split(",") if e.strip()]
  for e in entries:
    if "/" not in e.strip("/"):
      raise DataError(f"config key 'data.extra_train_files': {e!r} is not 'folder/stem' (a folder "
                      "under data.data_dir and the stem of its X.en[.gz] / X.de[.gz] files)")
  return entries


def train_parts(config) -> list[str]:
  """The prepared splits that make up the training data: 'train' (the corpus's own training
  files), then 'train_extra1', ... (data.extra_train_files, in order)."""
  return ["train"] + [f"{EXTRA}{k}" for k in range(1, len(extra_train_files(config)) + 1)]


def local_split_files(config, split: str) -> tuple[str, str]:
  """(source path, target path) of one split of a 'local' dataset (or of one of
  `train_parts`); DataError when missing."""
  d = config.data
  if not d.local_corpus:
    raise DataError("config key 'data.local_corpus' is empty; name a folder under data.data_dir "
                    "(e.g. 'multi30k') for data.dataset='local'")
  data_dir = os.path.abspath(os.path.expanduser(d.data_dir))
  if not os.path.isdir(data_dir):
    raise DataError(f"data folder not found: {data_dir} (set data.data_dir or ${DATA_DIR_ENV})")
  if split.startswith(EXTRA):
    corpus, stem = os.path.split(extra_train_files(config)[int(split[len(EXTRA):]) - 1].strip("/"))
  else:
    corpus = d.eval_data_dir if (split != "train" and d.eval_data_dir) else d.local_corpus
    stem = {"train": d.train_files, "validation": d.eval_files, "test": d.test_files}[split]
  folder = os.path.join(data_dir, corpus)
  paths = []
  for lang, other in ((d.source_lang, d.target_lang), (d.target_lang, d.source_lang)):
    path = _find_file(folder, stem, lang) or downloads.fetch_known(folder, stem, lang, other)
    if path is None:
      what = "data file" if os.path.isdir(folder) else "data folder"
      missing = os.path.join(folder, f"{stem}.{lang}[.gz]") if os.path.isdir(folder) else folder
      which = "data.extra_train_files" if split.startswith(EXTRA) else f"{split} split"
      raise DataError(f"{what} not found: {missing} ({which})")
    paths.append(path)
  return paths[0], paths[1]


# ----------------------------------------------------------------------------- TFDS


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
        disable_shuffling=True)  # keep file order: example i comes before example i + 1

  def _split_generators(self, dl_manager):
    del dl_manager
    return {split: self._generate_examples(*paths) for split, paths in self.builder_config.files.items()}

  def _generate_examples(self, source_path: str, target_path: str):
    c = self.builder_config
    for i, s, t in aligned_lines(source_path, target_path, skip_bad_utf8=c.skip_bad_utf8):
      yield i, {c.source_lang: s, c.target_lang: t, "line": i}


def cache_root(config) -> str:
  """Where prepared data (local TFDS builds, token caches) goes."""
  if config.data.tfds_data_dir:
    return os.path.abspath(os.path.expanduser(config.data.tfds_data_dir))
  base = os.environ.get(CACHE_DIR_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "transformer_jax")
  return os.path.join(base, "tfds")


def _prepare_local(config) -> str:
  """Checks the files, builds the ArrayRecord files once; returns the prepared folder."""
  d = config.data
  splits = [*SPLITS, *train_parts(config)[1:]]
  files = {split: local_split_files(config, split) for split in splits}
  key = hashlib.sha256(repr((ParallelText.VERSION, d.source_lang, d.target_lang, d.skip_bad_utf8, [
      (split, p, os.path.getsize(p), os.stat(p).st_mtime_ns)
      for split in splits for p in files[split]])).encode()).hexdigest()[:12]
  slug = "".join(ch if ch.isalnum() else "_" for ch in d.local_corpus)
  cfg = ParallelTextConfig(name=f"{slug}_{d.source_lang}{d.target_lang}_{key}", files=files,
                           source_lang=d.source_lang, target_lang=d.target_lang,
                           skip_bad_utf8=d.skip_bad_utf8)
  prepared = os.path.join(cache_root(config), "parallel_text", cfg.name, str(ParallelText.VERSION))
  if os.path.isfile(os.path.join(prepared, "dataset_info.json")):
    return prepared
  for split, (src, tgt) in files.items():  # every problem named before anything is written
    skipped = []
    n = sum(1 for _ in aligned_lines(src, tgt, skip_bad_utf8=d.skip_bad_utf8, skipped=skipped,
                                     utf8_hint="fix the file or set data.skip_bad_utf8=True to "
                                               "skip such pairs"))
    if skipped:
      logging.warning("%s: skipped %d of %d pairs with bad UTF-8 (first at line %d of %s)",
                      split, len(skipped), n + len(skipped), skipped[0] + 1, src)
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


def _catalog_builder(config):
  """The prepared TFDS builder of a catalog dataset (prepared here when possible)."""
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
  if builder.is_prepared():
    return builder
  hint = f"TFDS dataset {name} is not prepared in {builder.data_dir} and cannot be prepared here"
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
  return builder


# ----------------------------------------------------------------------------- cleaned pairs


@dataclasses.dataclass(frozen=True)
class SplitSource:
  """One prepared split: random access to its records, read as cleaned (source, target) texts."""

  records: Any             # tfds ArrayRecordDataSource of {lang: bytes}
  source_key: str
  target_key: str
  dataset_id: str          # unique name of the prepared data (keys token caches)
  html_unescape: bool
  part_sizes: tuple[int, ...] = ()  # training split: examples of each of train_parts, in order
  reference_key: str = ""  # what evaluation scores against, when not the target

  def __len__(self) -> int:
    return len(self.records)

  @property
  def cleaning(self) -> str:
    """Names the cleaning applied (keys token caches)."""
    return "html" if self.html_unescape else "raw"

  def texts(self, ids: list[int], reference: bool = False) -> tuple[list[str], list[str]]:
    """Cleaned (source texts, target texts, or with `reference` the references) of `ids`."""
    records = self.records.__getitems__(ids)
    target = (reference and self.reference_key) or self.target_key
    return tuple([clean_text(_text(r[key]), self.html_unescape) for r in records]
                 for key in (self.source_key, target))

  def chunks(self, chunk: int = CHUNK,
             reference: bool = False) -> Iterator[tuple[list[str], list[str]]]:
    """The whole split in order, as chunks of cleaned (source texts, target texts)."""
    for start in range(0, len(self), chunk):
      yield self.texts(list(range(start, min(len(self), start + chunk))), reference)


def _text(value) -> str:
  return value.decode("utf-8") if isinstance(value, (bytes, np.bytes_)) else str(value)


# How a task reads one split: (config, split) -> its records (a task's `read_split`).
SplitReader = Callable[[Any, str], SplitSource]


def split_source(config, split: str, reader: SplitReader | None = None) -> SplitSource:
  """The split as `reader` reads it (default: parallel_text_split); DataError for a split that
  is not one of SPLITS."""
  if split not in SPLITS:
    raise DataError(f"unknown split {split!r}; expected one of {', '.join(SPLITS)}")
  return (reader or parallel_text_split)(config, split)


def parallel_text_split(config, split: str) -> SplitSource:
  """A split of aligned parallel text as a TFDS ArrayRecord data source (files checked and
  prepared first if needed)."""
  d = config.data
  part_sizes = ()
  if d.dataset == "local":
    prepared = _prepare_local(config)
    builder = tfds.builder_from_directory(prepared)
    parts = train_parts(config) if split == "train" else [split]
    records = builder.as_data_source(split="+".join(parts))  # the parts one after another
    part_sizes = tuple(builder.info.splits[p].num_examples for p in parts)
    dataset_id = f"parallel_text_{os.path.basename(os.path.dirname(prepared))}"
  else:
    builder = _catalog_builder(config)
    try:
      records = builder.as_data_source(split=split)
    except Exception as e:  # pylint: disable=broad-except
      raise DataError(f"cannot read split {split!r} of {d.dataset} in {builder.data_dir}: "
                      f"{str(e).splitlines()[0]} (was it prepared with file_format='array_record'?)"
                      ) from None
    dataset_id = f"{d.dataset.replace('/', '_')}_{builder.version}"
  return SplitSource(records, d.source_lang, d.target_lang, dataset_id, d.html_unescape,
                     part_sizes or (len(records),))


def check_splits(config, reader: SplitReader | None = None) -> None:
  """Reads every configured split (train, validation, and test unless data.test_files is empty)
  as `reader` does: a bad file is its DataError, naming the file and line, before anything is
  written for the run (its vocabulary, its workdir)."""
  for split in SPLITS:
    if split != "test" or config.data.test_files:
      split_source(config, split, reader)


def load_split_texts(config, split: str,
                     reader: SplitReader | None = None) -> tuple[list[str], list[str]]:
  """Cleaned (source texts, reference texts) of a split, in corpus order, nothing filtered."""
  sources, references = [], []
  for s_chunk, t_chunk in split_source(config, split, reader).chunks(reference=True):
    sources.extend(s_chunk)
    references.extend(t_chunk)
  return sources, references


def sample_train_texts(config, max_sentences: int,
                       reader: SplitReader | None = None) -> Iterator[str]:
  """Up to max_sentences non-empty cleaned sentences (both sides of random training pairs)."""
  src = split_source(config, "train", reader)
  pairs = min(len(src), max(1, max_sentences // 2))
  rng = np.random.default_rng(config.seed)
  picked = (np.sort(rng.choice(len(src), size=pairs, replace=False)) if pairs < len(src)
            else np.arange(len(src)))
  for start in range(0, len(picked), CHUNK):
    s_chunk, t_chunk = src.texts(picked[start:start + CHUNK].tolist())
    for s, t in zip(s_chunk, t_chunk):
      yield from (x for x in (s, t) if x)
