"""The sweep-and-review demo's parts without the cluster: the sweep's runs, the reference
checker, the launch (against the fake scheduler) and real review agents in real sandboxes
talking to the scripted stand-in model through the metering proxy.

The model is scripted: the agreement here checks the plumbing, not a model's quality.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest


from dashboards.models import ModelEndpoint
from schedulers.hosts import master_address

REPO = Path(__file__).resolve().parents[2]
KEY = "sk-tco-review-unit-9e2"
REFERENCE = ["ok", "ok", "bad", "ok", "bad", "bad", "ok", "bad"]
REASONS = ["ok", "ok", "diverged", "ok", "crashed", "diverged", "ok", "no_summary"]


@pytest.mark.django_db
def test_the_review_campaign_is_chained_and_sandboxed(bootstrap, django_user_model, state_outside_tmp):
    from dashboards.management.commands.tco_bootstrap import demo_ceiling
    from dashboards.models import ModelEndpoint, PolicyCeiling, Team
    from dashboards.launch.submit import campaign_job_spec
    from demo.sweep import review_policy, sweep_review_launch, sweep_submit
    from execution.sandbox.policy.load import load_policy
    from schedulers.fake import FakeScheduler
    from schedulers.gridengine.native_spec import native_specification

    fake = FakeScheduler()
    team = Team.objects.get(project="research")
    admin = django_user_model.objects.get(username="admin")
    # tco's state dir outside the host's /tmp (other tasks' scratch space, never bindable); its
    # sweeps/ folder is where the demo ceiling lets review agents read.
    bootstrap.STATE_DIR = state_outside_tmp
    PolicyCeiling.objects.filter(team=team).update(policy=demo_ceiling(project=team.project))
    runs = state_outside_tmp / "sweeps" / team.project / "runs"
    sweep_job, _ = sweep_submit(team=team, count=8, out_dir=runs, name="s", scheduler=fake)
    (_, sweep_spec), = fake.submissions
    assert (sweep_spec.queue, sweep_spec.resources, sweep_spec.args[:2]) == ("classic.q", {}, ["-m", "demo.demo_sweep"])

    campaign = sweep_review_launch(user=admin, team=team, sweep_job=sweep_job, runs_dir=runs, count=8,
                                   endpoint="demo-stand-in")
    job = campaign_job_spec(campaign)
    assert job.hold_jid_ad == sweep_job and job.queue == "agent.q"
    assert f"-hold_jid_ad {sweep_job}" in native_specification(job, queues=["agent.q", "classic.q"],
                                                               projects=["research"], resources=["anthropic_api"])
    spec = json.loads((Path(bootstrap.TCO_SPOOL_DIR) / "campaigns" / str(campaign.pk) / "spec.json").read_text())
    port = bootstrap.TCO_DEMO_MODEL_PORT
    # Registered where the runners reach the master: 127.0.0.1 on a single host, else its bridge address.
    host = ModelEndpoint.objects.get(name="demo-stand-in").host
    assert host in ("127.0.0.1", master_address(bootstrap.SGE_ROOT, bootstrap.SGE_CELL))
    assert spec["model_endpoint"] == {"base_url": f"http://{host}:{port}", "credential_name": "demo-stand-in"}
    assert spec["model_endpoints"] == [{"name": "demo-stand-in", "provider": "anthropic", "scheme": "http",
                                        "host": host, "port": port, "path_prefixes": ["/v1/"],
                                        "credential_name": "demo-stand-in"}]
    assert spec["agent"]["outputs"] == ["verdict.json", "transcript.jsonl"]
    policy = load_policy(spec["policy"])
    assert policy.refusals() == [] and str(runs) in policy.read_only
    assert policy.proxy_policy()["network_policies"]["model_api"]["endpoints"][0]["port"] == port
    endpoint = ModelEndpoint.objects.get(name="demo-stand-in")
    assert spec["policy"] == review_policy(runs_dir=runs, endpoint=endpoint).strip()


@pytest.mark.django_db
def test_a_teams_review_agents_may_not_read_another_teams_sweeps(bootstrap, django_user_model, state_outside_tmp):
    """Review F3: both demo teams' ceilings listed all of <state>/sweeps, so research's review
    campaign could read engineering's sweep runs. Each ceiling now lists the team's own."""
    from dashboards.core.errors import LaunchError
    from dashboards.models import PolicyCeiling, Team
    from demo.sweep import sweep_review_launch, sweep_submit
    from execution.sandbox.policy.load import load_policy
    from schedulers.fake import FakeScheduler

    bootstrap.STATE_DIR = state_outside_tmp
    PolicyCeiling.objects.all().delete()
    call_command_quiet("tco_bootstrap")  # the demo ceilings, for this state directory
    research, engineering = Team.objects.get(project="research"), Team.objects.get(project="engineering")
    admin = django_user_model.objects.get(username="admin")
    theirs = state_outside_tmp / "sweeps" / "engineering" / "runs"
    ours = state_outside_tmp / "sweeps" / "research" / "runs"
    for path in (theirs, ours):
        path.mkdir(parents=True)
    for team, own in ((research, ours), (engineering, theirs)):
        ceiling = load_policy(PolicyCeiling.objects.get(team=team).policy)
        assert str(own.parent) in ceiling.read_only
        assert str(state_outside_tmp / "sweeps") not in ceiling.read_only
    job, _ = sweep_submit(team=research, count=2, out_dir=ours, name="s", scheduler=FakeScheduler())
    with pytest.raises(LaunchError, match=r"read_only: .*/sweeps/engineering/runs is outside the ceiling"):
        sweep_review_launch(user=admin, team=research, sweep_job=job, runs_dir=theirs, count=2,
                            endpoint="demo-stand-in")
    campaign = sweep_review_launch(user=admin, team=research, sweep_job=job, runs_dir=ours, count=2,
                                   endpoint="demo-stand-in")
    assert str(ours) in load_policy(campaign.policy).read_only


@pytest.mark.django_db
def test_bootstrap_moves_earlier_shared_demo_ceilings_to_the_teams_own_and_keeps_edited_ones(bootstrap):
    from dashboards.management.commands.tco_bootstrap import demo_ceiling, demo_model_host
    from dashboards.models import PolicyCeiling, Team

    shared = str(Path(bootstrap.STATE_DIR) / "sweeps")
    research, engineering = Team.objects.get(project="research"), Team.objects.get(project="engineering")
    own = str(Path(bootstrap.STATE_DIR) / "sweeps" / "research")
    earlier = demo_ceiling("127.0.0.1", project="research").replace(own, shared)  # an install before F3's fix
    PolicyCeiling.objects.filter(team=research).update(policy=earlier)
    edited = demo_ceiling(project="engineering").replace("/usr, ", "/usr, /srv/data, ")  # an admin's edit
    PolicyCeiling.objects.filter(team=engineering).update(policy=edited)
    call_command_quiet("tco_bootstrap")
    assert PolicyCeiling.objects.get(team=research).policy == demo_ceiling(demo_model_host(), project="research")
    assert PolicyCeiling.objects.get(team=engineering).policy == edited


@pytest.mark.django_db
def test_a_sites_bootstrap_makes_no_demo_teams_agent_endpoint_or_ceilings(db, tmp_path, settings):
    from dashboards.models import AgentDefinition, Cluster, ModelEndpoint, PolicyCeiling, Team
    from django.contrib.auth import get_user_model

    settings.STATE_DIR = tmp_path
    os.environ["TCO_ADMIN_PASSWORD"] = "test-admin-pw-1"
    call_command_quiet("tco_bootstrap", "--no-demo")
    assert Cluster.objects.count() == 1 and get_user_model().objects.filter(username="admin").exists()
    assert (Team.objects.count(), AgentDefinition.objects.count(), ModelEndpoint.objects.count(),
            PolicyCeiling.objects.count()) == (0, 0, 0, 0)


@pytest.mark.django_db
def test_bootstrap_moves_the_untouched_demo_endpoint_off_the_old_unprivileged_port(bootstrap):
    """docs/security.md F4: an install made with the stand-in on 8793 (bindable by any account once the
    stand-in stopped) gets the privileged port on the next bootstrap; an admin's own entries stay."""
    from django.core.management import call_command

    from dashboards.management.commands.tco_bootstrap import OLD_DEMO_MODEL_PORT, demo_ceiling
    from dashboards.models import PolicyCeiling

    endpoint = ModelEndpoint.objects.get(name="demo-stand-in")
    host = endpoint.host
    ModelEndpoint.objects.filter(pk=endpoint.pk).update(port=OLD_DEMO_MODEL_PORT)
    old = demo_ceiling(host, OLD_DEMO_MODEL_PORT, project="research")
    assert f"port: {OLD_DEMO_MODEL_PORT}" in old
    PolicyCeiling.objects.filter(team__project="research").update(policy=old)
    PolicyCeiling.objects.filter(team__project="engineering").update(policy=old + "# edited by an admin\n")
    call_command("tco_bootstrap", stdout=open(os.devnull, "w"))
    assert ModelEndpoint.objects.get(name="demo-stand-in").port == bootstrap.TCO_DEMO_MODEL_PORT < 1024
    assert PolicyCeiling.objects.get(team__project="research").policy == demo_ceiling(host, project="research")
    assert PolicyCeiling.objects.get(team__project="engineering").policy.endswith("# edited by an admin\n")


@pytest.fixture
def state_outside_tmp():
    (REPO / "var").mkdir(exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix="test-state-", dir=REPO / "var"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def call_command_quiet(*args):
    from django.core.management import call_command
    call_command(*args, stdout=open(os.devnull, "w"))
