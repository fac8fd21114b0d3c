"""A running campaign's network policy narrowed, then widened, from the web side while its agent
runs under Grid Engine in the real bubblewrap sandbox (issue 17, item 4).

The campaign is launched and submitted through tco's services (DRMAA, the dev
cluster); the agent (tests/host/sandbox/test_runner_live_network.py's) asks a plain HTTP
server this test starts on loopback, through the metering proxy, and waits for
the test's go-ahead files in its work directory. The changes go through
``dashboards.control.netpolicy`` (checks, audit, the spool file); a launcher of another
team is refused on the way.
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml
from django.conf import settings

from dashboards.control import netpolicy
from dashboards.launch import spool
from dashboards.core.errors import ActionRefused
from dashboards.launch.service import LaunchRequest, launch
from dashboards.models import AgentDefinition, AuditEntry, ModelEndpoint, PolicyCeiling, Team
from dashboards.team_models import Role
from dashboards.core.roles import membership_set
from dashboards.launch.submit import campaign_submit
from schedulers.hosts import master_address
from tests.support.runner import AGENT, Upstream

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

BOTH = ["/v1/messages", "/v1/chat/completions"]


def wait_for(predicate, what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    pytest.fail(f"{what}: not reached in {timeout} s")


def test_a_narrowing_then_a_widening_reach_a_running_campaign_under_grid_engine(bootstrap, django_user_model,
                                                                                 monkeypatch):
    # The test talks to the running agent through its work directory on the spool: the runners' spool
    # mode (TCO_SANDBOX_WORKDIR=spool; under the default tmpfs the spool has the files only at the end).
    monkeypatch.setattr(settings, "TCO_SANDBOX_LIMITS",
                        {**getattr(settings, "TCO_SANDBOX_LIMITS", {}), "TCO_SANDBOX_WORKDIR": "spool"})
    # Where the runners on the execution hosts reach the master (127.0.0.1 on a single-host cluster).
    host = master_address(settings.SGE_ROOT, settings.SGE_CELL)
    server = ThreadingHTTPServer((host, 0), Upstream)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    python = os.path.realpath(settings.TCO_RUNNER_PYTHON)

    def network(paths: list[str]) -> dict:
        return {"m": {"endpoints": [{"host": host, "port": port, "protocol": "rest", "enforcement": "enforce",
                                     "rules": [{"allow": {"method": "POST", "path": p}} for p in paths]}],
                      "binaries": [{"path": python}]}}

    def policy(net: dict) -> str:
        return yaml.safe_dump({"version": 1, "filesystem_policy": {
            "include_workdir": True, "read_only": ["/usr", "/lib", "/lib64", "/bin", "/etc", sys.prefix],
            "read_write": ["/sandbox", "/tmp"]}, "process": {"run_as_user": "sandbox", "run_as_group": "sandbox"},
            "network_policies": net}, sort_keys=False)

    team = Team.objects.get(project="research")
    # An unregistered host that is not loopback is reached over https (a real model API); this
    # plain-http upstream on the master's bridge address is registered as http (no credential).
    ModelEndpoint.objects.create(name="netpol-upstream", provider="netpol", scheme="http", host=host, port=port,
                                 path_prefixes=["/v1/"], credential_name="netpol")
    PolicyCeiling.objects.filter(team=team).update(policy=policy(network(["/v1/**"])))
    agent = AgentDefinition.objects.create(name="netpol-agent", version=1, command=[python, "-c", AGENT],
                                           timeout_s=300)
    launcher = django_user_model.objects.create_user("netpol-launcher", password=None)
    membership_set(user=launcher, team=team, role=Role.LAUNCHER)
    stranger = django_user_model.objects.create_user("netpol-other", password=None)
    membership_set(user=stranger, team=Team.objects.get(project="engineering"), role=Role.LAUNCHER)
    campaign = launch(user=launcher, request=LaunchRequest(team=team, agent_definition=agent, inputs=[{"task": 1}],
                                                           name="itest-netpol", policy=policy(network(BOTH)))).campaign
    campaign = campaign_submit(campaign_id=campaign.pk)
    assert campaign.status == "submitted", campaign.submit_error
    layout = spool.spool_layout()
    work = Path(layout.work_dir(campaign.pk, 1))
    record_path = Path(layout.record_path(campaign.pk, 1))
    try:
        wait_for(lambda: (work / "asked1").exists() or record_path.exists(), "the agent's first requests")
        with pytest.raises(ActionRefused):
            netpolicy.network_policy_change(user=stranger, campaign=campaign,
                                            text=yaml.safe_dump({"network_policies": network(["/v1/**"])}))
        changed = netpolicy.network_policy_change(user=launcher, campaign=campaign, text=yaml.safe_dump(
            {"network_policies": network(["/v1/messages"])}))
        assert changed.policy_version == 1
        (work / "go1").touch()
        wait_for(lambda: (work / "asked2").exists() or record_path.exists(), "the agent's requests after narrowing")
        changed = netpolicy.network_policy_change(user=launcher, campaign=campaign,
                                                  text=yaml.safe_dump({"network_policies": network(BOTH)}))
        assert changed.policy_version == 2
        (work / "go2").touch()
        wait_for(record_path.exists, "the runner record")
    finally:
        server.shutdown()
        server.server_close()
    record = json.loads(record_path.read_text())
    assert record["exit_status"] == 0, record
    assert json.loads(Path(record["stdout_path"]).read_text()) == [200, 200, 403, 200, 200, 200]
    assert [(c["version"], c["applied"]) for c in record["sandbox"]["network_policy"]["changes"]] == \
        [(1, True), (2, True)]
    requests = [json.loads(line) for line in Path(record["requests_path"]).read_text().splitlines()]
    assert (1, "not_in_policy") in [(r["policy_version"], r["refused"]) for r in requests]
    entries = AuditEntry.objects.filter(action="network_policy", target=f"campaign:{campaign.pk}").order_by("id")
    assert [(e.user.username, e.ok) for e in entries] == [("netpol-other", False), ("netpol-launcher", True),
                                                           ("netpol-launcher", True)]
