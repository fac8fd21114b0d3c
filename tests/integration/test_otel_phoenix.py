"""GenAI traces of a real campaign on the dev cluster, read back from a real OTLP receiver (issue 25, item 1).

Arize Phoenix (its own virtual environment, tests/support/phoenix.py) listens on the master's
address, where the execution hosts reach it; tco is pointed at it with the standard
``OTEL_EXPORTER_OTLP_ENDPOINT`` only. A small sweep-and-review campaign (2 review agents, one JSON
and one streamed answer from the scripted stand-in model) runs through the launch, DRMAA, the
runner, its sandbox and the metering proxy; then every span of the campaign's trace is read back
through Phoenix's REST API and checked against tco's own records: the ModelRequest rows (tokens,
cost, model), the tasks' stage times and the runner records' span counts.
"""
from __future__ import annotations

import datetime as dt
import time

import pytest
from django.utils import timezone

from dashboards.billing.usage import usage_by_project
from dashboards.ingest.accounting import ingest_accounting
from dashboards.ingest.poll import apply_qstat_poll
from dashboards.ingest.runner_records import ingest_runner_records
from dashboards.launch.submit import campaign_submit
from dashboards.models import ModelRequest, Task
from demo.sweep import DEFAULT_MODEL, sweep_review_launch, sweep_submit
from schedulers.hosts import master_address
from tests.support.phoenix import phoenix_server, spans, wait_for_spans
from tests.support.sweep_review import prepare_sweep_review

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

N = 2
STAGES = {"queue wait": ("submitted", "task_started_at"), "sandbox start": ("sandbox_create_at", "sandbox_ready_at"),
          "agent": ("agent_started_at", "agent_exited_at"), "integration": ("agent_exited_at", "teardown_done_at")}


def when(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text).astimezone(dt.timezone.utc)


@pytest.fixture
def phoenix(tmp_path, settings):
    host = master_address(settings.SGE_ROOT, settings.SGE_CELL)
    with phoenix_server(host, tmp_path / "phoenix") as url:
        yield url


def test_a_campaign_is_one_trace_of_agents_model_calls_and_stages_in_phoenix(
        bootstrap, django_user_model, stand_in_model, runs_dir, settings, phoenix):
    settings.TCO_OTEL_ENV = {"OTEL_EXPORTER_OTLP_ENDPOINT": phoenix, "TCO_OTEL_COST": "1",
                             "OTEL_SERVICE_NAME": "tco-test"}
    setting = prepare_sweep_review(settings, django_user_model, stand_in_model, runs_dir)
    cluster, team, admin, runs, port, scheduler = setting.cluster, setting.team, setting.admin, setting.runs, \
        setting.port, setting.scheduler

    sweep_job, _ = sweep_submit(team=team, count=N, out_dir=runs, name="otelsweep", scheduler=scheduler)
    campaign = sweep_review_launch(user=admin, team=team, sweep_job=sweep_job, runs_dir=runs, count=N,
                                   endpoint="demo-stand-in", name="otelreview")
    campaign = campaign_submit(campaign_id=campaign.pk, scheduler=scheduler)
    assert campaign.status == "submitted", campaign.submit_error
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        apply_qstat_poll(cluster, scheduler.list_tasks(), observed_at=timezone.now())
        ingest_accounting(cluster)
        ingest_runner_records(cluster)
        if Task.objects.filter(campaign=campaign, teardown_done_at__isnull=False).count() == N:
            break
        time.sleep(0.5)
    else:
        pytest.fail(f"the reviews did not finish: {list(Task.objects.filter(campaign=campaign).values_list('state'))}")

    # The launch's span is the trace's root; every task's spans are in its trace.
    launch = [s for s in spans(phoenix) if s["name"] == f"launch campaign {campaign.pk}"]
    assert len(launch) == 1 and launch[0]["parent_id"] is None
    trace_id = launch[0]["context"]["trace_id"]
    got = wait_for_spans(phoenix, trace_id, 1 + 6 * N)
    assert len(got) == 1 + 6 * N
    assert launch[0]["attributes"]["tco.job.number"] == campaign.job_number

    tasks = list(Task.objects.filter(campaign=campaign).order_by("task_number"))
    agents = {s["attributes"]["gen_ai.agent.id"]: s for s in got
              if s["attributes"].get("gen_ai.operation.name") == "invoke_agent"}
    assert sorted(agents) == [f"{campaign.pk}.{t.task_number}" for t in tasks]
    total_tokens = 0
    for task in tasks:
        record = task.runner_record
        assert record["exit_status"] == 0 and record["flags"] == [], record
        # Every span the runner made reached the receiver, and it says so in the record.
        assert record["telemetry"] == {"spans": 6, "spans_exported": 6, "spans_dropped": 0, "error": None}
        agent = agents[f"{campaign.pk}.{task.task_number}"]
        assert agent["name"] == f"invoke_agent {campaign.agent_definition.name}"
        assert agent["attributes"]["gen_ai.agent.name"] == campaign.agent_definition.name
        assert agent["parent_id"] == launch[0]["context"]["span_id"] and agent["span_kind"] == "AGENT"
        assert when(agent["end_time"]) == task.teardown_done_at
        children = {s["name"]: s for s in got if s["parent_id"] == agent["context"]["span_id"]}
        rows = list(ModelRequest.objects.filter(task=task).order_by("seq"))
        assert len(rows) == 1
        row = rows[0]
        assert sorted(children) == sorted(["agent", "integration", "queue wait", "sandbox start",
                                           f"chat {row.requested_model}"])
        assert row.requested_model == DEFAULT_MODEL
        chat = children[f"chat {row.requested_model}"]
        a = chat["attributes"]
        assert chat["span_kind"] == "LLM"  # Phoenix's reading of the GenAI attributes
        assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.provider.name"] == row.provider
        assert a["gen_ai.request.model"] == row.requested_model and a["gen_ai.response.model"] == row.model
        assert a["gen_ai.response.id"] and a["gen_ai.response.finish_reasons"]
        assert a["http.response.status_code"] == row.status == 200
        assert a["server.port"] == port
        # Tokens exactly as metered: tco's buckets one by one, and the conventions' sums of them.
        for bucket in ("input_tokens", "cache_read_tokens", "cache_write_5m_tokens", "cache_write_1h_tokens",
                       "output_tokens", "reasoning_tokens"):
            assert a[f"tco.usage.{bucket}"] == getattr(row, bucket), bucket
        assert a["gen_ai.usage.input_tokens"] == (row.input_tokens + row.cache_read_tokens
                                                  + row.cache_write_5m_tokens + row.cache_write_1h_tokens)
        assert a["gen_ai.usage.output_tokens"] == row.output_tokens == task.output_tokens
        assert a["gen_ai.usage.cache_read.input_tokens"] == row.cache_read_tokens
        assert row.cost_usd is not None and a["gen_ai.usage.cost.currency"] == "USD"
        assert a["gen_ai.usage.cost.amount"] == pytest.approx(float(row.cost_usd), abs=1e-12)
        total_tokens += a["gen_ai.usage.input_tokens"] + a["gen_ai.usage.output_tokens"]
        assert when(chat["start_time"]) == row.at
        # The stages are the runner record's times, to the microsecond.
        for name, (begin, end) in STAGES.items():
            span = children[name]
            if begin != "submitted":
                assert when(span["start_time"]) == getattr(task, begin), name
            assert when(span["end_time"]) == getattr(task, end), name
            assert span["attributes"]["tco.stage"] in ("queue_wait", "sandbox_start", "agent_work",
                                                       "integration_overhead")
        assert when(children["queue wait"]["start_time"]) <= task.task_started_at
        assert when(children["queue wait"]["start_time"]) >= campaign.launched_at
    assert total_tokens == sum(t.input_tokens + t.cache_read_tokens + t.cache_write_5m_tokens
                               + t.cache_write_1h_tokens + t.output_tokens for t in tasks) > 0
    # /metrics' figures (tco_otel_spans_*_total) from the same records.
    research = next(r for r in usage_by_project() if r["project"] == "research")
    assert (research["otel_spans_exported"], research["otel_spans_dropped"]) == (6 * N, 0)
