"""Workdir files on a local (or network-mounted) disk or in an object store (gs://, s3://).

Local paths are made absolute and go through `os`; URLs stay URLs (`os.path.abspath` would make
'gs://b/run' a local folder 'gs:') and go through `etils.epath` and fsspec. Orbax writes
checkpoints to the same URLs itself. Object stores have no rename, append or exclusive create;
where this module offers those it emulates them (`append_lines` rewrites the object, `rename`
copies and deletes; a whole-object write is already atomic). Callers that need more, such as the
workdir lock, check `is_remote`.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import sys
import threading

from transformer_jax.runtime.exceptions import ConfigError

_PACKAGES = {"gs": "gcsfs", "s3": "s3fs"}


def is_remote(path: str) -> bool:
  return "://" in str(path)


def _epath(path: str):
  from etils import epath  # pylint: disable=g-import-not-at-top
  return epath.Path(path)


def resolve(path: str) -> str:
  """The canonical form of a workdir: an absolute local path, or the URL as given (without a
  trailing '/') after checking that this machine can reach its store (one-line ConfigError)."""
  if not is_remote(path):
    return os.path.abspath(os.path.expanduser(path))
  scheme = path.split("://", 1)[0]
  try:
    import fsspec  # pylint: disable=g-import-not-at-top
    fsspec.get_filesystem_class(scheme)
  except (ImportError, ValueError) as e:
    package = _PACKAGES.get(scheme)
    hint = f"pip install {package}" if package else f"a filesystem package for {scheme}://"
    raise ConfigError(f"workdir {path}: {scheme}:// needs the {package or scheme} package "
                      f"({hint}); {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
  return path.rstrip("/")


def join(*parts: str) -> str:
  return os.path.join(*parts)  # posix joining keeps 'gs://bucket/run' + 'tb' a URL


def exists(path: str) -> bool:
  return _epath(path).exists() if is_remote(path) else os.path.exists(path)


def isdir(path: str) -> bool:
  return _epath(path).is_dir() if is_remote(path) else os.path.isdir(path)


def listdir(path: str) -> list[str]:
  if is_remote(path):
    return sorted(p.name for p in _epath(path).iterdir())
  return sorted(os.listdir(path))


def makedirs(path: str) -> None:
  if is_remote(path):
    _epath(path).mkdir(parents=True, exist_ok=True)
  else:
    os.makedirs(path, exist_ok=True)


def remove(path: str) -> None:
  if is_remote(path):
    _epath(path).unlink()
  else:
    os.remove(path)


def rmtree(path: str) -> None:
  if is_remote(path):
    _epath(path).rmtree(missing_ok=True)
  else:
    shutil.rmtree(path, ignore_errors=True)


def parent(path: str) -> str:
  """The folder holding `path` (a URL stays a URL)."""
  return path.rstrip("/").rsplit("/", 1)[0] if is_remote(path) else os.path.dirname(path)


def remove_empty_dir(path: str) -> None:
  """Removes the folder `path` if it exists and is empty; otherwise nothing (no error)."""
  try:
    if is_remote(path):
      if isdir(path) and not listdir(path):
        _epath(path).rmdir()
    else:
      os.rmdir(path)
  except OSError:
    pass


def rename(src: str, dst: str) -> None:
  """os.rename locally; copy + delete in an object store (not atomic there)."""
  if is_remote(src):
    _epath(src).rename(dst)
  else:
    os.rename(src, dst)


def read_text(path: str) -> str:
  if is_remote(path):
    return _epath(path).read_text()
  with open(path) as f:
    return f.read()


def read_bytes(path: str) -> bytes:
  if is_remote(path):
    return _epath(path).read_bytes()
  with open(path, "rb") as f:
    return f.read()


def temp_path(path: str) -> str:
  """A sibling of local `path` to write before an os.replace/os.link onto it, unique to this
  host, process and thread: two writers of the same file (threads of a --parallel sweep, hosts
  sharing a network disk) never share one temporary file, so neither publishes or deletes the
  other's half-written bytes."""
  return f"{path}.tmp-{socket.gethostname()}-{os.getpid()}-{threading.get_ident()}"


def write_bytes(path: str, data: bytes) -> None:
  """Writes `path` whole: locally through a temporary file and os.replace, so a reader never
  sees half a file; in an object store directly (objects appear whole)."""
  if is_remote(path):
    _epath(path).write_bytes(data)
    return
  tmp = temp_path(path)
  try:
    with open(tmp, "wb") as f:
      f.write(data)
    os.replace(tmp, path)
  except BaseException:  # a full disk: `path` keeps its old bytes, and no half file is left
    if os.path.exists(tmp):
      os.remove(tmp)
    raise


def write_text(path: str, text: str) -> None:
  write_bytes(path, text.encode("utf-8"))


def mtime(path: str) -> float:
  return _epath(path).stat().mtime if is_remote(path) else os.stat(path).st_mtime


def append_lines(path: str, lines: list[str]) -> None:
  """Appends lines (each ending in a newline): an O_APPEND write locally; a rewrite of the whole
  object in a store (which has no append; fine for the small logs written through this)."""
  if not lines:
    return
  text = "".join(lines)
  if is_remote(path):
    old = _epath(path).read_text() if _epath(path).exists() else ""
    _epath(path).write_text(old + text)
    return
  with open(path, "a") as f:
    f.write(text)


def sha256(path: str) -> str:
  """The SHA-256 of a file's bytes (hex)."""
  return hashlib.sha256(read_bytes(path)).hexdigest()


def read_lines(path: str) -> list[str]:
  """UTF-8 lines of a file or stdin ('-'); a bad byte is an error naming the line."""
  stream = sys.stdin.buffer if path == "-" else None
  if stream is None and not os.path.isfile(path):
    raise ConfigError(f"input file {path} does not exist")
  name = "stdin" if path == "-" else path
  lines = []
  with (stream if stream is not None else open(path, "rb")) as f:
    for n, raw in enumerate(f, start=1):
      try:
        # a byte-order mark (files saved on Windows) opens the first line only
        lines.append(raw.decode("utf-8-sig" if n == 1 else "utf-8").rstrip("\r\n"))
      except UnicodeDecodeError as e:
        raise ConfigError(f"{name} line {n} is not valid UTF-8 (byte {e.start})") from None
  return lines


def dangling_symlink(path: str) -> str | None:
  """Where the local `path` points when it is a symbolic link to nothing, else None."""
  if is_remote(path) or not os.path.islink(path) or os.path.exists(path):
    return None
  return os.path.normpath(os.path.join(os.path.dirname(path), os.readlink(path)))


def missing(path: str) -> str | None:
  """Why the local `path` cannot be read ('does not exist', 'is a dangling symlink to X'), or
  None when it is there. Object stores: None."""
  if is_remote(path) or os.path.exists(path):
    return None
  target = dangling_symlink(path)
  return f"is a dangling symlink to {target}" if target is not None else "does not exist"


def check_exists(path: str, what: str) -> None:
  """A one-line ConfigError `what`: PATH does not exist (or is a dangling symlink)."""
  reason = missing(path)
  if reason:
    raise ConfigError(f"{what}: {path} {reason}")


def cannot_write_in(folder: str) -> str | None:
  """Why no file can be created in the local `folder` (e.g. 'Read-only file system'), or None;
  tried with a file created and removed at once. Object stores: None."""
  if is_remote(folder):
    return None
  target = dangling_symlink(folder)
  if target is not None:
    return f"it is a dangling symlink to {target}"
  if not os.path.isdir(folder):
    return "no such folder"
  probe = os.path.join(folder, f".write-check-{os.getpid()}-{threading.get_ident()}")
  try:
    with open(probe, "w"):
      pass
    os.remove(probe)
  except OSError as e:
    return e.strerror or str(e)
  return None


def check_writable(path: str, what: str) -> None:
  """A one-line ConfigError unless a file can be written at `path` (its folder exists and takes
  a file): checked before the work whose results go there, never after it."""
  if is_remote(path) or path == "-":
    return
  folder = os.path.dirname(os.path.abspath(path)) or "."
  if os.path.isdir(path):
    raise ConfigError(f"{what} {path} is a folder; name a file")
  if not os.path.isdir(folder):
    raise ConfigError(f"{what} {path}: the folder {folder} does not exist; create it first")
  reason = cannot_write_in(folder)
  if reason:
    raise ConfigError(f"{what} {path}: cannot write in {folder} ({reason})")
