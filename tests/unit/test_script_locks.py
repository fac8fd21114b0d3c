"""A daemon started by one of tco's scripts run under the dev cluster's lock does not keep the lock.

`flock FILE make demo` left redis-server (started by scripts/dev-cluster) holding the lock's
descriptor: every later `flock FILE ...` waited for good. The scripts now close what they
inherited (scripts/fds.sh ``close_inherited_fds``) before starting anything.
"""
from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def lock_free_after(tmp_path: Path, script: str) -> bool:
    lock = tmp_path / "cluster.lock"
    daemon = subprocess.Popen(["flock", str(lock), "bash", "-c", script, "demo", str(REPO / "scripts/fds.sh")],
                              stdout=subprocess.PIPE, text=True)
    pid = int(daemon.stdout.readline())      # the "daemon" the script left running
    daemon.wait(timeout=10)
    try:
        return subprocess.run(["flock", "-n", str(lock), "true"]).returncode == 0
    finally:
        subprocess.run(["kill", str(pid)])


DAEMON = "sleep 30 >/dev/null 2>&1 & echo $!"


def test_a_daemon_started_after_close_inherited_fds_leaves_the_lock_free(tmp_path):
    assert lock_free_after(tmp_path, 'source "$1"; close_inherited_fds; ' + DAEMON)


def test_without_it_the_daemon_would_hold_the_lock(tmp_path):
    assert not lock_free_after(tmp_path, DAEMON)     # the fault this guards against, shown


def test_every_script_that_starts_daemons_closes_what_it_inherited():
    for name in ("dev-cluster", "services", "setup", "demo", "test", "faults"):
        lines = (REPO / "scripts" / name).read_text().splitlines()
        sourced = next(i for i, line in enumerate(lines) if line.startswith("source "))
        assert lines[sourced + 1] == "close_inherited_fds", name     # before the script runs anything
