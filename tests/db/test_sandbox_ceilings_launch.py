"""Sandbox limits per queue and agent with admins' ceilings (issue 23, finding 1; docs/limits.md,
"Per queue and agent"): the launch form shows the ceiling of the chosen queue and agent, a launch
above it is refused with the reason and submits nothing, a blank limit takes the queue's or agent's
default, and a retry is lowered to today's ceiling."""
from __future__ import annotations

import pytest

from dashboards.core.errors import LaunchError
from dashboards.launch import service
from dashboards.launch import spool as launch_spool
from dashboards.models import AgentDefinition, AuditEntry, Campaign, Task
from tests.support.forms import launch_data

pytestmark = pytest.mark.django_db

GIB, MIB = 1 << 30, 1 << 20


@pytest.fixture
def ceilings(settings):
    """Site: 4 GiB memory, 8 GiB disk. classic.q: at most 1 GiB of memory, 256 MiB by default.
    The agent solver: at most 512 MiB of disk."""
    settings.TCO_SANDBOX_LIMITS = {"TCO_SANDBOX_MEMORY_BYTES": str(4 * GIB), "TCO_SANDBOX_WORK_BYTES": str(8 * GIB)}
    settings.TCO_QUEUE_SANDBOX_LIMITS = {"classic.q": {"memory_bytes": {"max": GIB, "default": 256 * MIB}}}
    settings.TCO_AGENT_SANDBOX_LIMITS = {"solver": {"work_bytes": {"max": 512 * MIB}}}
    return settings


@pytest.fixture
def solver(bootstrap):
    demo = AgentDefinition.objects.get(name="demo-agent")
    return AgentDefinition.objects.create(name="solver", version=1, command=demo.command, input_kind="params",
                                          timeout_s=60)


def _launch(user, team, agent, **kwargs):
    """A launch, its after-commit submission run (``sent`` records it)."""
    from django.test import TestCase

    with TestCase.captureOnCommitCallbacks(execute=True):
        return service.launch(user=user, request=service.LaunchRequest(
            team=team, agent_definition=agent, inputs=[{"task": 1}], name="ceiled", **kwargs))


@pytest.mark.parametrize("queue, agent_name, kwargs, message", [
    ("classic.q", "demo-agent", {"memory_bytes": GIB + MIB},
     "memory limit per task: 64 to 1024 MiB for demo-agent on classic.q (the queue classic.q's ceiling), not 1025 MiB"),
    ("agent.q", "solver", {"work_bytes": 513 * MIB},
     "disk limit per task: 1 to 512 MiB for solver on agent.q (the agent solver's ceiling), not 513 MiB"),
    ("classic.q", "solver", {"memory_bytes": 2 * GIB, "work_bytes": 100 * MIB},
     "memory limit per task: 64 to 1024 MiB for solver on classic.q"),
])
def test_a_launch_above_its_queue_or_agent_ceiling_is_refused_and_submits_nothing(
        ops_users, research, solver, ceilings, sent, queue, agent_name, kwargs, message):
    agent = AgentDefinition.objects.get(name=agent_name)
    with pytest.raises(LaunchError) as caught:
        _launch(ops_users["launcher"], research, agent, queue=queue, **kwargs)
    assert str(caught.value).startswith(message)
    assert not Campaign.objects.exists() and sent == []
    # Within the ceiling the same launch is submitted (``sent`` would have seen a submission above).
    _launch(ops_users["launcher"], research, agent, queue=queue, **{k: min(v, 512 * MIB) for k, v in kwargs.items()})
    assert [name for name, _ in sent] == ["worker.tasks.submit_campaign"]
    assert AuditEntry.objects.get(ok=False).result.endswith(str(caught.value))


def test_at_the_ceiling_or_blank_it_runs_with_the_asked_or_the_default_limit(ops_users, research, agent, solver,
                                                                            ceilings, sent):
    launcher = ops_users["launcher"]
    at = _launch(launcher, research, agent, queue="classic.q", memory_bytes=GIB).campaign
    assert launch_spool.campaign_spec(at)["limits"] == {"memory_bytes": GIB}
    blank = _launch(launcher, research, agent, queue="classic.q").campaign
    assert launch_spool.campaign_spec(blank)["limits"] == {"memory_bytes": 256 * MIB}     # classic.q's default
    # The agent's ceiling is its default too (below the site's 8 GiB); agent.q adds nothing.
    assert launch_spool.campaign_spec(_launch(launcher, research, solver, queue="agent.q").campaign)["limits"] == {
        "work_bytes": 512 * MIB}
    # Neither queue nor agent has an entry: the spec names no limit, the runner takes the site's.
    assert "limits" not in launch_spool.campaign_spec(_launch(launcher, research, agent, queue="agent.q").campaign)
    assert len(sent) == 4


def test_a_retry_is_lowered_to_todays_ceiling(ops_users, research, agent, ceilings, sent):
    campaign = _launch(ops_users["launcher"], research, agent, queue="classic.q", memory_bytes=GIB).campaign
    Task.objects.create(cluster=campaign.cluster, campaign=campaign, job_number=4343, task_number=1,
                        name="ceiled", state="failed", active=False)
    ceilings.TCO_QUEUE_SANDBOX_LIMITS = {"classic.q": {"memory_bytes": {"max": 512 * MIB}}}
    retry = service.campaign_retry(user=ops_users["launcher"], campaign=campaign).campaign
    assert launch_spool.campaign_spec(retry)["limits"] == {"memory_bytes": 512 * MIB}


def test_the_form_shows_the_ceiling_and_refuses_a_post_above_it(as_user, solver, ceilings, sent):
    client = as_user("launcher")

    def help_of(html, field):
        return html.split(f'id="field-{field}"', 1)[1].split('<div class="field"', 1)[0]

    # The form's first queue (agent.q) and agent definition (demo-agent): the site's values, and the
    # admins' ceilings listed.
    memory = help_of(client.get("/ops/launch/").content.decode(), "memory_mib")
    assert 'max="4096"' in memory
    assert "64 to 4096 MiB for demo-agent on agent.q (the site&#x27;s maximum); blank: 4096 MiB" in memory
    assert "Ceilings set by admins: queue classic.q 1024 MiB" in memory
    # Posted for classic.q above its ceiling: the field says so, nothing is launched.
    response = client.post("/ops/launch/", {**launch_data(queue="classic.q", memory_mib="2048"), "launch": "1"})
    html = response.content.decode()
    memory = help_of(html, "memory_mib")
    assert response.status_code == 200
    assert "at most 1024 MiB for demo-agent on classic.q (the queue classic.q&#x27;s ceiling)" in memory
    assert "64 to 1024 MiB for demo-agent on classic.q" in memory and "blank: 256 MiB" in memory
    work = help_of(html, "work_mib")
    assert "Ceilings set by admins: agent solver 512 MiB" in work
    assert not Campaign.objects.exists() and sent == []
    response = client.post("/ops/launch/", {**launch_data(agent_definition=str(solver.pk), work_mib="600"),
                                            "launch": "1"})
    assert "at most 512 MiB for solver on agent.q (the agent solver&#x27;s ceiling)" in help_of(
        response.content.decode(), "work_mib")
    assert not Campaign.objects.exists() and sent == []
    # Within the ceiling: launched with what was asked, and submitted.
    from django.test import TestCase

    with TestCase.captureOnCommitCallbacks(execute=True):
        response = client.post("/ops/launch/", {**launch_data(queue="classic.q", memory_mib="1024"), "launch": "1"})
    assert response.status_code == 302 and [name for name, _ in sent] == ["worker.tasks.submit_campaign"]
    assert launch_spool.campaign_spec(Campaign.objects.get())["limits"] == {"memory_bytes": GIB}
