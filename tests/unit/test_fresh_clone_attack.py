"""The fresh-clone attack's findings (session 3): each test reproduces the attack and fails
without its fix."""
from __future__ import annotations

import pytest

from dashboards import enqueue, launch as launching
from dashboards.models import AgentDefinition, AuditEntry, Campaign, Team
from dashboards.services import LaunchError
from tests.ops.fixtures import ops_users  # noqa: F401
from tests.unit.test_launching import agent, research  # noqa: F401  (fixtures)
from tests.unit.test_ops_views import as_user, launch_data  # noqa: F401  (fixture, form data)

pytestmark = pytest.mark.django_db


@pytest.fixture
def sent(monkeypatch):
    calls = []
    monkeypatch.setattr(enqueue, "send", lambda name, *args, **kw: calls.append((name, args)))
    return calls


# --------------------------------------------------------------------------- 1: zero model API seats

def test_a_campaign_asking_for_no_model_api_seat_is_refused_and_nothing_is_submitted(ops_users, research, agent,
                                                                                      sent, settings):
    """The attack: "model API seats per task" 0 gave a job with no hard resource request, so its
    agents called the model outside the seat limit. Every path (form, urgent page, service,
    retry) goes through the launch check, which refuses it with a message naming the consumable."""
    settings.TCO_SEAT_RESOURCE = "anthropic_api"
    with pytest.raises(LaunchError, match=r"at least 1 .*anthropic_api"):
        launching.launch(user=ops_users["launcher"], request=launching.LaunchRequest(
            team=research, agent_definition=agent, inputs=[{"task": 1}], name="seatless", seats_per_task=0))
    with pytest.raises(LaunchError, match="at least 1"):
        launching.urgent_launch(user=ops_users["urgent"], team=research, agent_definition=agent, input={"task": 1},
                                seats_per_task=0)
    assert not Campaign.objects.exists() and sent == []
    refusals = AuditEntry.objects.filter(ok=False, action__in=("launch", "urgent_launch"))
    assert refusals.count() == 2 and all("at least 1" in e.result for e in refusals)


def test_the_launch_and_urgent_pages_refuse_zero_seats(as_user, sent, settings):
    settings.TCO_SEAT_RESOURCE = "anthropic_api"
    html = as_user("launcher").post("/ops/launch/", {**launch_data(seats_per_task="0"), "launch": "1"}).content.decode()
    assert "at least 1" in html
    urgent = {"agent_definition": AgentDefinition.objects.get(name="demo-agent").pk,
              "team": Team.objects.get(project="research").pk, "queue": "agent.q", "seats_per_task": "0",
              "model": "", "name": "", "input": '{"task": 1}'}
    response = as_user("urgent").post("/ops/urgent/", urgent)
    assert response.status_code == 200 and "at least 1" in response.content.decode()
    assert not Campaign.objects.exists() and sent == []


def test_without_a_seat_consumable_zero_seats_is_still_a_launch(ops_users, research, agent, sent, settings,
                                                                django_capture_on_commit_callbacks):
    """A site that meters no seats (TCO_SEAT_RESOURCE blank) has nothing to bypass."""
    settings.TCO_SEAT_RESOURCE = ""
    with django_capture_on_commit_callbacks(execute=True):
        campaign = launching.launch(user=ops_users["launcher"], request=launching.LaunchRequest(
            team=research, agent_definition=agent, inputs=[{"task": 1}], name="unmetered", seats_per_task=0)).campaign
    assert campaign.seats_per_task == 0 and len(sent) == 1
