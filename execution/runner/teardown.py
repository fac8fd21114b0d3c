"""The runner's watches and clean-up: the work directory's size, the process group, the private
directory. Linux (/proc) only; standard library only.
"""
from __future__ import annotations

import os
import signal
import stat
import threading
import time
from collections.abc import Callable, Iterator


#: What :func:`tree_bytes` counts for a directory it cannot read even after giving its owner the
#: permission back: more than any limit (a directory the runner cannot measure is over it).
UNREADABLE_BYTES = 1 << 62


def tree_bytes(root: str) -> int:
    """Disk space (bytes, from ``st_blocks``) the tree at ``root`` takes, links not followed;
    what vanishes during the walk is skipped.

    An agent may hide a tree from the walk with ``chmod 0`` on a directory (a file descriptor it
    opened before keeps writing into it): a directory the walk cannot open (EACCES) that the
    runner's account owns -- everything the sandbox writes is the submit account's -- gets its
    owner's rwx back and is read; one that still cannot be read counts :data:`UNREADABLE_BYTES`,
    so the limit stops the agent rather than missing what it hides (issue 23, fresh attack A1).
    """
    total, stack = 0, [root]
    while stack:
        path = stack.pop()
        try:
            entries = os.scandir(path)
        except FileNotFoundError:
            continue
        except PermissionError:
            try:
                info = os.lstat(path)
                if info.st_uid == os.geteuid() and stat.S_ISDIR(info.st_mode):
                    os.chmod(path, stat.S_IMODE(info.st_mode) | stat.S_IRWXU)
                entries = os.scandir(path)
            except FileNotFoundError:
                continue
            except OSError:
                total += UNREADABLE_BYTES
                continue
        except OSError:
            continue
        with entries:
            for entry in entries:
                try:
                    info = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                total += info.st_blocks * 512
                if stat.S_ISDIR(info.st_mode):
                    stack.append(entry.path)
    return total


def live_processes() -> Iterator[tuple[int, list[bytes]]]:
    """``(pid, fields)`` of every live (not zombie) process, ``fields`` being /proc/<pid>/stat's
    fields after "(comm)": state ppid pgrp ... (comm may hold spaces or ')'; proc(5))."""
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                line = fh.read()
        except OSError:
            continue
        fields = line[line.rindex(b")") + 2:].split()
        if len(fields) > 2 and fields[0] != b"Z":
            yield int(name), fields


def descendants(root_pid: int) -> list[int]:
    """Pids of every live process descended from ``root_pid`` (children, theirs, ...: the sandbox's
    processes are the runner's, whatever pid namespace they see), from /proc/<pid>/stat's ppid."""
    children: dict[int, list[int]] = {}
    for pid, fields in live_processes():
        children.setdefault(int(fields[1]), []).append(pid)
    out, stack = [], list(children.get(root_pid, []))
    while stack:
        pid = stack.pop()
        out.append(pid)
        stack.extend(children.get(pid, []))
    return out


def deleted_open_bytes(pids: list[int], device: int) -> int:
    """Disk space (bytes, ``st_blocks``) of files on ``device`` (an ``st_dev``) that ``pids`` hold
    open after they were deleted: a walk of the work directory no longer sees them, the disk
    still holds them until the last descriptor closes (proc(5): /proc/<pid>/fd/<n> reads
    "<path> (deleted)"). Each file counts once; descriptors that cannot be read are skipped."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            link = f"/proc/{pid}/fd/{fd}"
            try:
                if not os.readlink(link).endswith(" (deleted)"):
                    continue
                info = os.stat(link)
            except OSError:
                continue
            key = (info.st_dev, info.st_ino)
            if info.st_dev == device and stat.S_ISREG(info.st_mode) and key not in seen:
                seen.add(key)
                total += info.st_blocks * 512
    return total


def workdir_bytes(path: str, pids: list[int] | None = None) -> int:
    """What the task's work directory takes on its disk: :func:`tree_bytes` of ``path`` plus the
    deleted files ``pids`` (default: the runner's descendants, i.e. the sandbox) still hold open on
    the same file system. Bytes."""
    try:
        device = os.stat(path).st_dev
    except OSError:
        return 0
    if pids is None:
        pids = descendants(os.getpid())
    return tree_bytes(path) + deleted_open_bytes(pids, device)


class WorkdirWatch(threading.Thread):
    """Measure the work directory at ``path`` every ``interval_s`` seconds (:func:`workdir_bytes`:
    the tree, what it hides behind a closed directory, and the deleted files the sandbox holds
    open); once it takes more than ``limit`` bytes, call ``on_over`` once and stop (or stop when
    ``done`` is set). ``is_over`` (no argument; True when the limit is reached) replaces that
    measure: a tmpfs work directory whose size the kernel holds is full
    (execution/runner/workdir_tmpfs.py)."""

    def __init__(self, path: str, limit: int, interval_s: float, on_over: Callable[[], None],
                 is_over: Callable[[], bool] | None = None) -> None:
        super().__init__(daemon=True, name="tco-workdir-watch")
        self.path, self.limit, self.interval_s, self.on_over = path, limit, interval_s, on_over
        self.is_over = is_over or (lambda: workdir_bytes(self.path) > self.limit)
        self.done = threading.Event()

    def run(self) -> None:
        """Check until over the limit or ``done``."""
        while not self.done.wait(self.interval_s):
            if self.is_over():
                self.on_over()
                return


def group_members() -> list[int]:
    """Live processes (pids) in the runner's process group, other than the runner (Linux /proc)."""
    me, group = os.getpid(), os.getpgrp()
    return [pid for pid, fields in live_processes() if pid != me and int(fields[2]) == group]


def terminate_group(grace_s: float) -> None:
    """SIGTERM every other process of the runner's group, wait up to ``grace_s`` seconds, SIGKILL
    the rest (nothing of the sandbox is in it; this catches anything else the runner may have
    left). Ignores SIGTERM from then on: killpg reaches the runner too, which is tearing down."""
    if not group_members():
        return
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        os.killpg(os.getpgrp(), signal.SIGTERM)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and group_members():
        time.sleep(0.02)
    for pid in group_members():
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def remove_tree(path: str) -> None:
    """Remove the runner's private directory (its own small tree; links are not followed).
    Never raises: what cannot be removed stays."""
    try:
        entries = list(os.scandir(path))
    except OSError:
        return
    for entry in entries:
        if entry.is_dir(follow_symlinks=False):
            remove_tree(entry.path)
        else:
            try:
                os.unlink(entry.path)
            except OSError:
                pass
    try:
        os.rmdir(path)
    except OSError:
        pass


#: What a program that could not write past RLIMIT_FSIZE writes to its stderr (EFBIG; Python
#: ignores SIGXFSZ, so it gets the error instead of the signal).
FILE_TOO_LARGE_MARKERS = (b"File too large",)
#: What a program that failed to allocate memory writes to its stderr (Python, C/glibc, C++,
#: Node, Go, Rust).
OUT_OF_MEMORY_MARKERS = (b"MemoryError", b"Cannot allocate memory", b"std::bad_alloc", b"out of memory",
                         b"Out of memory", b"memory allocation of", b"JavaScript heap out of memory")


def out_of_memory(stderr_path: str, tail_bytes: int = 8192) -> bool:
    """Whether the end of the agent's captured stderr says an allocation failed (the sign of
    RLIMIT_DATA: the kernel refuses the memory, the program reports it and exits)."""
    return stderr_says(stderr_path, OUT_OF_MEMORY_MARKERS, tail_bytes)


def file_too_large(stderr_path: str, tail_bytes: int = 8192) -> bool:
    """Whether the end of the agent's captured stderr says a write failed with EFBIG."""
    return stderr_says(stderr_path, FILE_TOO_LARGE_MARKERS, tail_bytes)


def stderr_says(stderr_path: str, markers: tuple[bytes, ...], tail_bytes: int) -> bool:
    """Whether one of ``markers`` is in the last ``tail_bytes`` of ``stderr_path``."""
    try:
        with open(stderr_path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(fh.tell() - tail_bytes, 0))
            tail = fh.read()
    except OSError:
        return False
    return any(marker in tail for marker in markers)
