"""Review finding (2026-12-03): `scripts/services stop`, run by root (`make stop`, `make demo`), signalled
whatever pid the services' pid files named, and those files are the submit account's own writing. A
compromised tco account could write root's sshd's (or the qmaster's) pid there, or "-1": root's
`kill -9 -1` then ends every process of the machine.

Now a pid file's content is a pid only when it is a positive decimal number, and root signals it as the
submit account, which can signal only its own processes. Here the attack's pid files name a process of
root's: it survives `stop`, and the script says nothing was stopped.
"""
from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def _stop(state: Path, *names: str) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "TCO_STATE_DIR": str(state), "TCO_USER": "tco"}
    return subprocess.run([str(REPO / "scripts/services"), "stop", *names], capture_output=True, text=True,
                          timeout=60, env=env)


def test_a_pid_file_naming_roots_process_does_not_make_root_kill_it(tmp_path):
    state = tmp_path / "state"
    (state / "run").mkdir(parents=True)
    victim = subprocess.Popen(["sleep", "300"])  # root's
    try:
        (state / "run" / "web.pid").write_text(f"{victim.pid}\n")
        done = _stop(state, "web")
        assert done.returncode == 0, done.stderr
        time.sleep(0.3)
        assert victim.poll() is None, "root's process was killed through a pid file"
        assert "stopped web" not in done.stdout
        assert not (state / "run" / "web.pid").exists()
    finally:
        victim.kill()
        victim.wait()


def test_a_pid_file_that_is_not_a_pid_signals_nothing(tmp_path):
    script = (REPO / "scripts/services").read_text()
    # Run only where the pid check exists: on the old script "-1" made root kill -9 every process.
    assert "pid_of()" in script and "[1-9][0-9]{0,9}" in script
    state = tmp_path / "state"
    (state / "run").mkdir(parents=True)
    canary = subprocess.Popen(["runuser", "-u", "tco", "--", "sleep", "300"])
    try:
        for content in ("-1", "0", "-9 1", "1 2", "$(id)", "", "99999999999"):
            (state / "run" / "live.pid").write_text(content)
            done = _stop(state, "live")
            assert done.returncode == 0 and "stopped live" not in done.stdout, (content, done)
        assert canary.poll() is None and os.path.exists(f"/proc/{canary.pid}")
    finally:
        canary.kill()
        canary.wait()
