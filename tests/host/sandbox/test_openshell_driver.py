"""The OpenShell runtime, against a STAND-IN ``openshell`` that records its arguments.

OpenShell cannot run on tco's dev machine, so these tests check only what tco
hands to OpenShell's documented CLI (tests/fixtures/openshell-standin/openshell),
not OpenShell's behaviour.
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

from execution.runner import config
from execution.spool.contract import STAGES

REPO = Path(__file__).resolve().parents[3]
STANDIN = REPO / "tests" / "fixtures" / "openshell-standin"
SECRET = "sk-never-on-a-command-line-42"
POLICY = """\
version: 1
filesystem_policy:
  include_workdir: true
  read_only: [/usr, /lib, /etc]
  read_write: [/sandbox, /tmp]
process: {run_as_user: sandbox, run_as_group: sandbox}
network_policies:
  model_api:
    endpoints:
      - host: api.anthropic.com
        port: 443
        protocol: rest
        enforcement: enforce
        credential_binding: {provider: anthropic}
        rules: [{allow: {method: POST, path: /v1/messages}}]
    binaries: [{path: /usr/bin/python3}]
"""


class Task:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.spool = root / "spool"
        self.standin = root / "standin"
        self.standin.mkdir()
        campaign = self.spool / "campaigns" / "os1"
        campaign.mkdir(parents=True)
        (campaign / "inputs.jsonl").write_text('{"task": 1}\n')
        self.creds = root / "credentials.json"
        self.creds.write_text(json.dumps({"anthropic-prod": SECRET}))
        self.spec = {"version": 1, "campaign_id": "os1", "inputs_file": "inputs.jsonl", "timeout_s": 60,
                     "kill_grace_s": 1,
                     "agent": {"command": ["python3", "-m", "my_agent", "{input}", "{workdir}"],
                               "outputs": ["result.json"], "environment": {"AGENT_MODE": "review"}},
                     "policy": POLICY,
                     "model_endpoint": {"base_url": "https://api.anthropic.com", "credential_name": "anthropic-prod"}}

    def behave(self, **behaviour) -> None:
        (self.standin / "behaviour.json").write_text(json.dumps(behaviour))

    def start(self, *, runtime: str | None = "openshell", path_first: bool = True) -> subprocess.Popen:
        (self.spool / "campaigns" / "os1" / "spec.json").write_text(json.dumps(self.spec))
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TCO_", "SGE_", "JOB_", "OPENSHELL_"))}
        env.update(TCO_SPOOL_DIR=str(self.spool), TCO_CAMPAIGN_ID="os1", JOB_ID="900", SGE_TASK_ID="1",
                   TCO_CREDENTIALS_FILE=str(self.creds), OPENSHELL_STANDIN_DIR=str(self.standin),
                   PYTHONPATH=str(REPO), PYTHONDONTWRITEBYTECODE="1",
                   PATH=f"{STANDIN}:{env.get('PATH', '/usr/bin:/bin')}" if path_first else env.get("PATH", ""))
        if runtime:
            env["TCO_SANDBOX_RUNTIME"] = runtime
        return subprocess.Popen([sys.executable, "-m", "execution.runner"], env=env, cwd=str(self.root),
                                start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def run(self, **kw) -> subprocess.CompletedProcess:
        proc = self.start(**kw)
        out, err = proc.communicate(timeout=60)
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    def calls(self) -> list[dict]:
        path = self.standin / "calls.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def record(self) -> dict:
        return json.loads((self.spool / "records" / "os1" / "1.json").read_text())


@pytest.fixture
def task(tmp_path) -> Task:
    return Task(tmp_path)


def verbs(calls: list[dict]) -> list[str]:
    return [" ".join(c["argv"][:2]) for c in calls]


def test_the_policy_goes_to_openshell_through_its_documented_commands(task):
    result = task.run()
    assert result.returncode == 0, result.stderr
    calls = task.calls()
    assert verbs(calls) == ["sandbox create", "sandbox upload", "sandbox exec", "sandbox download", "sandbox delete"]
    create = calls[0]["argv"]
    name = create[create.index("--name") + 1]
    assert name == "tco-os1-1-900"
    assert calls[0]["policy"] == POLICY  # the same file, byte for byte
    for flag in ("--detach", "--no-tty", "--no-auto-providers"):
        assert flag in create
    assert create[create.index("--provider") + 1] == "anthropic"  # bound by name; the gateway holds the key
    assert calls[1]["argv"][2:] == [name, str(task.spool / "work" / "os1" / "1" / "input.json"), "/sandbox"]
    run = calls[2]["argv"]
    assert run[run.index("--name") + 1] == name and run[run.index("--workdir") + 1] == "/sandbox"
    assert run[run.index("--") + 1:] == ["python3", "-m", "my_agent", "/sandbox/input.json", "/sandbox"]
    envs = [run[i + 1] for i, a in enumerate(run) if a == "--env"]
    assert "AGENT_MODE=review" in envs and "HOME=/sandbox" in envs
    assert "ANTHROPIC_BASE_URL=https://api.anthropic.com" in envs
    assert calls[3]["argv"][2:] == [name, "/sandbox", str(task.spool / "work" / "os1" / "1")]
    assert calls[4]["argv"][2:] == [name]


def test_the_record_has_every_stage_and_the_agents_output(task):
    assert task.run().returncode == 0
    record = task.record()
    assert record["sandbox"]["runtime"] == "openshell" and record["sandbox"]["notes"] == []
    assert record["flags"] == ["unmetered_runtime"]
    values = [record["stages"][s] for s in STAGES]
    assert all(values) and values == sorted(values)
    assert Path(record["stdout_path"]).read_text().startswith("stand-in exec: ")
    assert Path(record["stderr_path"]).read_text() == "stand-in exec stderr\n"
    (output,) = record["outputs"]
    assert json.loads(Path(output["path"]).read_text())["ran"][-2:] == ["/sandbox/input.json", "/sandbox"]


def test_no_credential_is_handed_to_the_cli(task):
    task.run()
    raw = (task.standin / "calls.jsonl").read_text()
    assert SECRET not in raw
    for call in task.calls():
        assert "TCO_CREDENTIALS_FILE" not in call["env_keys"] and "TCO_SPOOL_DIR" not in call["env_keys"]
        assert not any(k.startswith("ANTHROPIC") for k in call["env_keys"])


def test_the_agents_exit_status_passes_through(task):
    task.behave(exec_exit=3)
    assert task.run().returncode == 3
    assert task.record()["exit_status"] == 3
    assert verbs(task.calls())[-1] == "sandbox delete"


def test_a_refused_create_is_a_runner_error_and_is_still_deleted(task):
    task.behave(create_exit=1)
    assert task.run().returncode == config.EXIT_CONFIG
    record = task.record()
    assert record["flags"] == ["unmetered_runtime", "runner_error"]
    assert "openshell sandbox create failed (exit 1): stand-in: create refused" in record["error"]
    assert verbs(task.calls()) == ["sandbox create", "sandbox delete"]


def test_a_signalled_runner_stops_the_agent_and_deletes_the_sandbox(task):
    task.behave(exec_sleep_s=30)
    proc = task.start()
    deadline = time.monotonic() + 20
    while "sandbox exec" not in verbs(task.calls()) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGTERM
    record = task.record()
    assert record["runner_signal"] == signal.SIGTERM and record["stages"]["agent_exited_at"] is None
    assert verbs(task.calls())[-1] == "sandbox delete"


def test_auto_picks_openshell_when_installed_and_bubblewrap_for_loopback(task):
    assert task.run(runtime=None).returncode == 0
    assert task.record()["sandbox"]["runtime"] == "openshell"
    # The local stand-in model is loopback, which OpenShell refuses: bubblewrap runs it.
    task.spec["policy"] = POLICY.replace("api.anthropic.com", "127.0.0.1").replace("443", "8123")
    task.spec["model_endpoint"] = {"base_url": "http://127.0.0.1:8123"}
    task.spec["agent"]["command"] = ["/bin/true"]
    result = task.run(runtime=None)
    assert task.record()["sandbox"]["runtime"] == "bubblewrap", result.stderr
