"""The runner's watches and clean-up: the work directory's size, the process group, the private
directory. Linux (/proc) only; standard library only.
"""
from __future__ import annotations

import os
import signal
import stat
import threading
import time
from collections.abc import Callable


def tree_bytes(root: str) -> int:
    """Disk space (bytes, from ``st_blocks``) the tree at ``root`` takes, links not followed;
    what vanishes during the walk is skipped."""
    total, stack = 0, [root]
    while stack:
        try:
            entries = os.scandir(stack.pop())
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


class WorkdirWatch(threading.Thread):
    """Walk the work directory at ``path`` every ``interval_s`` seconds; once it takes more than
    ``limit`` bytes, call ``on_over`` once and stop (or stop when ``done`` is set)."""

    def __init__(self, path: str, limit: int, interval_s: float, on_over: Callable[[], None]) -> None:
        super().__init__(daemon=True, name="tco-workdir-watch")
        self.path, self.limit, self.interval_s, self.on_over = path, limit, interval_s, on_over
        self.done = threading.Event()

    def run(self) -> None:
        """Walk until over the limit or ``done``."""
        while not self.done.wait(self.interval_s):
            if tree_bytes(self.path) > self.limit:
                self.on_over()
                return


def group_members() -> list[int]:
    """Live processes (pids) in the runner's process group, other than the runner (Linux /proc)."""
    me, group = os.getpid(), os.getpgrp()
    members = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                line = fh.read()
        except OSError:
            continue
        # Fields after "(comm)": state ppid pgrp ...; comm may hold spaces or ')'.
        fields = line[line.rindex(b")") + 2:].split()
        if len(fields) > 2 and int(fields[2]) == group and fields[0] != b"Z":
            members.append(int(name))
    return members


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
