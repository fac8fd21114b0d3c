"""The work directory as a tmpfs of its own: the kernel holds the task's disk limit.

Under bubblewrap the sandbox's ``/sandbox`` is a tmpfs of ``TCO_SANDBOX_WORK_BYTES``
(``--size N --tmpfs /sandbox``, bubblewrap >= 0.8; issue 23, finding 1), unless the site asks
for the old bind of the spool's work directory (``TCO_SANDBOX_WORKDIR=spool``,
:func:`workdir_mode`). A write past the size fails with ENOSPC, whatever the agent does (many
files, one file, files deleted but held open, a tree behind ``chmod 0``): the spool's disk,
shared with the database and the logs at a small site, takes nothing while the agent runs.
Its pages are memory, charged to the task's memory cgroup
(execution/runner/memory_cgroup.py), whose limit is therefore the memory limit plus this one.

The runner holds the tmpfs through a descriptor opened in the relay's root while the sandbox
is built (``BwrapSandbox.work_fd``; the file system lives on after the sandbox while the
descriptor is open), measures it (:func:`usage`: statvfs, no walk), copies the declared outputs
from it and, at the end, the tree the agent left (:func:`keep_tree`) to the spool's work
directory, where the task page lists it as before. Standard library only.
"""
from __future__ import annotations

import os
import stat
from collections.abc import Mapping

from execution.runner.config import RunnerError

#: ``TCO_SANDBOX_WORKDIR``: where /sandbox lives (default first).
WORKDIR_MODES = ("tmpfs", "spool")
#: The most files and directories :func:`keep_tree` copies back (a tmpfs holds many empty files).
MAX_KEPT_ENTRIES = 10_000
COPY_CHUNK = 1 << 20


def workdir_mode(environ: Mapping[str, str]) -> str:
    """``TCO_SANDBOX_WORKDIR``: ``tmpfs`` (default: the work directory is a tmpfs of the disk limit's
    size, held by the kernel) or ``spool`` (the spool's work directory bound at /sandbox, its size
    measured by the runner's walk every ``TCO_SANDBOX_WORK_CHECK_S``: for sites whose work
    directories must outgrow memory). Raises RunnerError for another value."""
    value = (environ.get("TCO_SANDBOX_WORKDIR") or WORKDIR_MODES[0]).strip()
    if value not in WORKDIR_MODES:
        raise RunnerError(f"TCO_SANDBOX_WORKDIR={value!r}: expected one of {', '.join(WORKDIR_MODES)}")
    return value


def usage(fd: int) -> tuple[int, bool]:
    """``(bytes used, full)`` of the file system open at ``fd`` (statvfs: blocks in use times the
    block size; full when no block is left, so the next write fails with ENOSPC). Raises OSError."""
    info = os.fstatvfs(fd)
    return (info.f_blocks - info.f_bfree) * info.f_frsize, info.f_bavail == 0


def view_path(fd: int) -> str:
    """A path for the directory open at ``fd`` that reaches it from this process even after the
    sandbox (its mount namespace) is gone: ``/proc/self/fd/N``."""
    return f"/proc/self/fd/{fd}"


def _copy_file(src_dir: int, name: str, dest_dir: int, max_bytes: int) -> int:
    """Copy the regular file ``name`` of ``src_dir`` into ``dest_dir`` (0600, replacing a file or
    link of that name, never following one), at most ``max_bytes`` of it. Returns the bytes copied;
    0 and nothing copied for anything but a regular file. Raises OSError."""
    src = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=src_dir)
    try:
        if not stat.S_ISREG(os.fstat(src).st_mode):
            return 0
        try:
            os.unlink(name, dir_fd=dest_dir)
        except FileNotFoundError:
            pass
        dst = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=dest_dir)
        copied = 0
        try:
            while copied < max_bytes and (chunk := os.read(src, min(COPY_CHUNK, max_bytes - copied))):
                os.write(dst, chunk)
                copied += len(chunk)
        finally:
            os.close(dst)
        return copied
    finally:
        os.close(src)


def keep_tree(src: str, dest: str, *, max_bytes: int, max_entries: int = MAX_KEPT_ENTRIES) -> dict:
    """Copy the tree at ``src`` (the tmpfs, :func:`view_path`) into the directory ``dest`` (the
    spool's work directory): regular files and directories only, links and devices skipped, no link
    followed on either side, files 0600 and directories 0700, at most ``max_entries`` of them and at
    most ``max_bytes`` bytes in all (the task's work directory limit, ``TCO_SANDBOX_WORK_BYTES``); a
    directory the agent closed (``chmod 0``) gets its owner's rwx back first (the sandbox's files are
    this account's). The byte bound counts each file's length, not its blocks on the tmpfs: a sparse
    file of 1 GiB holds a few blocks there and would be written whole here, and a file hard-linked
    40 times would be written 40 times (a hostile agent's 8 MiB of tmpfs left 3.4 GiB on the spool's
    disk, issue 23). So a file whose length passes what is left of ``max_bytes`` is not copied, and
    a further hard link of a file already copied is not copied again; both count as skipped. Returns
    ``{"files", "bytes", "skipped"}`` (``skipped``: entries not copied: links, devices, past a cap,
    unreadable). Never raises for what the agent left; raises OSError when ``dest`` cannot be opened."""
    kept = {"files": 0, "bytes": 0, "skipped": 0}
    entries = 0
    seen: set[tuple[int, int]] = set()   # (st_dev, st_ino) of the files copied
    top_src = os.open(src, os.O_RDONLY | os.O_DIRECTORY)
    top_dest = os.open(dest, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    stack = [(top_src, top_dest)]
    try:
        while stack:
            src_fd, dest_fd = stack.pop()
            try:
                names = sorted(os.listdir(src_fd))
            except OSError:
                kept["skipped"] += 1
                names = []
            for name in names:
                if entries >= max_entries:
                    kept["skipped"] += 1
                    continue
                try:
                    info = os.stat(name, dir_fd=src_fd, follow_symlinks=False)
                    if stat.S_ISREG(info.st_mode):
                        if (info.st_dev, info.st_ino) in seen or info.st_size > max_bytes - kept["bytes"]:
                            kept["skipped"] += 1
                            continue
                        seen.add((info.st_dev, info.st_ino))
                        if info.st_uid == os.geteuid() and not info.st_mode & stat.S_IRUSR:
                            os.chmod(name, stat.S_IMODE(info.st_mode) | stat.S_IRUSR, dir_fd=src_fd)
                        kept["bytes"] += _copy_file(src_fd, name, dest_fd, max_bytes - kept["bytes"])
                        kept["files"] += 1
                        entries += 1
                    elif stat.S_ISDIR(info.st_mode):
                        if info.st_uid == os.geteuid() and (info.st_mode & stat.S_IRWXU) != stat.S_IRWXU:
                            os.chmod(name, stat.S_IMODE(info.st_mode) | stat.S_IRWXU, dir_fd=src_fd)
                        try:
                            os.mkdir(name, 0o700, dir_fd=dest_fd)
                        except FileExistsError:
                            pass
                        child_dest = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dest_fd)
                        try:
                            child_src = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=src_fd)
                        except OSError:
                            os.close(child_dest)
                            raise
                        stack.append((child_src, child_dest))
                        entries += 1
                    else:
                        kept["skipped"] += 1
                except OSError:
                    kept["skipped"] += 1
            os.close(src_fd)
            os.close(dest_fd)
    finally:
        for src_fd, dest_fd in stack:
            os.close(src_fd)
            os.close(dest_fd)
    return kept
