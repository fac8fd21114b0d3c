"""A runner killed outright (SIGKILL): the task keeps the usage it metered and the stages known without it."""
from __future__ import annotations

import datetime as dt
import json
import os
from decimal import Decimal

import pytest
from django.utils import timezone

from dashboards.models import ModelRequest, Task, Team
from dashboards.ingest.orphans import FLAG, recover_killed_runners
from dashboards.core.clusters import cluster_get_default
from execution.spool.layout import SpoolLayout

from tests.support.campaigns import make_campaign

pytestmark = pytest.mark.django_db


def request_line(n: int, inp: int, out: int, cost: str) -> bytes:
    return (json.dumps({"at": f"2026-12-01T10:00:0{n}.000000Z", "method": "POST", "path": "/v1/messages",
                        "status": 200, "model_requested": "claude-x", "model_returned": "claude-x",
                        "usage": {"provider": "anthropic", "input_tokens": inp, "output_tokens": out,
                                  "complete": True, "flags": []},
                        "cost_usd": cost, "latency_ms": 12, "complete": True, "flags": []}) + "\n").encode()


def test_a_killed_runner_s_task_keeps_its_metered_usage_and_start(bootstrap, role_users):
    ended = timezone.now() - dt.timedelta(minutes=5)
    started = ended - dt.timedelta(seconds=30)
    campaign = make_campaign(team=Team.objects.get(project="research"), user=role_users["admin"], name="killed",
                             job_number=5150, tasks=[
                                 {"state": "failed", "active": False, "exit_status": 137, "started_at": started,
                                  "ended_at": ended},
                                 {"state": "failed", "active": False, "exit_status": 1, "started_at": started,
                                  "ended_at": ended, "runner_record": {"version": 2}},
                                 {"state": "failed", "active": False, "exit_status": 137, "started_at": started,
                                  "ended_at": timezone.now()},
                             ])
    layout = SpoolLayout(bootstrap.TCO_SPOOL_DIR)
    path = layout.task_file(campaign.pk, 1, "requests.jsonl")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as fh:
        # Two metered requests, then the third cut by the kill.
        fh.write(request_line(1, 100, 10, "0.001") + request_line(2, 200, 20, "0.002") + request_line(3, 5, 5, "1")[:40])
    assert recover_killed_runners(cluster_get_default()) == 1
    task = Task.objects.get(campaign=campaign, task_number=1)
    assert (task.input_tokens, task.output_tokens, task.cost_usd) == (300, 30, Decimal("0.003"))
    assert task.task_started_at == started and task.agent_started_at is None and task.teardown_done_at is None
    assert FLAG in task.usage_flags and "requests_unreadable" in task.usage_flags
    assert list(ModelRequest.objects.filter(task=task).order_by("seq").values_list("input_tokens", flat=True)) == [
        100, 200]
    # The task with a record, and the one that just ended (its record may still come), are left alone.
    assert Task.objects.get(campaign=campaign, task_number=2).usage_flags == []
    assert Task.objects.get(campaign=campaign, task_number=3).usage_flags == []
    assert recover_killed_runners(cluster_get_default()) == 0
