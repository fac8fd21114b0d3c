"""The runner, run as Grid Engine runs it: a subprocess with an environment and a spool.

The agent is the bundled demo agent. Choices checked here (see worker/runner.py):
a runner stopped by a signal writes a record with ``agent_exited_at`` null
(the agent did not end by itself), ``teardown_done_at`` set, ``runner_signal``
set and exit status 128+signal.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from worker import runner

REPO = Path(__file__).resolve().parents[2]
STAGE_ORDER = ["task_started_at", "agent_started_at", "agent_exited_at", "teardown_done_at"]


class Spool:
    def __init__(self, root: Path, campaign_id: str = "c-1") -> None:
        self.root = root
        self.campaign_id = campaign_id
        self.campaign_dir = root / "campaigns" / campaign_id
        self.campaign_dir.mkdir(parents=True)

    def write(self, inputs: list[dict], *, timeout_s=None, command=None, **extra) -> None:
        (self.campaign_dir / "inputs.jsonl").write_text("".join(json.dumps(i) + "\n" for i in inputs))
        spec = {
            "version": 1,
            "campaign_id": self.campaign_id,
            "agent": {"command": command or [sys.executable, "-m", "worker.demo_agent", "{input}", "{workdir}"]},
            "inputs_file": "inputs.jsonl",
            "timeout_s": timeout_s,
            **extra,
        }
        (self.campaign_dir / "spec.json").write_text(json.dumps(spec))

    def env(self, task: str | int, job_id: str = "4242") -> dict:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TCO_", "SGE_", "JOB_"))}
        env.update(TCO_SPOOL_DIR=str(self.root), TCO_CAMPAIGN_ID=self.campaign_id, JOB_ID=job_id,
                   SGE_TASK_ID=str(task), PYTHONPATH=str(REPO), PYTHONDONTWRITEBYTECODE="1")
        return env

    def start(self, task, **kw) -> subprocess.Popen:
        # A new session keeps the runner's group kill away from pytest.
        return subprocess.Popen([sys.executable, "-m", "worker.runner"], env=self.env(task, **kw),
                                cwd=str(self.root), start_new_session=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def run(self, task, timeout=60, **kw) -> subprocess.CompletedProcess:
        proc = self.start(task, **kw)
        out, err = proc.communicate(timeout=timeout)
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    def record_path(self, task) -> Path:
        return self.root / "records" / self.campaign_id / f"{task}.json"

    def record(self, task) -> dict:
        return json.loads(self.record_path(task).read_text())


@pytest.fixture
def spool(tmp_path) -> Spool:
    return Spool(tmp_path / "spool")


def assert_stages_in_order(stages: dict, expected_present: list[str]) -> None:
    for name in ("sandbox_create_at", "sandbox_ready_at"):
        assert stages[name] is None
    present = [name for name in STAGE_ORDER if stages[name] is not None]
    assert present == expected_present
    values = [stages[name] for name in present]
    for value in values:
        assert value.endswith("Z") and len(value) == len("2025-01-02T03:04:05.123456Z")
    assert values == sorted(values)


def live_processes_with(marker: str) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{name}/cmdline").read_bytes()
            state = Path(f"/proc/{name}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if marker.encode() in cmdline and state != b"Z":
            found.append(int(name))
    return found


def wait_for(predicate, timeout=15.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError("condition not reached in time")


# --------------------------------------------------------------------------- normal runs

def test_it_writes_one_record_with_stages_in_order(spool):
    spool.write([{"task": 1, "duration_s": 0.2}, {"task": 2, "duration_s": 0.1}])
    result = spool.run(2)
    assert result.returncode == 0, result.stderr
    record = spool.record(2)
    assert record["version"] == 1
    assert (record["campaign_id"], record["task_number"], record["job_number"]) == ("c-1", 2, 4242)
    assert record["hostname"]
    assert_stages_in_order(record["stages"], STAGE_ORDER)
    assert (record["exit_status"], record["signal"], record["flags"]) == (0, None, [])
    assert record["runner_signal"] is None and record["error"] is None
    assert not spool.record_path(1).exists()
    # Only the record and its two output files; no temp file is left behind.
    assert sorted(p.name for p in spool.record_path(2).parent.iterdir()) == ["2.json", "2.stderr", "2.stdout"]


def test_the_agent_gets_its_input_and_work_dir(spool):
    spool.write([{"task": 7, "duration_s": 0}])
    assert spool.run(1).returncode == 0
    work = spool.root / "work" / "c-1" / "1"
    assert json.loads((work / "input.json").read_text()) == {"task": 7, "duration_s": 0}
    result = json.loads((work / "result.json").read_text())
    assert result["task"] == 7 and result["ok"] is True
    stdout = Path(spool.record(1)["stdout_path"]).read_text()
    assert stdout.startswith("demo agent (stand-in): task 7 answered ")


def test_the_agents_exit_status_is_passed_through(spool):
    spool.write([{"task": 1, "duration_s": 0, "fail": True}])
    result = spool.run(1)
    assert result.returncode == 3
    record = spool.record(1)
    assert record["exit_status"] == 3 and record["signal"] is None
    assert_stages_in_order(record["stages"], STAGE_ORDER)


def test_output_is_captured_and_capped(spool):
    cap = runner.OUTPUT_CAP_BYTES
    spool.write([{"task": 1, "duration_s": 0, "stdout_bytes": cap + 500_000, "stderr_bytes": 10}])
    assert spool.run(1).returncode == 0
    record = spool.record(1)
    assert record["stdout_truncated"] is True and record["stderr_truncated"] is False
    assert os.path.getsize(record["stdout_path"]) == cap
    assert Path(record["stderr_path"]).read_text() == "e" * 10 + "\n"


def test_a_non_array_job_runs_as_task_one(spool):
    spool.write([{"task": 1, "duration_s": 0}])
    assert spool.run("undefined").returncode == 0
    assert spool.record(1)["flags"] == ["task_number_defaulted"]


def test_a_stray_child_is_killed_at_teardown(spool):
    spool.write([{"task": 1, "duration_s": 0, "spawn_child_s": 61.2345}], kill_grace_s=1)
    assert spool.run(1).returncode == 0
    assert spool.record(1)["exit_status"] == 0
    assert live_processes_with("time.sleep(61.2345)") == []


# --------------------------------------------------------------------------- interrupted runs

@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR2, signal.SIGINT, signal.SIGUSR1])
def test_a_signalled_runner_still_writes_a_record(spool, signum):
    spool.write([{"task": 1, "duration_s": 30}])
    proc = spool.start(1)
    wait_for(lambda: (spool.root / "records" / "c-1" / "1.stdout").exists())
    time.sleep(0.1)
    proc.send_signal(signum)
    proc.communicate(timeout=30)
    assert proc.returncode == 128 + signum
    record = spool.record(1)
    assert_stages_in_order(record["stages"], ["task_started_at", "agent_started_at", "teardown_done_at"])
    assert record["stages"]["agent_exited_at"] is None
    assert record["runner_signal"] == signum
    assert record["flags"] == ["runner_signalled"]
    assert (record["exit_status"], record["signal"]) == (None, signal.SIGTERM)  # the runner's SIGTERM


def test_an_agent_that_ignores_sigterm_is_killed_after_the_grace(spool):
    spool.write([{"task": 1, "duration_s": 30, "ignore_sigterm": True, "spawn_child_s": 62.3456}],
                kill_grace_s=0.5)
    proc = spool.start(1)
    wait_for(lambda: live_processes_with("time.sleep(62.3456)"))
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=30)
    assert time.monotonic() - started < 5
    record = spool.record(1)
    assert record["signal"] == signal.SIGKILL and proc.returncode == 128 + signal.SIGTERM
    assert live_processes_with("time.sleep(62.3456)") == []


def test_an_agent_past_its_timeout_is_stopped(spool):
    spool.write([{"task": 1, "duration_s": 30}], timeout_s=0.5)
    result = spool.run(1)
    assert result.returncode == runner.EXIT_TIMEOUT
    record = spool.record(1)
    assert record["flags"] == ["agent_timeout"]
    assert record["stages"]["agent_exited_at"] is None and record["signal"] == signal.SIGTERM


# --------------------------------------------------------------------------- runner errors

def test_a_missing_spec_gives_a_runner_error_record(spool):
    result = spool.run(1)
    assert result.returncode == runner.EXIT_CONFIG
    record = spool.record(1)
    assert record["flags"] == ["runner_error"] and "spec.json" in record["error"]
    assert record["stdout_path"] is None
    assert_stages_in_order(record["stages"], ["task_started_at", "teardown_done_at"])


def test_a_numeric_campaign_id_in_the_spec_matches_its_text_in_the_environment(tmp_path):
    spool = Spool(tmp_path / "spool", campaign_id="17")
    spool.write([{"task": 1, "duration_s": 0}], campaign_id=17)
    assert spool.run(1).returncode == 0
    assert spool.record(1)["campaign_id"] == "17"


def test_a_spec_for_another_campaign_is_refused(spool):
    spool.write([{"task": 1}], campaign_id="other")
    assert spool.run(1).returncode == runner.EXIT_CONFIG
    assert "is for campaign 'other'" in spool.record(1)["error"]


def test_a_missing_input_line_gives_a_runner_error_record(spool):
    spool.write([{"task": 1}])
    assert spool.run(2).returncode == runner.EXIT_CONFIG
    assert "no line 2" in spool.record(2)["error"]


def test_an_agent_that_cannot_start_gives_a_runner_error_record(spool):
    spool.write([{"task": 1}], command=["/nonexistent/agent", "{input}"])
    assert spool.run(1).returncode == runner.EXIT_CONFIG
    assert "cannot start agent" in spool.record(1)["error"]


def test_without_a_spool_it_exits_without_a_record(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TCO_")}
    env.update(PYTHONPATH=str(REPO), PYTHONDONTWRITEBYTECODE="1")
    result = subprocess.run([sys.executable, "-m", "worker.runner"], env=env, capture_output=True,
                            text=True, timeout=30, start_new_session=True)
    assert result.returncode == runner.EXIT_CONFIG
    assert "TCO_SPOOL_DIR" in result.stderr


def test_a_campaign_id_cannot_escape_the_spool(spool):
    spool.write([{"task": 1}])
    env = spool.env(1)
    env["TCO_CAMPAIGN_ID"] = "../../etc"
    result = subprocess.run([sys.executable, "-m", "worker.runner"], env=env, capture_output=True,
                            text=True, timeout=30, start_new_session=True)
    assert result.returncode == runner.EXIT_CONFIG and "TCO_CAMPAIGN_ID" in result.stderr


# --------------------------------------------------------------------------- start-up

def test_the_runner_imports_no_django_and_nothing_outside_the_stdlib():
    code = ("import sys, worker.runner; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('django', 'celery', 'drmaa')))")
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONDONTWRITEBYTECODE="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=30).stdout
    assert out.strip() == "[]"


def test_stage_clock_is_monotonic_utc_with_microseconds():
    clock = runner.StageClock(wall_ns=1_700_000_000_123_456_789, mono_ns=time.monotonic_ns())
    assert clock.anchor_iso() == "2023-11-14T22:13:20.123456Z"
    first, second = clock.iso(), clock.iso()
    assert first <= second and first >= clock.anchor_iso()
