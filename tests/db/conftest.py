"""Fixtures of the database tests (tests/db): the demo team and agent, a client signed in by role,
worker tasks recorded."""
from __future__ import annotations

import pytest

from dashboards.core import enqueue
from dashboards.models import AgentDefinition, Team


@pytest.fixture
def research(bootstrap):
    return Team.objects.get(project="research")


@pytest.fixture
def agent(bootstrap):
    return AgentDefinition.objects.get(name="demo-agent")


@pytest.fixture
def sent(monkeypatch):
    """``enqueue.send`` recorded: a list of ``(task name, args)``."""
    calls = []
    monkeypatch.setattr(enqueue, "send", lambda name, *args, **kw: calls.append((name, args)))
    return calls


@pytest.fixture
def claimed(ops_users, research, agent, sent):
    """Campaign "victim" (2 tasks, launched now) whose submitter died after its claim: a claim two
    hours old, attempt 1, for the reconciler to settle."""
    import datetime as dt

    from django.utils import timezone

    from dashboards.launch import service
    from dashboards.models import Campaign

    campaign = service.launch(user=ops_users["launcher"], request=service.LaunchRequest(
        team=research, agent_definition=agent, inputs=[{"task": n} for n in (1, 2)], name="victim")).campaign
    Campaign.objects.filter(pk=campaign.pk).update(submit_claimed_at=timezone.now() - dt.timedelta(hours=2),
                                                   submit_claimed_by="deadhost:1", submit_attempts=1)
    return Campaign.objects.get(pk=campaign.pk)


@pytest.fixture
def as_user(client, ops_users):
    """``as_user(name)``: the test client signed in as ``ops_users[name]``."""
    def login(name):
        client.force_login(ops_users[name])
        return client
    return login


@pytest.fixture
def live_store_in_memory(settings):
    """The live views' store of this process (``core.live_bus.MEMORY``: tests/conftest.py sets it, empty,
    for every unit and database test), for a test that drives it: ``eager`` runs the producer at each
    wake-up."""
    from dashboards.core import live_bus

    assert settings.TCO_LIVE_BUS == "memory"
    return live_bus.MEMORY
