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
