"""Writing and reading spool files safely: private directories, atomic writes, streamed JSON lines.

Standard library only.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Iterator, Mapping

__all__ = ["make_private_dirs", "write_atomic", "write_json_atomic", "JsonLinesStats", "iter_json_lines"]


def make_private_dirs(path: str | os.PathLike) -> None:
    """``os.makedirs(path, exist_ok=True)``, but every directory it makes is 0700 (``makedirs``
    gives its ``mode`` to the last one only): the spool is the submit account's alone. Existing
    directories are left as they are. Raises OSError."""
    path = os.path.abspath(os.fspath(path))
    missing = []
    while not os.path.isdir(path):
        missing.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    for directory in reversed(missing):
        try:
            os.mkdir(directory, 0o700)
        except FileExistsError:
            if not os.path.isdir(directory):
                raise


def write_atomic(path: str | os.PathLike, data: bytes, *, mode: int = 0o600) -> None:
    """Write ``data`` to ``path`` so that a reader sees the old file or the whole new one.

    A temporary file in the same directory (made if missing), written and
    ``fsync``-ed, then ``os.replace``-d over ``path``, then the directory
    ``fsync``-ed (skipped where the filesystem refuses it). ``mode`` is the
    new file's permission bits (default 0600: the spool is the submit account's
    alone; missing directories are made 0700, :func:`make_private_dirs`). Raises
    OSError; the temporary file is removed on failure.
    """
    path = os.fspath(path)
    directory = os.path.dirname(path) or "."
    make_private_dirs(directory)
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}.{id(data):x}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    try:
        dir_fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dir_fd)
    except OSError:
        pass  # some filesystems (NFS, tmpfs variants) refuse fsync on a directory
    finally:
        os.close(dir_fd)


def write_json_atomic(path: str | os.PathLike, data: Mapping[str, Any], *, mode: int = 0o600) -> None:
    """:func:`write_atomic` of ``data`` as indented JSON text with a final newline."""
    write_atomic(path, (json.dumps(data, indent=1) + "\n").encode(), mode=mode)



@dataclasses.dataclass
class JsonLinesStats:
    """What :func:`iter_json_lines` passed over: ``lines`` yielded, ``too_long`` skipped lines
    (longer than the limit; never held in memory), ``bytes_read``."""

    lines: int = 0
    too_long: int = 0
    bytes_read: int = 0


def iter_json_lines(path: str | os.PathLike, *, max_line_bytes: int = 1 << 20, chunk_bytes: int = 1 << 16,
                    stats: JsonLinesStats | None = None) -> Iterator[Any]:
    """The JSON value of each non-blank line of ``path``, read ``chunk_bytes`` at a time.

    Memory stays bounded by ``chunk_bytes + max_line_bytes`` whatever the
    file's size: a line longer than ``max_line_bytes`` is skipped as it
    streams past and counted in ``stats.too_long``. Raises OSError, and
    ValueError for a line that is not JSON (the line number in the message).
    """
    stats = stats if stats is not None else JsonLinesStats()
    pending = bytearray()
    skipping = False
    number = 0
    with open(path, "rb") as fh:
        while True:
            chunk = fh.read(chunk_bytes)
            stats.bytes_read += len(chunk)
            if not chunk:
                break
            start = 0
            while True:
                end = chunk.find(b"\n", start)
                if end < 0:
                    if not skipping:
                        pending += chunk[start:]
                        if len(pending) > max_line_bytes:
                            pending.clear()
                            skipping = True
                    break
                number += 1
                if skipping:
                    stats.too_long += 1
                    skipping = False
                else:
                    pending += chunk[start:end]
                    if len(pending) > max_line_bytes:
                        stats.too_long += 1
                    elif pending.strip():
                        yield _json_line(pending, path, number)
                        stats.lines += 1
                    pending.clear()
                start = end + 1
    if skipping:
        stats.too_long += 1
    elif pending.strip():
        yield _json_line(pending, path, number + 1)
        stats.lines += 1


def _json_line(data: bytearray, path, number: int) -> Any:
    try:
        return json.loads(bytes(data))
    except ValueError as exc:
        raise ValueError(f"{os.fspath(path)} line {number} is not JSON: {exc}") from None
