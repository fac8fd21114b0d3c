"""Where the next read of the accounting file starts: rotation, truncation, regrowth.

A checkpoint is (inode, byte offset, fingerprint). The fingerprint is
``"<n>:<sha256 hex>"`` of the file's first ``n = min(offset,
FINGERPRINT_BYTES)`` bytes: bytes already consumed, which an append-only file
never changes. :func:`plan_read` compares the file at ``path`` with the
checkpoint and says which file to read next, and from where:

- same inode, same first bytes, not shorter: go on from the offset;
- same inode, but shorter than the offset (truncated) or with other first
  bytes (truncated and regrown past the old offset, which size alone cannot
  see): read it again from 0 (``reset='truncated'``);
- another inode (``logchecker.sh`` or an admin moved the file aside and the
  qmaster started a new one): first the rest of the rotated file, found by
  its inode among the files of the same folder whose name starts with the
  accounting file's name (``accounting.0``, ``accounting.20261201``...),
  as long as it holds a complete line after the offset; then the new file
  from 0 (``reset='rotated'``). Lines written just before the rotation are
  thus read from the rotated file, never skipped.

A last line without its newline is never consumed (``read_accounting``
leaves it for the next pass), so a half-written line is neither ingested
nor quarantined while the qmaster is still writing it. A rotated file's
incomplete last line can no longer grow: it is left unread (and logged by
the caller).

No Django here: the caller stores the checkpoint (dashboards/ingest.py).
"""
from __future__ import annotations

import dataclasses
import hashlib
import logging
import os

from .base import AccountingCursor

log = logging.getLogger(__name__)

__all__ = ["FINGERPRINT_BYTES", "ReadPlan", "fingerprint", "find_rotated", "plan_read"]

#: How many leading bytes (at most) the fingerprint covers.
FINGERPRINT_BYTES = 4096


@dataclasses.dataclass(frozen=True)
class ReadPlan:
    """Which file to read next and from where.

    ``path``: the file to open; ``cursor``: where to start in it (None: from
    byte 0); ``reset``: ``'rotated'`` or ``'truncated'`` when earlier reading
    is abandoned for a new start at 0, else None; ``rotated``: True when
    ``path`` is the rotated copy being read to its end.
    """

    path: str
    cursor: AccountingCursor | None
    reset: str | None = None
    rotated: bool = False


def fingerprint(path: str | os.PathLike, offset: int, *, inode: int | None = None) -> str:
    """``"<n>:<sha256 hex>"`` of the first ``n = min(offset, FINGERPRINT_BYTES)`` bytes of ``path``.

    Returns ``""`` for offset 0, for a file shorter than ``n`` bytes, for a
    missing file, or when ``inode`` is given and the file at ``path`` has
    another one (it was swapped meanwhile): an empty fingerprint matches
    nothing and is never stored as if it did.
    """
    n = min(max(int(offset), 0), FINGERPRINT_BYTES)
    if n == 0:
        return ""
    try:
        with open(path, "rb") as fh:
            if inode is not None and os.fstat(fh.fileno()).st_ino != inode:
                return ""
            head = fh.read(n)
    except OSError:
        return ""
    if len(head) < n:
        return ""
    return f"{n}:{hashlib.sha256(head).hexdigest()}"


def find_rotated(path: str | os.PathLike, inode: int) -> str | None:
    """The file beside ``path`` (same folder, name starting with ``path``'s name) whose inode is ``inode``.

    Returns its path, or None when there is none (deleted, compressed, moved
    elsewhere). Only regular files are considered.
    """
    path = os.fspath(path)
    folder, base = os.path.split(path)
    try:
        entries = list(os.scandir(folder or "."))
    except OSError:
        return None
    for entry in entries:
        if entry.name == base or not entry.name.startswith(base):
            continue
        try:
            if entry.is_file(follow_symlinks=False) and entry.inode() == inode:
                return entry.path
        except OSError:
            continue
    return None


def _complete_line_after(path: str, offset: int, *, block: int = 65536) -> bool:
    """Whether ``path`` holds a newline at or after byte ``offset``."""
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            while True:
                data = fh.read(block)
                if not data:
                    return False
                if b"\n" in data:
                    return True
    except OSError:
        return False


def plan_read(path: str | os.PathLike, inode: int, offset: int, fp: str) -> ReadPlan:
    """Compare the checkpoint (``inode``, ``offset``, fingerprint ``fp``) with the file at ``path``.

    ``inode`` 0 means no checkpoint yet (read ``path`` from 0, no reset). An
    empty ``fp`` (a checkpoint stored before fingerprints, or at offset 0)
    falls back to the size check alone. Raises FileNotFoundError when
    ``path`` does not exist and no rotated copy is left to read.
    """
    path = os.fspath(path)
    if not inode:
        return ReadPlan(path, None)
    try:
        stat = os.stat(path)
    except FileNotFoundError:
        stat = None
    if stat is not None and stat.st_ino == inode:
        if stat.st_size < offset:
            return ReadPlan(path, None, "truncated")
        if fp and fingerprint(path, offset, inode=inode) != fp:
            return ReadPlan(path, None, "truncated")
        return ReadPlan(path, AccountingCursor(inode=inode, offset=offset))
    rotated = find_rotated(path, inode)
    if rotated is not None and (not fp or fingerprint(rotated, offset, inode=inode) == fp):
        if _complete_line_after(rotated, offset):
            return ReadPlan(rotated, AccountingCursor(inode=inode, offset=offset), rotated=True)
        left = os.path.getsize(rotated) - offset
        if left > 0:
            log.warning("rotated accounting file %s ends in an incomplete line (%d bytes): left unread",
                        rotated, left)
    if stat is None:
        raise FileNotFoundError(path)
    return ReadPlan(path, None, "rotated")
