"""The work directory's size as the runner's disk-limit watch measures it (execution/runner/teardown.py).

The fresh attack of issue 23 (A1): an agent under a 64 MiB disk limit wrote 513 MiB and ended "done":
it hid a tree behind ``chmod 0`` on a directory (writing through a descriptor it opened before),
and wrote into files it had deleted while holding them open; the walk counted 8 KiB. Both are
measured here with real files, as the submit account the tests run as (root would read the closed
directory anyway: the first case is then only what it was).
"""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from execution.runner.teardown import UNREADABLE_BYTES, deleted_open_bytes, tree_bytes, workdir_bytes

MIB = 1 << 20


def write(path, size: int) -> None:
    with open(path, "wb") as fh:
        fh.write(os.urandom(size))  # real blocks: st_blocks counts them


def test_a_tree_hidden_behind_a_closed_directory_is_measured(tmp_path):
    hidden = tmp_path / "h"
    (hidden / "d").mkdir(parents=True)
    write(hidden / "d" / "fill", 5 * MIB)
    write(tmp_path / "open", MIB)
    os.chmod(hidden, 0)
    try:
        measured = tree_bytes(str(tmp_path))
    finally:
        os.chmod(hidden, 0o700)
    assert measured >= 6 * MIB
    assert measured < UNREADABLE_BYTES  # read, not guessed: the runner's account owns it


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any directory: nothing is closed to it")
def test_a_directory_the_runner_cannot_open_counts_over_any_limit(tmp_path, monkeypatch):
    (tmp_path / "h").mkdir()
    os.chmod(tmp_path / "h", 0)
    monkeypatch.setattr(os, "chmod", lambda *a, **k: (_ for _ in ()).throw(PermissionError(1, "refused")))
    try:
        assert tree_bytes(str(tmp_path)) >= UNREADABLE_BYTES
    finally:
        monkeypatch.undo()
        os.chmod(tmp_path / "h", 0o700)


def test_deleted_files_the_sandbox_holds_open_count_until_closed(tmp_path):
    # A child process (as the sandbox's processes are the runner's descendants) writes 3 MiB into a
    # file it deleted, and 2 MiB into another, and keeps both open.
    code = ("import os,sys,time\n"
            "for name, size in (('a', 3), ('b', 2)):\n"
            "    p = os.path.join(sys.argv[1], name); fd = os.open(p, os.O_CREAT | os.O_WRONLY); os.unlink(p)\n"
            "    os.write(fd, os.urandom(size << 20)); os.fsync(fd)\n"
            "print('ready', flush=True); time.sleep(60)\n")
    child = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        assert tree_bytes(str(tmp_path)) < MIB  # the walk sees nothing
        device = os.stat(tmp_path).st_dev
        assert deleted_open_bytes([child.pid], device) >= 5 * MIB
        assert deleted_open_bytes([child.pid], device + 1) == 0  # another file system's files are not ours
        assert workdir_bytes(str(tmp_path)) >= 5 * MIB  # the runner's descendants, found by itself
    finally:
        child.kill()
        child.wait()
    deadline = time.monotonic() + 5
    while workdir_bytes(str(tmp_path)) >= MIB and time.monotonic() < deadline:
        time.sleep(0.05)
    assert workdir_bytes(str(tmp_path)) < MIB  # closed: freed, and no longer counted
