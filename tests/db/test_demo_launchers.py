"""make demo as its users see it (issue 24): each team's demo campaigns are launched by that team's
launcher through the launch service (launcher finds them under "mine"; the admin, who launched none,
sees all of them), research's demo agents ask the stand-in model through the metering proxy (a policy
that allows that endpoint only), and a second make demo launches no duplicate of a campaign still live."""
from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
from django.core.management import call_command

from dashboards.core import enqueue
from dashboards.core.accounts import DEMO_USERS
from dashboards.models import AuditEntry, Campaign, ModelEndpoint
from dashboards.team_models import Role
from execution.sandbox.policy.load import load_policy
from schedulers.fake import FakeScheduler

REPO = Path(__file__).resolve().parents[2]
DEMO_ARGS = ("tco_demo_campaign", "--count", "4", "--team", "research", "--user", "launcher", "--name", "demo",
             "--model", "stand-in-review", "--endpoint", "demo-stand-in", "--once")


@pytest.fixture
def submit_inline(monkeypatch):
    """The submit worker, in this process, against a fake scheduler."""
    from dashboards.launch.submit import campaign_submit

    fake = FakeScheduler()

    def send(name, *args, queue=None):
        if name == enqueue.SUBMIT_CAMPAIGN:
            campaign_submit(campaign_id=args[0], scheduler=fake)

    monkeypatch.setattr(enqueue, "send", send)
    return fake


def demo_launches() -> list[dict[str, str]]:
    """scripts/demo's launching commands (tco_demo_campaign, tco_sweep_review): their options as a dict."""
    text = (REPO / "scripts" / "demo").read_text().replace("\\\n", " ")
    launches = []
    for line in text.splitlines():
        if line.lstrip().startswith("#") or "manage.py tco_" not in line:
            continue
        words = shlex.split(line, comments=True)
        for command in ("tco_demo_campaign", "tco_sweep_review"):
            if command in words:
                rest = words[words.index(command) + 1:]
                options = {w: (rest[i + 1] if i + 1 < len(rest) and not rest[i + 1].startswith("--") else "")
                           for i, w in enumerate(rest) if w.startswith("--")}
                launches.append({"command": command, "line": line, **options})
    return launches


def test_make_demo_launches_every_campaign_as_its_teams_launcher():
    launches = demo_launches()
    assert [(l["command"], l.get("--team")) for l in launches] == [
        ("tco_demo_campaign", "research"), ("tco_sweep_review", "engineering"), ("tco_demo_campaign", "research")]
    for launch in launches:
        # Without --user the commands launch as admin: a launcher found "mine" empty.
        assert DEMO_USERS[launch["--user"]] == (launch["--team"], Role.LAUNCHER), launch
        # A second make demo: --once (nothing while the first one's is live) or --replace (the paused one).
        assert "--once" in launch or "--replace" in launch, launch
    # The sweep is submitted in the command's own process through DRMAA: libdrmaa loads only with jemalloc
    # preloaded (a make demo stopped with "cannot allocate memory in static TLS block" without it).
    assert "LD_PRELOAD=" in launches[1]["line"], launches[1]["line"]
    # Research's demo campaign asks the priced stand-in model, through its registered endpoint.
    assert (launches[0]["--model"], launches[0]["--endpoint"]) == ("stand-in-review", "demo-stand-in")


@pytest.mark.django_db(transaction=True)
def test_the_demo_campaign_is_the_launchers_and_asks_the_model_through_the_proxy(role_users, submit_inline,
                                                                                capsys, bootstrap):
    from dashboards.web.landing import my_campaigns

    call_command(*DEMO_ARGS)
    campaign = Campaign.objects.get(name="demo")
    launcher = role_users["launcher"]
    assert campaign.launched_by == launcher and campaign.team.project == "research"
    entry = AuditEntry.objects.get(action="launch")
    assert entry.user == launcher and entry.ok
    # "mine" for the launcher; the admin, who launched nothing, sees every team's by default.
    assert [r["name"] for r in my_campaigns(launcher)["rows"]] == ["demo"]
    admin_view = my_campaigns(role_users["admin"])
    assert admin_view["scope"] == "all" and [r["name"] for r in admin_view["rows"]] == ["demo"]
    # The runner's spec: the model, the stand-in's endpoint for the proxy, a policy allowing it alone.
    endpoint = ModelEndpoint.objects.get(name="demo-stand-in")
    spec = json.loads((Path(bootstrap.TCO_SPOOL_DIR) / "campaigns" / str(campaign.pk) / "spec.json").read_text())
    assert campaign.model == spec["model"] == "stand-in-review"
    assert spec["model_endpoint"] == {"base_url": f"http://{endpoint.host}:{endpoint.port}",
                                      "credential_name": "demo-stand-in"}
    rules = load_policy(spec["policy"]).proxy_policy()["network_policies"]
    assert [(e["host"], e["port"]) for rule in rules.values() for e in rule["endpoints"]] == \
        [(endpoint.host, endpoint.port)]
    inputs = (Path(bootstrap.TCO_SPOOL_DIR) / "campaigns" / str(campaign.pk) / "inputs.jsonl").read_text().splitlines()
    assert [json.loads(line)["model"] for line in inputs] == ["stand-in-review"] * 4


@pytest.mark.django_db(transaction=True)
def test_a_second_make_demo_launches_no_second_demo_while_the_first_is_live(role_users, submit_inline, capsys):
    call_command(*DEMO_ARGS)
    first = Campaign.objects.get(name="demo")
    assert first.status == "submitted"
    call_command(*DEMO_ARGS)
    assert Campaign.objects.filter(name="demo").count() == 1
    assert re.search(rf"campaign {first.pk} \(demo\) that launcher launched earlier is still submitted: no second one",
                     capsys.readouterr().out)
    # Another user's demo of that name does not stop the launcher's, and a finished one is over.
    Campaign.objects.filter(pk=first.pk).update(status="finished")
    call_command(*DEMO_ARGS)
    assert Campaign.objects.filter(name="demo", launched_by=role_users["launcher"]).count() == 2


@pytest.mark.django_db
def test_the_demo_has_a_launcher_on_each_team(role_users):
    from dashboards.core.roles import teams_with

    for username, project in (("launcher", "research"), ("eng-launcher", "engineering")):
        assert [t.project for t in teams_with(role_users[username], "launch")] == [project]
