"""The one launch service (dashboards.launch): ceilings, registered endpoints, the runner spec,
hostile inputs, and the demo command going through the same checks (issues 10 and 11)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command

from dashboards.core import enqueue
from dashboards.launch import spool
from dashboards.launch import submit
from dashboards.launch.service import LaunchRequest, launch
from dashboards.models import AgentDefinition, AuditEntry, Campaign, ModelEndpoint, PolicyCeiling, Team
from dashboards.core.errors import LaunchError

pytestmark = pytest.mark.django_db


def spec_of(campaign: Campaign) -> dict:
    return json.loads((spool.spool_dir() / "campaigns" / str(campaign.pk) / "spec.json").read_text())


def request(team, agent, **fields) -> LaunchRequest:
    fields.setdefault("inputs", [{"task": 1}])
    fields.setdefault("name", "svc")
    return LaunchRequest(team=team, agent_definition=agent, **fields)


def endpoint_policy(*, host="127.0.0.1", port, provider="anthropic", extra_read_only: str = "") -> str:
    from django.conf import settings
    import os

    python = os.path.realpath(settings.TCO_RUNNER_PYTHON)
    ro = "[/usr" + (f", {extra_read_only}" if extra_read_only else "") + "]"
    return ("version: 1\n"
            f"filesystem_policy: {{include_workdir: true, read_only: {ro}, read_write: [/sandbox]}}\n"
            "network_policies:\n  model_api:\n    endpoints:\n"
            f"      - {{host: {host}, port: {port}, protocol: rest, enforcement: enforce,\n"
            f"         credential_binding: {{provider: {provider}}}, rules: [{{allow: {{method: POST, path: /v1/messages}}}}]}}\n"
            f"    binaries: [{{path: {python}}}]\n")


# --------------------------------------------------------------------------- issue 11, finding 2

def test_the_reported_credential_theft_is_refused_audited_and_nothing_is_submitted(ops_users, research, agent, sent,
                                                                                 bootstrap):
    """A launcher's policy lists tco's secret files and an endpoint of their own bound to the
    site's provider: refused with the reasons, audited, no campaign, nothing queued."""
    state = Path(bootstrap.STATE_DIR)
    attack = endpoint_policy(port=9999, extra_read_only=f"{state}/secret_key, {state}/admin-password")
    with pytest.raises(LaunchError) as caught:
        launch(user=ops_users["launcher"], request=request(research, agent, policy=attack))
    message = str(caught.value)
    assert "wider than allowed" in message
    assert f"{state}/secret_key is outside the ceiling's paths" in message
    assert "127.0.0.1 (rest)" in message or "port 9999" in message
    assert not Campaign.objects.exists() and sent == []
    entry = AuditEntry.objects.get(action="launch")
    assert not entry.ok and entry.user == ops_users["launcher"] and "wider than allowed" in entry.result


def test_a_credential_only_goes_to_a_registered_endpoint(ops_users, research, agent, sent):
    """Even under a ceiling that allows the endpoint, a credential binding to an endpoint nobody
    registered is refused; a registered one is written into the spec (model_endpoints)."""
    policy = endpoint_policy(port=9998)
    PolicyCeiling.objects.filter(team=research).update(policy=policy)
    with pytest.raises(LaunchError, match="not a registered model endpoint"):
        launch(user=ops_users["launcher"], request=request(research, agent, policy=policy))
    assert not Campaign.objects.exists()

    ModelEndpoint.objects.create(name="site-model", provider="openai", scheme="http", host="127.0.0.1", port=9998,
                                 path_prefixes=["/v1/"], credential_name="site-key")
    with pytest.raises(LaunchError, match="binds provider 'anthropic'; the registered endpoint site-model is 'openai'"):
        launch(user=ops_users["launcher"], request=request(research, agent, policy=policy))

    ModelEndpoint.objects.filter(name="site-model").update(provider="anthropic")
    campaign = launch(user=ops_users["launcher"], request=request(research, agent, policy=policy,
                                                                  model_endpoint="site-model")).campaign
    spec = spec_of(campaign)
    assert spec["model_endpoints"] == [{"name": "site-model", "provider": "anthropic", "scheme": "http",
                                        "host": "127.0.0.1", "port": 9998, "path_prefixes": ["/v1/"],
                                        "credential_name": "site-key"}]
    assert spec["model_endpoint"] == {"base_url": "http://127.0.0.1:9998", "credential_name": "site-key"}
    assert sent == [(enqueue.SUBMIT_CAMPAIGN, (campaign.pk,))] or sent == []  # after commit (test transaction)


def test_a_chosen_endpoint_must_be_one_the_policy_reaches(ops_users, research, agent):
    with pytest.raises(LaunchError, match="model endpoint 'demo-stand-in' is not a registered endpoint the sandbox"):
        launch(user=ops_users["launcher"], request=request(research, agent, model_endpoint="demo-stand-in"))


def test_the_agent_definitions_ceiling_applies_as_well_as_the_teams(ops_users, research, agent):
    PolicyCeiling.objects.create(agent_definition=agent, policy="version: 1\nfilesystem_policy: "
                                                                 "{include_workdir: true, read_only: [/usr/lib, /usr/bin]}\n")
    with pytest.raises(LaunchError, match=r"/usr is outside the ceiling's paths \(ceiling: agent demo-agent v1\)"):
        launch(user=ops_users["launcher"], request=request(
            research, agent, policy="version: 1\nfilesystem_policy: {read_only: [/usr]}\n"))
    ok = launch(user=ops_users["launcher"], request=request(
        research, agent, policy="version: 1\nfilesystem_policy: {read_only: [/usr/bin, /usr/lib/x]}\n")).campaign
    assert ok.policy.startswith("version: 1")


def test_without_any_ceiling_the_runners_default_policy_is_the_limit(ops_users, research, agent):
    PolicyCeiling.objects.all().delete()
    assert launch(user=ops_users["launcher"], request=request(research, agent)).campaign.policy == ""
    with pytest.raises(LaunchError, match="default policy"):
        launch(user=ops_users["launcher"], request=request(
            research, agent, policy="version: 1\nfilesystem_policy: {read_only: [/home]}\n"))


# --------------------------------------------------------------------------- every option reaches the spec

def test_outputs_and_advance_reservation_are_launch_options(ops_users, research, agent):
    campaign = launch(user=ops_users["launcher"], request=request(
        research, agent, outputs=["verdict.json", "logs/*.txt"], advance_reservation=17)).campaign
    assert spec_of(campaign)["agent"]["outputs"] == ["verdict.json", "logs/*.txt"]
    assert campaign.advance_reservation == 17
    assert submit.campaign_job_spec(campaign).advance_reservation == 17
    for bad in (["../x"], ["/etc/passwd"], ["a\nb"], [""], ["x"] * 33):
        with pytest.raises(LaunchError, match="outputs"):
            launch(user=ops_users["launcher"], request=request(research, agent, outputs=bad))


# --------------------------------------------------------------------------- issue 11, finding 8: never a 500

DEEP = 100_000


def test_inputs_nested_100000_deep_are_refused_with_a_message():
    from dashboards.launch.inputs import inputs_from_jsonl, inputs_from_params

    with pytest.raises(LaunchError, match="JSONL line 1 nests deeper than 64 levels"):
        inputs_from_jsonl('{"a": ' + "[" * DEEP + "]" * DEEP + "}")
    with pytest.raises(LaunchError, match="nests deeper than 64 levels"):
        inputs_from_jsonl('{"a": ' + "[" * 200 + "]" * 200 + "}")  # parses, but deeper than the limit
    with pytest.raises(LaunchError, match="parameter line 1: x nests deeper"):
        inputs_from_params("x=" + "[" * DEEP + "]" * DEEP)
    assert inputs_from_params("x=[[1]] y=[") == [{"x": [[1]], "y": "["}]


@pytest.mark.parametrize("field, value, message", [
    ("policy", "? [a, b]\n: 1", "must be text"),
    ("policy", "a: " + "[" * 30_000, "nesting depth"),
    ("policy", "[" * DEEP, "larger than 64 KB"),
    ("input_params", "x=" + "[" * DEEP + "]" * DEEP, "nests deeper"),
    ("input_jsonl", "{\"a\": " + "[" * DEEP + "]" * DEEP + "}", "nests deeper"),
])
def test_the_launch_page_answers_hostile_nesting_with_the_form(client, ops_users, field, value, message):
    data = {"agent_definition": AgentDefinition.objects.get(name="demo-agent").pk,
            "team": Team.objects.get(project="research").pk, "queue": "agent.q", "seats_per_task": "1",
            "name": "deep", "input_kind": "jsonl" if field == "input_jsonl" else "params",
            "input_params": "task=1", "priority": "0", "model": "", "policy": "", "concurrency_cap": "",
            "predecessor_job": "", "token_cap": "", "cost_cap_usd": "", "input_jsonl": "", "input_directory": "",
            field: value, "launch": "1"}
    client.force_login(ops_users["launcher"])
    response = client.post("/ops/launch/", data)
    assert response.status_code == 200 and message in response.content.decode()
    assert not Campaign.objects.exists()


# --------------------------------------------------------------------------- the demo command

def test_the_demo_command_launches_as_a_user_through_the_same_checks(ops_users, research):
    with pytest.raises(CommandError, match="you may not launch campaigns for team research"):
        call_command("tco_demo_campaign", "--count", "3", "--user", "viewer", stdout=open("/dev/null", "w"))
    assert not Campaign.objects.exists()
    refused = AuditEntry.objects.get(action="launch")
    assert refused.user == ops_users["viewer"] and not refused.ok

    call_command("tco_demo_campaign", "--count", "3", "--user", "launcher", "--name", "demo-l",
                 stdout=open("/dev/null", "w"))
    campaign = Campaign.objects.get()
    assert campaign.launched_by == ops_users["launcher"] and campaign.task_count == 3
    entry = AuditEntry.objects.get(action="launch", ok=True)
    assert entry.user == ops_users["launcher"] and entry.target == f"campaign:{campaign.pk}"


# --------------------------------------------------------------------------- what admins register

def test_admins_register_endpoints_and_ceilings_that_the_contract_and_the_runner_accept(bootstrap, client):
    from django.core.exceptions import ValidationError

    bad = ModelEndpoint(name="x y", provider="anthropic", scheme="https", host="api.example.com", port=70000,
                        path_prefixes=[], credential_name="k")
    with pytest.raises(ValidationError) as caught:
        bad.full_clean()
    assert {"name", "port", "path_prefixes"} <= set(caught.value.message_dict)
    ModelEndpoint(name="ok", provider="anthropic", scheme="https", host="api.example.com", port=443,
                  path_prefixes=["/v1/"], credential_name="k").full_clean()
    with pytest.raises(ValidationError, match="unknown field"):
        PolicyCeiling(team=Team.objects.get(project="research"), policy="version: 1\nshell: yes\n").clean()
    admin_user = get_user_model().objects.get(username="admin")
    client.force_login(admin_user)
    for url in ("/admin/dashboards/modelendpoint/", "/admin/dashboards/policyceiling/",
                "/admin/dashboards/controlrequest/"):
        assert client.get(url).status_code == 200, url


@pytest.mark.parametrize("path", ["/proc/1/root", "SPOOL", "STATE/secret_key"])
def test_a_policy_the_runner_would_refuse_at_run_time_is_refused_at_launch(ops_users, research, agent, bootstrap,
                                                                         sent, path):
    """issue 11, finding 8: such policies were submitted and then ended with exit 78."""
    path = path.replace("SPOOL", str(bootstrap.TCO_SPOOL_DIR)).replace("STATE", str(bootstrap.STATE_DIR))
    with pytest.raises(LaunchError, match="outside the ceiling's paths"):
        launch(user=ops_users["launcher"], request=request(
            research, agent, policy=f"version: 1\nfilesystem_policy: {{read_only: [{path}]}}\n"))
    assert not Campaign.objects.exists() and sent == []


def test_a_policy_hiding_the_relays_interpreter_is_refused_at_launch(ops_users, research, agent, bootstrap, sent):
    """Launch accepted a policy without /usr; the runner then refused it at run time because the
    relay's interpreter (TCO_RUNNER_PYTHON, resolved) was not visible inside the sandbox."""
    import os

    interpreter = os.path.realpath(bootstrap.TCO_RUNNER_PYTHON)
    with pytest.raises(LaunchError) as caught:
        launch(user=ops_users["launcher"], request=request(
            research, agent, policy="version: 1\nfilesystem_policy: {include_workdir: true, read_only: [/etc]}\n"))
    assert f"the relay runs {interpreter} inside the sandbox: list its directory" in str(caught.value)
    assert not Campaign.objects.exists() and sent == []


def test_review_a_policy_listing_tcos_secret_folder_is_refused_at_launch(settings):
    """Review of a fresh clone: `read_only: [/etc/tco]` was accepted at launch (the passwords and
    the database URL live there). It is one of tco's secret paths now, refused like the state dir."""
    from dashboards.launch import policy as launch_policy
    from dashboards.launch.spool import sandbox_state_paths
    from execution.sandbox.policy.load import load_policy

    settings.TCO_SECRET_PATHS = ["/etc/tco"]
    assert "/etc/tco" in sandbox_state_paths()
    policy = load_policy("version: 1\nfilesystem_policy:\n  include_workdir: true\n"
                         "  read_only: [/usr, /lib, /lib64, /bin, /etc/tco]\n  read_write: [/sandbox, /tmp]\n"
                         "process: {run_as_user: sandbox, run_as_group: sandbox}\n")
    problems = launch_policy.sandbox_bind_problems(policy)
    assert any("/etc/tco" in p for p in problems), problems


def test_review_the_request_limit_lets_the_form_refuse_big_inputs_itself(settings):
    """Review: a 3 MB JSONL got Django's bare 400 (DATA_UPLOAD_MAX_MEMORY_SIZE 2.5 MB), not the
    form's message; the request limit must stay above what the form accepts and checks itself."""
    from django.conf import settings as live

    from dashboards.core import limits

    assert live.DATA_UPLOAD_MAX_MEMORY_SIZE > limits.INPUT_MAX_BYTES + limits.POLICY_MAX_BYTES
