"""The runner started as Grid Engine starts it (a subprocess with an environment and a spool), and
what its sandbox talks to: a spool of one campaign, a plain HTTP upstream, the live-network agent."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path

from tests.support.paths import REPO

#: The live-network agent: asks two paths, then waits for the go-ahead files in its work directory.
AGENT = r"""
import http.client, json, os, time
def ask(path):
    c = http.client.HTTPConnection('127.0.0.1', 8790, timeout=30)
    c.request('POST', path, b'{}', {'content-type': 'application/json'})
    r = c.getresponse(); r.read(); return r.status
def until(path, wanted, tries=600):
    for _ in range(tries):
        s = ask(path)
        if (s == 403) == wanted:
            return s
        time.sleep(0.05)
    return s
seen = [ask('/v1/chat/completions'), ask('/v1/messages')]
for phase, refused in ((1, True), (2, False)):
    open(f'/sandbox/asked{phase}', 'w').close()
    while not os.path.exists(f'/sandbox/go{phase}'):
        time.sleep(0.05)
    seen += [until('/v1/chat/completions', refused), ask('/v1/messages')]
print(json.dumps(seen))
"""


class Spool:
    def __init__(self, root: Path, campaign_id: str = "c-1") -> None:
        self.root = root
        self.campaign_id = campaign_id
        self.campaign_dir = root / "campaigns" / campaign_id
        self.campaign_dir.mkdir(parents=True)

    def write(self, inputs: list[dict], *, timeout_s=None, command=None, agent_extra=None, **extra) -> None:
        (self.campaign_dir / "inputs.jsonl").write_text("".join(json.dumps(i) + "\n" for i in inputs))
        spec = {
            "version": 1,
            "campaign_id": self.campaign_id,
            "agent": {"command": command or [sys.executable, "-m", "demo.demo_agent", "{input}", "{workdir}"],
                      **(agent_extra or {})},
            "inputs_file": "inputs.jsonl",
            "timeout_s": timeout_s,
            **extra,
        }
        (self.campaign_dir / "spec.json").write_text(json.dumps(spec))

    def env(self, task: str | int, job_id: str = "4242", extra: dict | None = None) -> dict:
        """The runner's environment for ``task``, with ``extra`` variables (a runner setting) on top."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TCO_", "SGE_", "JOB_"))}
        env.update(TCO_SPOOL_DIR=str(self.root), TCO_CAMPAIGN_ID=self.campaign_id, JOB_ID=job_id,
                   SGE_TASK_ID=str(task), PYTHONPATH=str(REPO), PYTHONDONTWRITEBYTECODE="1")
        env.update(extra or {})
        return env

    def start(self, task, **kw) -> subprocess.Popen:
        # A new session keeps the runner's group kill away from pytest.
        return subprocess.Popen([sys.executable, "-m", "execution.runner"], env=self.env(task, **kw),
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


def wait_for(predicate, timeout=15.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError("condition not reached in time")


class Upstream(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers.get("content-length") or 0))
        body = b'{"ok": true}'
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass
