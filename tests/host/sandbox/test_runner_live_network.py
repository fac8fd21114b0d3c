"""A real runner and bubblewrap sandbox whose network policy is narrowed, then widened, while the agent runs.

The runner is started as Grid Engine starts it (a subprocess with an
environment and a spool, as in test_runner.py); its policy reaches a plain
HTTP server started here on loopback. The test changes the campaign's
``campaigns/<id>/network.json`` between the agent's requests; the agent
waits for the test's go-ahead files in its work directory.
"""
from __future__ import annotations

import json
import threading
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest

from execution.spool.layout import SpoolLayout
from execution.spool.network import NetworkPolicyFile
from tests.support.runner import Spool, wait_for
from tests.support.runner import AGENT, Upstream



@pytest.fixture
def upstream():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Upstream)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def network(port: int, paths: list[str], host: str = "127.0.0.1") -> dict:
    return {"m": {"endpoints": [{"host": host, "port": port, "protocol": "rest",
                                 "rules": [{"allow": {"method": "POST", "path": p}} for p in paths]}],
                  "binaries": [{"path": "/usr/bin/python3.11"}]}}


def policy_yaml(port: int, paths: list[str]) -> str:
    return json.dumps({"version": 1, "filesystem_policy": {"include_workdir": True,
                                                           "read_only": ["/usr", "/lib", "/lib64", "/bin", "/etc"],
                                                           "read_write": ["/sandbox", "/tmp"]},
                       "network_policies": network(port, paths)})


BOTH = ["/v1/messages", "/v1/chat/completions"]


def change(spool: Spool, version: int, policies: dict) -> None:
    NetworkPolicyFile(campaign_id=spool.campaign_id, policy_version=version, changed_at="2026-12-01T14:00:00Z",
                      changed_by="test", network_policies=policies).write(
        SpoolLayout(spool.root).network_policy_path(spool.campaign_id))


def test_a_narrowing_then_a_widening_reach_the_running_agents_proxy(tmp_path, upstream):
    spool = Spool(tmp_path / "spool")
    spool.write([{"task": 1}], command=["/usr/bin/python3", "-c", AGENT], policy=policy_yaml(upstream, BOTH),
                network_ceilings=[{"label": "team t", "network_policies": network(upstream, BOTH)}])
    work = spool.root / "work" / spool.campaign_id / "1"
    # The test talks to the running agent through its work directory on the spool: the spool mode
    # (TCO_SANDBOX_WORKDIR=spool); under the default tmpfs the host sees the files only at the end.
    proc = spool.start(1, extra={"TCO_SANDBOX_WORKDIR": "spool"})
    try:
        wait_for(lambda: (work / "asked1").exists() or proc.poll() is not None, timeout=60)
        change(spool, 1, network(upstream, ["/v1/messages"]))  # narrowing
        (work / "go1").touch()
        wait_for(lambda: (work / "asked2").exists() or proc.poll() is not None, timeout=60)
        change(spool, 2, network(upstream, BOTH))  # widening again
        (work / "go2").touch()
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    record = spool.record(1)
    # Before: both allowed; after the narrowing chat is refused, messages not; after the widening both allowed.
    assert json.loads(Path(record["stdout_path"]).read_text()) == [200, 200, 403, 200, 200, 200]
    netpol = record["sandbox"]["network_policy"]
    assert netpol["version"] == 2
    assert [(c["version"], c["applied"], c["error"]) for c in netpol["changes"]] == [(1, True, None), (2, True, None)]
    requests = [json.loads(line) for line in Path(record["requests_path"]).read_text().splitlines()]
    chat = [(r["policy_version"], r["refused"]) for r in requests if r["path"] == "/v1/chat/completions"]
    assert chat[0] == (0, None) and chat[-1] == (2, None)
    assert (1, "not_in_policy") in chat and all(v != 1 or refused for v, refused in chat)


def test_a_change_wider_than_the_ceiling_or_malformed_is_refused_and_the_rules_stay(tmp_path, upstream):
    spool = Spool(tmp_path / "spool")
    code = ("import http.client\nc = http.client.HTTPConnection('127.0.0.1', 8790, timeout=30)\n"
            "c.request('POST', '/v1/chat/completions', b'{}', {'content-type': 'application/json'})\n"
            "print(c.getresponse().status)")
    # The spec carries no ceilings: the launch policy's network part is the ceiling.
    spool.write([{"task": 1}, {"task": 2}], command=["/usr/bin/python3", "-c", code],
                policy=policy_yaml(upstream, ["/v1/messages"]))
    change(spool, 1, network(upstream, BOTH))  # a widening past the ceiling
    result = spool.run(1)
    assert result.returncode == 0, result.stderr
    record = spool.record(1)
    assert Path(record["stdout_path"]).read_text() == "403\n"
    [noted] = record["sandbox"]["network_policy"]["changes"]
    assert (noted["version"], noted["applied"]) == (1, False)
    assert "rule POST /v1/chat/completions is not allowed by the ceiling" in noted["error"]
    assert record["sandbox"]["network_policy"]["version"] == 0
    # A malformed file: refused too, the launch rules stay.
    path = Path(SpoolLayout(spool.root).network_policy_path(spool.campaign_id))
    path.write_text('{"version": 1, "campaign_id": "c-1", "policy_version": "two"}')
    result = spool.run(2)
    assert result.returncode == 0, result.stderr
    record = spool.record(2)
    assert Path(record["stdout_path"]).read_text() == "403\n"
    [noted] = record["sandbox"]["network_policy"]["changes"]
    assert noted["applied"] is False and "network policy file refused" in noted["error"]
