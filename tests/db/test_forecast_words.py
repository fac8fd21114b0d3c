"""The launch forecast's words (issue 24, the users' day): plurals right for one and for none."""
from __future__ import annotations

import datetime as dt
import html as html_lib
import re

import pytest
from django.utils import timezone

from dashboards.models import Team
from tests.db.test_lead_launcher_pages import _cluster_status
from tests.support.forms import launch_data
from tests.support.history import make_campaign, make_task

pytestmark = [pytest.mark.django_db]


def _forecast_text(client, **form) -> str:
    page = client.post("/ops/launch/", {**launch_data(**form), "preview": "1"}).content.decode()
    section = page.split('id="forecast', 1)[1].split("<form", 1)[0]
    return re.sub(r"\s+", " ", html_lib.unescape(re.sub(r"<[^>]+>", " ", section)))


def test_the_forecast_says_one_task_seat_slot_and_share_in_the_singular_and_none_in_the_plural(as_user, ops_users):
    from dashboards.core.clusters import cluster_get_default

    research = Team.objects.get(project="research")
    # One seat in all, a quota of one slot for research (in use), research alone in the share tree.
    _cluster_status(cluster_get_default(), queues=[{"name": "agent.q", "used": 0, "resv": 0, "available": 1,
                                                    "total": 1}],
                    quotas=[{"rule": "r1", "limit": 1, "used": 1, "resource": "slots",
                             "filters": {"projects": ["research"]}}],
                    hosts=[{"name": "global", "resources": {"anthropic_api": "1.000000"}}],
                    global_capacity={"anthropic_api": 1})
    done = make_campaign(team=research, user=ops_users["launcher"])
    make_task(done, task_number=1, started_at=timezone.now() - dt.timedelta(hours=2), wallclock_s=60)
    text = _forecast_text(as_user("launcher"), input_params="task=1..1")
    assert "limited by 1 task in the campaign;" in text
    assert "Waiting ahead 0 tasks on agent.q" in text
    assert "anthropic_api: 1 seat / 1 per task: 1 task at once" in text
    assert "quota r1: 1 slot: 1 task at once" in text and "quota r1: 1 of 1 slot in use" in text
    assert "research has 1 of 1 share among the projects with work" in text
    assert not re.search(r"\b1 (tasks|slots|seats|shares)\b", text), text
    assert not re.search(r"\b0 (task|slot|seat|share)\b", text), text
    # Three tasks: the plural again.
    assert "3 tasks in the campaign: 3 tasks at once" in _forecast_text(as_user("launcher"), input_params="task=1..3")
