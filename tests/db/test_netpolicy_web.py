"""Changing a running campaign's network policy from the web side (issue 17, item 4): who may,
within which limits (the admins' ceiling, registered endpoints), the spool file the runners read,
the audit trail and the control page's confirmed form."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from dashboards.core import enqueue
from dashboards.control import netpolicy
from dashboards.launch import spool
from dashboards.core.errors import ActionRefused
from dashboards.launch.service import LaunchRequest, launch
from dashboards.models import AuditEntry, Campaign, ModelEndpoint, PolicyCeiling
from dashboards.core.errors import LaunchError
from execution.spool.network import NetworkPolicyFile

pytestmark = pytest.mark.django_db


def python() -> str:
    import os

    from django.conf import settings

    return os.path.realpath(settings.TCO_RUNNER_PYTHON)


def network(*paths: str, port: int = 9998, host: str = "127.0.0.1", provider: str | None = "anthropic") -> dict:
    endpoint = {"host": host, "port": port, "protocol": "rest", "enforcement": "enforce",
                "rules": [{"allow": {"method": "POST", "path": p}} for p in paths]}
    if provider:
        endpoint["credential_binding"] = {"provider": provider}
    return {"model_api": {"endpoints": [endpoint], "binaries": [{"path": python()}]}}


def policy(net: dict) -> str:
    return yaml.safe_dump({"version": 1, "filesystem_policy": {"include_workdir": True, "read_only": ["/usr"],
                                                               "read_write": ["/sandbox"]},
                           "network_policies": net}, sort_keys=False)


def change_text(net: dict) -> str:
    return yaml.safe_dump({"network_policies": net})


CEILING_NET = {"model_api": {"endpoints": [
    network("/v1/**")["model_api"]["endpoints"][0],
    network("/v1/**", port=9997)["model_api"]["endpoints"][0]],  # allowed by the ceiling, never registered
    "binaries": [{"path": None}]}}


@pytest.fixture
def running(ops_users, research, agent, monkeypatch):
    """A campaign of research launched by its launcher under a ceiling allowing /v1/** on two
    endpoints (one registered), its policy allowing two paths on the registered one."""
    monkeypatch.setattr(enqueue, "send", lambda *a, **k: None)
    CEILING_NET["model_api"]["binaries"] = [{"path": python()}]
    PolicyCeiling.objects.filter(team=research).update(policy=policy(CEILING_NET))
    ModelEndpoint.objects.create(name="site-model", provider="anthropic", scheme="http", host="127.0.0.1",
                                 port=9998, path_prefixes=["/v1/"], credential_name="site-key")
    campaign = launch(user=ops_users["launcher"], request=LaunchRequest(
        team=research, agent_definition=agent, inputs=[{"task": 1}], name="netpol",
        policy=policy(network("/v1/messages", "/v1/messages/count_tokens")))).campaign
    Campaign.objects.filter(pk=campaign.pk).update(status="submitted", job_number=777)
    campaign.refresh_from_db()
    return campaign


def written(campaign) -> NetworkPolicyFile:
    return NetworkPolicyFile.read(spool.spool_layout().network_policy_path(campaign.pk))


def test_the_spec_carries_the_ceilings_network_part_for_the_runner(running):
    spec = json.loads(Path(spool.spool_layout().spec_path(running.pk)).read_text())
    [ceiling] = spec["network_ceilings"]
    assert ceiling["label"] == "team research" and ceiling["network_policies"] == CEILING_NET


def test_a_launcher_narrows_then_widens_within_the_ceiling_with_rising_versions(running, ops_users):
    assert netpolicy.network_policy_in_force(running).version == 0
    narrowed = netpolicy.network_policy_change(user=ops_users["launcher"], campaign=running,
                                               text=change_text(network("/v1/messages")))
    assert (narrowed.policy_version, written(running).network_policies) == (1, network("/v1/messages"))
    assert written(running).changed_by == "launcher"
    widened = netpolicy.network_policy_change(user=ops_users["admin"], campaign=running,
                                              text=change_text(network("/v1/messages", "/v1/models/claude")))
    assert widened.policy_version == 2
    in_force = netpolicy.network_policy_in_force(running)
    assert (in_force.version, in_force.changed_by, in_force.network_policies) == \
        (2, "admin", network("/v1/messages", "/v1/models/claude"))
    entries = list(AuditEntry.objects.filter(action="network_policy").order_by("id"))
    assert [(e.user.username, e.ok, e.params["policy_version"], e.target) for e in entries] == \
        [("launcher", True, 1, f"campaign:{running.pk}"), ("admin", True, 2, f"campaign:{running.pk}")]


@pytest.mark.parametrize("net, message", [
    (network("/v2/anything"), "rule POST /v2/anything is not allowed by the ceiling"),
    (network("/v1/messages", host="exfil.example.net"), "exfil.example.net"),
    (network("/v1/messages", provider=None) | {"extra": {"endpoints": [
        {"host": "10.0.0.1", "port": 80, "protocol": "rest", "access": "full"}], "binaries": [{"path": "/x"}]}},
     "10.0.0.1"),
    (network("/v1/messages", port=9997), "not a registered model endpoint"),
])
def test_a_launcher_cannot_widen_beyond_the_ceiling_or_bind_an_unregistered_endpoint(running, ops_users, net,
                                                                                    message):
    with pytest.raises(LaunchError, match=message.replace(".", r"\.")):
        netpolicy.network_policy_change(user=ops_users["launcher"], campaign=running, text=change_text(net))
    assert not Path(spool.spool_layout().network_policy_path(running.pk)).exists()
    entry = AuditEntry.objects.get(action="network_policy")
    assert (entry.user, entry.ok, entry.params["status"]) == (ops_users["launcher"], False, "refused")
    assert message in entry.result


@pytest.mark.parametrize("who", ["other", "viewer", "lead", "nobody"])
def test_no_one_without_control_of_the_team_touches_its_campaign(running, ops_users, who):
    with pytest.raises(ActionRefused, match="team research"):
        netpolicy.network_policy_change(user=ops_users[who], campaign=running, text=change_text(network("/v1/x")))
    assert not Path(spool.spool_layout().network_policy_path(running.pk)).exists()
    entry = AuditEntry.objects.get(action="network_policy")
    assert (entry.user, entry.ok) == (ops_users[who], False)


@pytest.mark.parametrize("text, message", [
    ("network_policies: [1, 2]", "mapping of named rules"),
    ("filesystem_policy: {read_write: [/]}\nnetwork_policies: {}", "the one key network_policies"),
    ("network_policies: {m: {endpoints: [{host: 127.0.0.1, port: x}]}}", "port"),
    ("network_policies: {a: 1\n", "not valid YAML"),
])
def test_a_malformed_network_policy_is_refused_with_its_reason(running, ops_users, text, message):
    with pytest.raises(LaunchError, match=message):
        netpolicy.network_policy_change(user=ops_users["launcher"], campaign=running, text=text)
    assert not AuditEntry.objects.get(action="network_policy").ok


def test_an_ended_campaigns_network_policy_no_longer_changes(running, ops_users):
    Campaign.objects.filter(pk=running.pk).update(status="finished")
    running.refresh_from_db()
    with pytest.raises(LaunchError, match="is finished"):
        netpolicy.network_policy_change(user=ops_users["launcher"], campaign=running,
                                        text=change_text(network("/v1/messages")))


def test_a_new_campaign_never_inherits_a_leftover_change(running, ops_users):
    netpolicy.network_policy_change(user=ops_users["launcher"], campaign=running,
                                    text=change_text(network("/v1/messages")))
    spool.campaign_spool_write(running, ['{"task": 1}'])  # the same id launched again (a reused id)
    assert netpolicy.network_policy_in_force(running).version == 0


def test_the_control_page_form_asks_for_confirmation_then_changes(running, ops_users, client):
    client.force_login(ops_users["launcher"])
    page = client.get(f"/ops/campaigns/{running.pk}/").content.decode()
    assert 'id="network-policy-form"' in page and "Version 0" in page
    url = f"/ops/campaigns/{running.pk}/network-policy"
    text = change_text(network("/v1/messages"))
    confirm = client.post(url, {"network_policy": text})
    assert confirm.status_code == 200 and 'id="confirm"' in confirm.content.decode()
    assert not Path(spool.spool_layout().network_policy_path(running.pk)).exists()
    done = client.post(url, {"network_policy": text, "confirm": "on"})
    assert done.status_code == 302 and written(running).policy_version == 1
    page = client.get(f"/ops/campaigns/{running.pk}/").content.decode()
    assert "Version 1, changed" in page and "by launcher" in page
    refused = client.post(url, {"network_policy": change_text(network("/v2/x")), "confirm": "on"}, follow=True)
    assert "not allowed by the ceiling" in refused.content.decode() and written(running).policy_version == 1


def test_the_page_refuses_other_teams_and_viewers_get_no_form(running, ops_users, client):
    url = f"/ops/campaigns/{running.pk}/network-policy"
    client.force_login(ops_users["other"])
    assert client.post(url, {"network_policy": "network_policies: {}", "confirm": "on"}).status_code == 404
    client.force_login(ops_users["viewer"])
    page = client.get(f"/ops/campaigns/{running.pk}/")
    assert page.status_code == 200 and 'id="network-policy-form"' not in page.content.decode()
    assert 'id="network-policy-yaml"' in page.content.decode()
    assert client.post(url, {"network_policy": "network_policies: {}"}).status_code == 403
    assert client.post(url, {"network_policy": "network_policies: {}", "confirm": "on"}).status_code == 403
    assert not Path(spool.spool_layout().network_policy_path(running.pk)).exists()
    assert AuditEntry.objects.filter(action="network_policy", ok=False).count() == 2


def test_the_agent_page_shows_the_policy_in_force_with_its_version_and_time(running, ops_users, client):
    from tests.support.history import make_task

    task = make_task(running, started_at=None, state="running", job_number=777)
    netpolicy.network_policy_change(user=ops_users["launcher"], campaign=running,
                                    text=change_text(network("/v1/messages")))
    changed_at = written(running).changed_at  # e.g. 2026-12-01T14:30:05.123456Z
    client.force_login(ops_users["viewer"])
    page = client.get(f"/tasks/{task.pk}/").content.decode()
    assert f"Version 1, changed {changed_at[:10]} {changed_at[11:19]} UTC by launcher" in page
    import re

    shown = re.search(r'<pre class="log" id="network-policy-yaml">(.*?)</pre>', page, re.S).group(1)
    assert "/v1/messages/count_tokens" not in shown and "path: /v1/messages" in shown
    assert 'id="network-policy-form"' not in page


# --- a live campaign's egress narrowed or cut (issue 23, finding 5) ----------------------------------


@pytest.mark.parametrize("status", ["running", "paused", "waiting"])
def test_an_admin_cuts_a_live_campaigns_egress_to_nothing(running, ops_users, status):
    """The finding: a running, paused or waiting campaign's network policy could not change at all, so an
    admin could not cut a live agent's egress, the feature's main use."""
    Campaign.objects.filter(pk=running.pk).update(status=status)
    running.refresh_from_db()
    narrowed = netpolicy.network_policy_change(user=ops_users["admin"], campaign=running,
                                               text=change_text(network("/v1/messages")))
    assert narrowed.policy_version == 1 and written(running).network_policies == network("/v1/messages")
    cut = netpolicy.network_policy_change(user=ops_users["admin"], campaign=running, text="network_policies: {}")
    assert cut.policy_version == 2 and written(running).network_policies == {}
    entries = AuditEntry.objects.filter(action="network_policy", ok=True).order_by("id")
    assert [e.params["policy_version"] for e in entries] == [1, 2]


@pytest.mark.parametrize("status", ["running", "paused", "waiting"])
def test_a_live_campaign_is_never_widened(running, ops_users, status):
    """Widening stays where it was allowed (a campaign not yet started: submitting, submitted): once it runs,
    a change may only take away, even within the ceiling and by an admin."""
    Campaign.objects.filter(pk=running.pk).update(status=status)
    running.refresh_from_db()
    netpolicy.network_policy_change(user=ops_users["launcher"], campaign=running,
                                    text=change_text(network("/v1/messages")))  # a launcher may narrow too
    for user in (ops_users["launcher"], ops_users["admin"]):
        with pytest.raises(LaunchError, match=r"only be narrowed.*/v1/messages/count_tokens"):
            netpolicy.network_policy_change(user=user, campaign=running, text=change_text(
                network("/v1/messages", "/v1/messages/count_tokens")))
    assert written(running).policy_version == 1 and written(running).network_policies == network("/v1/messages")
    refused = AuditEntry.objects.filter(action="network_policy", ok=False)
    assert refused.count() == 2 and all("only be narrowed" in e.result for e in refused)


def test_the_control_page_offers_a_live_campaign_the_narrowing_form(running, ops_users, client):
    Campaign.objects.filter(pk=running.pk).update(status="running")
    client.force_login(ops_users["admin"])
    page = client.get(f"/ops/campaigns/{running.pk}/").content.decode()
    assert 'id="network-policy-form"' in page and "narrow" in page.split('id="network-policy-form"', 1)[1]
    url = f"/ops/campaigns/{running.pk}/network-policy"
    done = client.post(url, {"network_policy": "network_policies: {}", "confirm": "on"})
    assert done.status_code == 302 and written(running).network_policies == {}


def test_an_unreadable_policy_in_force_lets_a_live_campaign_only_be_cut(running, ops_users):
    """The runners may have applied a narrower version than the launch policy: with the file unreadable, the
    policy in force is not known, so only a cut to nothing is taken as narrowing."""
    netpolicy.network_policy_change(user=ops_users["admin"], campaign=running, text=change_text(network("/v1/messages")))
    Campaign.objects.filter(pk=running.pk).update(status="running")
    running.refresh_from_db()
    Path(spool.spool_layout().network_policy_path(running.pk)).write_text('{"policy_version": 1, "network_policies": 5}')
    with pytest.raises(LaunchError, match="only be narrowed"):
        netpolicy.network_policy_change(user=ops_users["admin"], campaign=running,
                                        text=change_text(network("/v1/messages")))
    cut = netpolicy.network_policy_change(user=ops_users["admin"], campaign=running, text="network_policies: {}")
    assert cut.policy_version == 2 and written(running).network_policies == {}
