"""What the agent leaves: its output pipes, its declared output files, and the usage file.

See docs/runner.md ("Files under the spool directory"). Everything the agent
wrote is read without following a link it may have planted.
"""
from __future__ import annotations

import os
import stat
import threading
from collections.abc import Mapping

from execution.runner.config import MAX_OUTPUT_FILES, OUTPUT_FILE_CAP_BYTES


class Capture(threading.Thread):
    """Copy one pipe (``fd``, closed at the end) into the file ``path`` (created 0600), keeping at
    most ``cap`` bytes and draining the rest; :attr:`truncated` says whether some was dropped."""

    def __init__(self, fd: int, path: str, cap: int) -> None:
        super().__init__(daemon=True)
        self.fd = fd
        self.path = path
        self.cap = cap
        self.written = 0
        self.truncated = False

    def run(self) -> None:
        """Copy until the pipe's write ends are all closed."""
        with os.fdopen(os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600),
                       "wb") as out:
            while True:
                try:
                    chunk = os.read(self.fd, 65536)
                except OSError:
                    break
                if not chunk:
                    break
                room = self.cap - self.written
                if room > 0:
                    out.write(chunk[:room])
                    self.written += min(room, len(chunk))
                if len(chunk) > room:
                    self.truncated = True
        os.close(self.fd)


def open_beneath(root: str, relative: str) -> int:
    """Open ``root/relative`` for reading (a file descriptor) without following any link on the
    way (the agent wrote the work directory). Raises OSError (also for ``.``/``..`` parts)."""
    parts = [p for p in relative.split("/") if p]
    if not parts or any(p in (".", "..") for p in parts):
        raise OSError(f"{relative!r} is not a relative path")
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in parts[:-1]:
            nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = nxt
        return os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=fd)
    finally:
        os.close(fd)


def copy_outputs(patterns: list[str], *, work_dir: str, target_dir: str, into: list[dict]) -> bool:
    """Copy the declared outputs (relative paths or globs in ``work_dir``) to ``target_dir``
    (``<task>.outputs/``, made 0700), each capped at :data:`OUTPUT_FILE_CAP_BYTES`, at most
    :data:`MAX_OUTPUT_FILES`; appends ``{"name", "path", "bytes", "truncated"}`` to ``into`` as
    it goes. Returns True if an output was skipped (not a regular file in the work directory,
    or too many). Raises OSError when a copy cannot be written."""
    import glob

    names: list[str] = []
    for pattern in patterns:
        if any(ch in pattern for ch in "*?["):
            names += sorted(glob.glob(pattern, root_dir=work_dir))
        else:
            names.append(pattern)
    skipped = False
    seen = set()
    for name in names:
        name = os.path.normpath(name)
        if name in seen:
            continue
        seen.add(name)
        if len(into) >= MAX_OUTPUT_FILES:
            skipped = True
            break
        try:
            fd = open_beneath(work_dir, name)
        except OSError:
            if not os.path.lexists(os.path.join(work_dir, name)):
                continue  # not written: nothing to show
            skipped = True
            continue
        with os.fdopen(fd, "rb") as src:
            if not stat.S_ISREG(os.fstat(src.fileno()).st_mode):
                skipped = True
                continue
            data = src.read(OUTPUT_FILE_CAP_BYTES + 1)
        os.makedirs(target_dir, mode=0o700, exist_ok=True)
        target = os.path.join(target_dir, name.replace("/", "__"))
        with os.fdopen(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600),
                       "wb") as out:
            out.write(data[:OUTPUT_FILE_CAP_BYTES])
        into.append({"name": name, "path": target, "bytes": min(len(data), OUTPUT_FILE_CAP_BYTES),
                     "truncated": len(data) > OUTPUT_FILE_CAP_BYTES})
    return skipped


def write_usage_file(path: str, usage: Mapping) -> None:
    """The task's token totals (the proxy's ``usage``) as ``tco_<key>=<number>`` lines in a fresh
    file at ``path`` (``<task>.usage``).

    For OCS/GCS 9 flexible accounting: the shepherd's usage file belongs to the admin user, so
    the runner cannot write it; the epilog ``execution/usage_epilog.py`` (run as that user)
    appends this file to it. Raises OSError, ValueError (a non-numeric total)."""
    from execution.metering.usage_file import append_usage_file

    if os.path.exists(path):
        os.unlink(path)
    append_usage_file(path, usage)
