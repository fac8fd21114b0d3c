"""Runner records: stages and the metering proxy's requests land on their task; bad records are set aside."""
from __future__ import annotations

import json
from decimal import Decimal

import pytest
from django.utils import timezone

from dashboards.models import AgentDefinition, Campaign, ModelRequest, Task
from dashboards.services import team_ensure
from dashboards.clusters import cluster_get_default
from dashboards.ingest import ingest_runner_records

pytestmark = pytest.mark.django_db


@pytest.fixture
def campaign(django_user_model):
    cluster = cluster_get_default()
    team = team_ensure(name="research", project="research")
    user = django_user_model.objects.create_user("launcher")
    agent = AgentDefinition.objects.create(name="a", command=["true"])
    c = Campaign.objects.create(name="c", cluster=cluster, team=team, agent_definition=agent, launched_by=user,
                                queue="agent.q", task_count=1, launched_at=timezone.now(), job_number=77)
    Task.objects.create(cluster=cluster, campaign=c, job_number=77, task_number=1, is_array=True, state="running")
    return c


def request(at: str, model: str, usage: dict, cost: str | None) -> dict:
    return {"at": at, "method": "POST", "path": "/v1/messages", "status": 200, "refused": None,
            "model_requested": model, "model_returned": model, "usage": {"provider": "anthropic", **usage},
            "cost_usd": cost, "latency_ms": 12.5, "complete": True, "flags": []}


def write_record(spool, campaign, **extra):
    record = {"version": 1, "campaign_id": campaign.pk, "task_number": 1, "job_number": 77,
              "stages": {"task_started_at": "2026-11-29T12:00:00.000100Z", "agent_started_at": "2026-11-29T12:00:00.020Z",
                         "agent_exited_at": "2026-11-29T12:00:05.5Z", "teardown_done_at": "2026-11-29T12:00:05.51Z"},
              "exit_status": 0, **extra}
    path = spool / "records" / str(campaign.pk) / "1.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(record))
    return path


def test_it_sums_the_requests_into_the_task_and_keeps_each_one(tmp_path, campaign):
    reqs = [
        request("2026-11-29T12:00:01Z", "m1", {"input_tokens": 100, "cache_read_tokens": 1000,
                                                "cache_write_5m_tokens": 50, "output_tokens": 20}, "0.0012"),
        request("2026-11-29T12:00:03Z", "m1", {"input_tokens": 10, "cache_write_1h_tokens": 7, "output_tokens": 5,
                                                "reasoning_tokens": 2}, "0.0003"),
    ]
    path = write_record(tmp_path, campaign, requests=reqs)
    assert ingest_runner_records(campaign.cluster, spool=tmp_path) == 1
    task = Task.objects.get()
    assert (task.input_tokens, task.cache_read_tokens, task.cache_write_5m_tokens, task.cache_write_1h_tokens,
            task.output_tokens, task.reasoning_tokens) == (110, 1000, 50, 7, 25, 2)
    assert task.cost_usd == Decimal("0.0015")
    assert task.agent_exited_at.isoformat() == "2026-11-29T12:00:05.500000+00:00"
    assert ModelRequest.objects.filter(task=task).count() == 2
    assert not path.exists() and (tmp_path / "ingested" / str(campaign.pk) / "1.json").exists()


def test_an_unpriced_request_makes_the_cost_unknown_not_lower(tmp_path, campaign):
    reqs = [request("2026-11-29T12:00:01Z", "m1", {"input_tokens": 100, "output_tokens": 20}, "0.001"),
            request("2026-11-29T12:00:02Z", "mystery", {"input_tokens": 5, "output_tokens": 5,
                                                        "flags": ["unpriced_model"]}, None)]
    write_record(tmp_path, campaign, requests=reqs)
    ingest_runner_records(campaign.cluster, spool=tmp_path)
    task = Task.objects.get()
    assert task.cost_usd is None and "unpriced_model" in task.usage_flags
    assert task.input_tokens == 105


def test_a_requests_file_outside_the_spool_is_quarantined(tmp_path, campaign):
    outside = tmp_path.parent / "elsewhere.jsonl"
    outside.write_text("")
    write_record(tmp_path, campaign, requests_path=str(outside))
    assert ingest_runner_records(campaign.cluster, spool=tmp_path) == 0
    assert (tmp_path / "quarantine" / str(campaign.pk) / "1.json").exists()
    assert Task.objects.get().task_started_at is None


def test_a_declared_verdict_output_becomes_the_tasks_verdict(tmp_path, campaign):
    out = tmp_path / "records" / str(campaign.pk) / "1.outputs" / "verdict.json"
    out.parent.mkdir(parents=True)
    out.write_text('{"verdict": "bad", "sweep_task": 1}')
    write_record_at = tmp_path / "records" / str(campaign.pk) / "1.json"
    record = {"version": 2, "campaign_id": campaign.pk, "task_number": 1, "job_number": 77, "stages": {},
              "outputs": [{"name": "verdict.json", "path": str(out)}]}
    write_record_at.write_text(json.dumps(record))
    ingest_runner_records(campaign.cluster, spool=tmp_path)
    assert Task.objects.get().verdict == "bad"


def test_a_verdict_path_outside_the_spool_is_not_read(tmp_path, campaign):
    outside = tmp_path.parent / "verdict.json"
    outside.write_text('{"verdict": "ok"}')
    path = tmp_path / "records" / str(campaign.pk) / "1.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"version": 2, "campaign_id": campaign.pk, "task_number": 1, "job_number": 77,
                                "stages": {}, "outputs": [{"name": "verdict.json", "path": str(outside)}]}))
    ingest_runner_records(campaign.cluster, spool=tmp_path)
    assert Task.objects.get().verdict == ""
