"""Queue calendars (schedulers.calendars) against calendar_conf(5)'s own examples, states worked out by hand.

Reference days: 2026-12-01 is a Tuesday; 1999-01-01 was a Friday (a public holiday in the man page's
``night`` and ``day`` examples), 1999-01-04 a Monday.
"""
from __future__ import annotations

import datetime as dt

import pytest


UTC = dt.timezone.utc
HOLIDAYS = "1.1.1999,6.1.1999,28.3.1999,30.3.1999-31.3.1999,18.5.1999-19.5.1999,3.10.1999,25.12.1999,26.12.1999"


def at(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text).replace(tzinfo=UTC)


@pytest.mark.django_db
def test_status_poll_stores_each_queue_calendar_for_the_pages_and_the_assistant(bootstrap, monkeypatch):
    from dashboards.core.clusters import cluster_get_default
    from dashboards.ingest.cluster_status import cluster_status_refresh
    from dashboards.live.cluster import cluster_resources
    from schedulers.fake import FakeScheduler

    monkeypatch.setattr("dashboards.core.realtime.queue_changed", lambda *a, **k: None)
    fake = FakeScheduler()
    fake.queue_rows = [{"name": "agent.q", "used": 0, "resv": 0, "available": 96, "total": 96},
                       {"name": "classic.q", "used": 0, "resv": 0, "available": 2, "total": 2}]
    fake.queue_calendars = lambda: {"agent.q": {"calendar": "after_hours", "calendar_year": "NONE",
                                                "calendar_week": "mon-fri=8-18=off"}}
    cluster = cluster_get_default()
    monkeypatch.setattr("django.utils.timezone.now", lambda: at("2026-12-01 16:40:00"))
    cluster_status_refresh(cluster=cluster, scheduler=fake)
    cluster.refresh_from_db()
    agent, classic = cluster.status["queues"]
    assert agent["calendar"] == "after_hours" and agent["calendar_state"] == "off"
    assert agent["calendar_next_change"] == "2026-12-01T18:00:00Z" and agent["calendar_next_state"] == "on"
    assert "calendar" not in classic and "queue_calendars" not in cluster.status
    # The page works the state out when it is shown, not when the poll ran.
    monkeypatch.setattr("django.utils.timezone.now", lambda: at("2026-12-01 18:30:00"))
    shown = cluster_resources(cluster, "anthropic_api")["queues"][0]
    assert shown["calendar_text"] == "agent.q: calendar after_hours, open until 08:00 UTC on Wed 2026-12-02"
