"""The sweep-and-review demo's parts without the cluster: the sweep's runs, the reference
checker, the launch (against the fake scheduler) and real review agents in real sandboxes
talking to the scripted stand-in model through the metering proxy.

The model is scripted: the agreement here checks the plumbing, not a model's quality.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest


from demo.reference_checker import agreement
from demo.demo_model import spawn

REPO = Path(__file__).resolve().parents[3]
KEY = "sk-tco-review-unit-9e2"
REFERENCE = ["ok", "ok", "bad", "ok", "bad", "bad", "ok", "bad"]
REASONS = ["ok", "ok", "diverged", "ok", "crashed", "diverged", "ok", "no_summary"]


def test_review_agents_give_their_verdicts_through_the_proxy(runs, stand_in, tmp_path):
    spool = tmp_path / "spool"
    campaign = spool / "campaigns" / "rv"
    campaign.mkdir(parents=True)
    (spool / "credentials.json").write_text(json.dumps({"demo-stand-in": KEY}))
    (campaign / "inputs.jsonl").write_text("".join(
        json.dumps({"sweep_task": n, "run_output": str(runs / f"run-{n}.txt")}) + "\n" for n in range(1, 9)))
    spec = {"version": 1, "campaign_id": "rv", "inputs_file": "inputs.jsonl", "timeout_s": 60,
            "model": "claude-review-test", "policy": review_policy_text(runs, stand_in),
            "model_endpoint": {"base_url": stand_in, "credential_name": "demo-stand-in"},
            "agent": {"command": [os.path.realpath(sys.executable), "-m", "demo.review_agent", "{input}",
                                  "{workdir}"], "outputs": ["verdict.json", "transcript.jsonl"]}}
    (campaign / "spec.json").write_text(json.dumps(spec))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TCO_", "SGE_", "JOB_"))}
    env.update(TCO_SPOOL_DIR=str(spool), TCO_CAMPAIGN_ID="rv", JOB_ID="31", PYTHONPATH=str(REPO),
               PYTHONDONTWRITEBYTECODE="1")
    verdicts = []
    for n in range(1, 9):
        result = subprocess.run([sys.executable, "-m", "execution.runner"], env={**env, "SGE_TASK_ID": str(n)},
                                capture_output=True, text=True, timeout=120, start_new_session=True)
        record = json.loads((spool / "records" / "rv" / f"{n}.json").read_text())
        assert result.returncode == 0, (n, result.stderr, record["error"], record["sandbox"])
        assert record["usage"]["forwarded"] == 1 and record["usage"]["refused"] == 0
        outputs = {o["name"]: Path(o["path"]) for o in record["outputs"]}
        verdict = json.loads(outputs["verdict.json"].read_text())
        assert verdict["model"] == "claude-review-test" and verdict["tool_calls"] == 1
        events = [json.loads(line) for line in outputs["transcript.jsonl"].read_text().splitlines()]
        assert [e["type"] for e in events] == ["tool_call", "model_call"]
        verdicts.append(verdict["verdict"])
    # The scripted model flags only runs whose log says diverged or crashed; run 8 aborted silently.
    assert verdicts == ["ok", "ok", "bad", "ok", "bad", "bad", "ok", "ok"]
    result = agreement(zip(verdicts, REFERENCE))
    assert (result["agreed"], result["total"]) == (7, 8)


@pytest.fixture(scope="module")
def stand_in(tmp_path_factory):
    root = tmp_path_factory.mktemp("model")
    (root / "key").write_text(KEY + "\n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = spawn(port=port, api_key_file=str(root / "key"), script="review", cwd=str(REPO))
    yield f"http://127.0.0.1:{port}"
    proc.terminate()
    proc.wait(10)


def review_policy_text(runs: Path, model_url: str) -> str:
    from urllib.parse import urlsplit

    port = urlsplit(model_url).port
    python = os.path.realpath(sys.executable)
    return f"""version: 1
filesystem_policy:
  include_workdir: true
  read_only: [/usr, /lib, /lib64, /bin, /etc, {REPO / 'demo'}, {runs}]
  read_write: [/sandbox, /tmp]
process: {{run_as_user: sandbox, run_as_group: sandbox}}
network_policies:
  model_api:
    endpoints:
      - {{host: 127.0.0.1, port: {port}, protocol: rest, enforcement: enforce,
         credential_binding: {{provider: anthropic}}, rules: [{{allow: {{method: POST, path: /v1/messages}}}}]}}
    binaries: [{{path: {python}}}]
"""


def test_a_research_demo_agent_asks_the_model_through_the_proxy(stand_in, tmp_path):
    """make demo's research campaign (tco_demo_campaign --model --endpoint): each demo agent asks the
    stand-in once, in its sandbox with the campaign's policy (demo.campaign.demo_agent_policy), through
    the relay and the metering proxy, which adds the key and meters the tokens into the runner record.
    Before, the demo agent called no model: research's lead read $0.00."""
    from urllib.parse import urlsplit

    from django.conf import settings

    from dashboards.models import ModelEndpoint
    from demo.campaign import demo_agent_policy
    from demo.demo_model import count_tokens

    port = urlsplit(stand_in).port
    endpoint = ModelEndpoint(name="demo-stand-in", provider="anthropic", scheme="http", host="127.0.0.1", port=port,
                             credential_name="demo-stand-in")
    spool = tmp_path / "spool"
    campaign = spool / "campaigns" / "dm"
    campaign.mkdir(parents=True)
    (spool / "credentials.json").write_text(json.dumps({"demo-stand-in": KEY}))
    (campaign / "inputs.jsonl").write_text(json.dumps({"task": 7, "duration_s": 0, "model": "stand-in-review"}) + "\n")
    spec = {"version": 1, "campaign_id": "dm", "inputs_file": "inputs.jsonl", "timeout_s": 60,
            "model": "stand-in-review", "policy": demo_agent_policy(endpoint=endpoint),
            "model_endpoint": {"base_url": stand_in, "credential_name": "demo-stand-in"},
            "agent": {"command": [settings.TCO_RUNNER_PYTHON, "-m", "demo.demo_agent", "{input}", "{workdir}"],
                      "outputs": ["result.json"]}}
    (campaign / "spec.json").write_text(json.dumps(spec))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TCO_", "SGE_", "JOB_"))}
    env.update(TCO_SPOOL_DIR=str(spool), TCO_CAMPAIGN_ID="dm", JOB_ID="32", SGE_TASK_ID="1", PYTHONPATH=str(REPO),
               PYTHONDONTWRITEBYTECODE="1")
    result = subprocess.run([sys.executable, "-m", "execution.runner"], env=env, capture_output=True, text=True,
                            timeout=120, start_new_session=True)
    record = json.loads((spool / "records" / "dm" / "1.json").read_text())
    assert result.returncode == 0, (result.stderr, record["error"], record["sandbox"])
    assert record["exit_status"] == 0
    assert record["usage"]["forwarded"] == 1 and record["usage"]["refused"] == 0
    answer = json.loads(Path(next(o["path"] for o in record["outputs"] if o["name"] == "result.json")).read_text())
    call = answer["model_call"]
    # The review script answers "verdict: ok" to a request that mentions no diverged or crashed run.
    assert (call["text"], call["model"], answer["ok"]) == ("verdict: ok", "stand-in-review", True)
    # The proxy's count (the runner record) is the model's answer's, and the stand-in's tokenizer's
    # (ceil(UTF-8 bytes / 4)) of the reply.
    assert record["usage"]["output_tokens"] == call["usage"]["output_tokens"] == count_tokens(call["text"]) > 0
    assert record["usage"]["input_tokens"] == call["usage"]["input_tokens"] > 0
