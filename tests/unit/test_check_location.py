"""scripts/check-location: scripts/setup says where a clone cannot work before it installs anything."""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "check-location"


def check(directory: str, account: str = "tco-no-such-account") -> subprocess.CompletedProcess:
    return subprocess.run([str(SCRIPT), directory, account], capture_output=True, text=True, timeout=30)


def test_a_clone_in_tmp_is_fine():
    done = check("/tmp/x")
    assert (done.returncode, done.stdout) == (0, "")


@pytest.mark.parametrize("tree", ["/proc", "/dev", "/run/tco"])
def test_the_kernels_trees_are_refused_with_what_to_do(tree):
    done = check(f"{tree}/x")
    assert done.returncode == 1
    assert f"tco's code is in {tree}/x, inside {tree}: the agents' sandbox cannot show code from there" in done.stdout
    assert "git clone <this repository> /opt/tco" in done.stdout


def test_a_parent_the_submit_account_cannot_enter_is_named():
    base = Path(tempfile.mkdtemp(prefix="tco-check-location-", dir="/tmp"))  # /tmp: every account enters
    try:
        os.chmod(base, 0o755)
        locked = base / "home"  # like /root
        locked.mkdir()
        os.chmod(locked, 0o700)
        done = check(str(locked / "x"))
        assert done.returncode == 1
        assert f"{locked} (mode 700, owner " in done.stdout
        assert "Grid Engine starts every agent as tco-no-such-account from this directory" in done.stdout
        assert f"chmod o+x {locked}" in done.stdout
        os.chmod(locked, 0o711)
        assert check(str(locked / "x")).returncode == 0
    finally:
        shutil.rmtree(base)
