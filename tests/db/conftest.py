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
