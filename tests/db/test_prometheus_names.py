"""/metrics' fleet metrics (dashboards.web.metrics_fleet): values, names per Prometheus' conventions, promtool."""
from __future__ import annotations

import datetime as dt
import subprocess
from decimal import Decimal

import pytest
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from dashboards.core.clusters import cluster_get_default
from dashboards.models import Budget, Team

from tests.support.campaigns import make_campaign
from tests.support.prometheus import _promtool

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fast_passwords", "locmem_cache")]

TOKEN = "metrics-token-fleet-0123456789"
#: Labels that would make one series per job, task or campaign (Prometheus naming docs, "Labels").
PER_JOB_LABELS = {"job", "job_number", "job_id", "task", "task_id", "task_number", "campaign", "campaign_id",
                  "id", "ar_id", "user"}


@pytest.fixture
def fleet(role_users, settings):
    settings.TCO_METRICS_TOKEN = TOKEN
    research = Team.objects.get(project="research")
    now = timezone.now()
    t0 = now - dt.timedelta(hours=2)

    def s(seconds: float) -> dt.datetime:
        return t0 + dt.timedelta(seconds=seconds)

    make_campaign(team=research, user=role_users["admin"], name="stages", job_number=3001, tasks=[
        # queue wait 3 s, sandbox 0.02 s, agent 59 s, overhead 59.55 - 0.02 - 59 = 0.53 s (no value sits on a
        # bucket's bound: SQLite's julianday() has some 50 microseconds of float error)
        {"state": "done", "queue": "agent.q", "submitted_at": s(0), "started_at": s(3), "task_started_at": s(3),
         "sandbox_create_at": s(3), "sandbox_ready_at": s(3.02), "agent_started_at": s(3.05),
         "agent_exited_at": s(62.05), "teardown_done_at": s(62.55)},
        # queue wait 40 s, sandbox 0.2 s, agent 400 s, overhead 401.9 - 0.2 - 400 = 1.7 s
        {"state": "done", "queue": "agent.q", "submitted_at": s(0), "started_at": s(40), "task_started_at": s(40),
         "sandbox_create_at": s(40.1), "sandbox_ready_at": s(40.3), "agent_started_at": s(40.4),
         "agent_exited_at": s(440.4), "teardown_done_at": s(441.9)},
        # queue wait 700 s, no runner stages yet
        {"state": "running", "queue": "agent.q", "submitted_at": s(0), "started_at": s(700)},
        # pending for 1000 s (its queue is its campaign's), and a held one that is no pending wait
        {"state": "pending", "submitted_at": now - dt.timedelta(seconds=1000)},
        {"state": "held", "state_code": "hqw", "submitted_at": now - dt.timedelta(seconds=5000)},
        # started before tco's own submission time: a wait of 0, never negative
        {"state": "done", "queue": "classic.q", "submitted_at": s(10), "started_at": s(9), "task_started_at": s(9)},
        # spent now, against the budget below
        {"state": "done", "queue": "agent.q", "started_at": now - dt.timedelta(seconds=5), "cost_usd": Decimal("10"),
         "output_tokens": 5, "submitted_at": now - dt.timedelta(seconds=6)},
    ])
    Budget.objects.create(team=research, period="month", amount_usd=Decimal("100"), thresholds=[])
    cluster = cluster_get_default()
    cluster.status = {
        "hosts": [{"name": "global"}, {"name": "h1", "load_avg": 0.1}, {"name": "h2", "load_avg": None},
                  {"name": "h3", "load_avg": 0.2}],
        "queue_instances": [
            {"name": "agent.q@h1", "queue": "agent.q", "host": "h1", "states": "", "slots_used": 1, "slots_total": 4,
             "reasons": []},
            {"name": "agent.q@h2", "queue": "agent.q", "host": "h2", "states": "u", "slots_used": 0,
             "slots_total": 4, "reasons": []},
            {"name": "agent.q@h3", "queue": "agent.q", "host": "h3", "states": "d", "slots_used": 0,
             "slots_total": 4, "reasons": []},
        ],
        "reservations": [{"id": 7, "state": "running", "slots": 4, "team": "research"},
                         {"id": 8, "state": "waiting", "slots": 2, "team": "research"},
                         {"id": 9, "state": "waiting", "slots": 1, "team": None}],
    }
    cluster.save()
    return now


def _scrape(client) -> str:
    response = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}", REMOTE_ADDR="192.0.2.7")
    assert response.status_code == 200
    return response.content.decode()


def _samples(text: str) -> dict[tuple[str, tuple], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_stage_histograms_count_every_task_by_its_stage_seconds(client, fleet):
    got = _samples(_scrape(client))

    def bucket(name: str, queue: str, le: str) -> float:
        return got[(f"{name}_bucket", (("cluster", "dev"), ("le", le), ("queue", queue)))]

    # queue waits 1 (the task spent now), 3, 40 and 700 s in agent.q; 0 s in classic.q
    assert [bucket("tco_queue_wait_seconds", "agent.q", le) for le in ("0.5", "2", "5", "30", "60", "600", "1800")] \
        == [0, 1, 2, 2, 3, 3, 4]
    assert bucket("tco_queue_wait_seconds", "agent.q", "+Inf") == 4
    assert got[("tco_queue_wait_seconds_count", (("cluster", "dev"), ("queue", "agent.q")))] == 4
    assert got[("tco_queue_wait_seconds_sum", (("cluster", "dev"), ("queue", "agent.q")))] == pytest.approx(
        3 + 40 + 700 + 1, abs=1e-3)
    assert bucket("tco_queue_wait_seconds", "classic.q", "0.5") == 1
    assert got[("tco_queue_wait_seconds_sum", (("cluster", "dev"), ("queue", "classic.q")))] == 0
    assert [bucket("tco_sandbox_start_seconds", "agent.q", le) for le in ("0.01", "0.025", "0.25", "+Inf")] == \
        [0, 1, 2, 2]
    assert [bucket("tco_agent_run_seconds", "agent.q", le) for le in ("30", "60", "300", "600")] == [0, 1, 1, 2]
    assert got[("tco_agent_run_seconds_sum", (("cluster", "dev"), ("queue", "agent.q")))] == pytest.approx(459)
    assert [bucket("tco_integration_overhead_seconds", "agent.q", le) for le in ("0.5", "1", "2")] == [0, 1, 2]
    assert got[("tco_integration_overhead_seconds_sum", (("cluster", "dev"), ("queue", "agent.q")))] == \
        pytest.approx(0.53 + 1.7, abs=1e-3)


def test_pending_age_hosts_reservations_and_budgets(client, fleet):
    got = _samples(_scrape(client))
    assert 1000 <= got[("tco_pending_oldest_seconds", (("cluster", "dev"), ("queue", "agent.q")))] < 1060
    assert got[("tco_hosts", (("cluster", "dev"), ("state", "up")))] == 1
    assert got[("tco_hosts", (("cluster", "dev"), ("state", "unreachable")))] == 1
    assert got[("tco_hosts", (("cluster", "dev"), ("state", "disabled")))] == 1
    assert got[("tco_hosts", (("cluster", "dev"), ("state", "error")))] == 0
    assert got[("tco_reservations", (("cluster", "dev"), ("project", "research"), ("state", "waiting")))] == 1
    assert got[("tco_reservation_slots", (("cluster", "dev"), ("project", "research"), ("state", "running")))] == 4
    assert got[("tco_reservation_slots", (("cluster", "dev"), ("project", ""), ("state", "waiting")))] == 1
    assert got[("tco_budget_usd", (("period", "month"), ("project", "research")))] == 100
    assert got[("tco_budget_spent_usd", (("period", "month"), ("project", "research")))] == 10
    assert 0 < got[("tco_budget_period_elapsed_ratio", (("period", "month"), ("project", "research")))] <= 1


def test_every_metric_follows_the_naming_conventions(client, fleet):
    text = _scrape(client)
    families = list(text_string_to_metric_families(text))
    assert len(families) >= 25
    for family in families:
        assert family.name.startswith("tco_"), family.name
        if family.type == "histogram":
            assert family.name.endswith("_seconds"), family.name
        for sample in family.samples:
            assert not set(sample.labels) & PER_JOB_LABELS, (sample.name, sample.labels)
    # prometheus_client's parser strips _total from counter families: the exposition keeps it.
    counters = [f.name for f in families if f.type == "counter"]
    assert counters and all(f"# TYPE {name}_total counter" in text or f"# TYPE {name} counter" in text
                            for name in counters)
    for line in text.splitlines():
        if line.startswith("# TYPE") and line.endswith(" counter"):
            assert line.split()[2].endswith("_total"), line


def test_promtool_finds_nothing_to_say_about_the_metrics(client, fleet):
    text = _scrape(client)
    done = subprocess.run([_promtool(), "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and not done.stdout.strip() and not done.stderr.strip(), done.stdout + done.stderr


def test_promtool_would_catch_a_badly_named_metric():
    """The check above can fail: promtool names a counter without ``_total`` and a unit not in base units."""
    bad = ("# HELP tco_requests Requests\n# TYPE tco_requests counter\ntco_requests 1\n"
           "# HELP tco_wait_milliseconds Wait\n# TYPE tco_wait_milliseconds gauge\ntco_wait_milliseconds 5\n")
    done = subprocess.run([_promtool(), "check", "metrics"], input=bad, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "tco_requests" in done.stdout + done.stderr and "tco_wait_milliseconds" in done.stdout + done.stderr


def test_a_finished_campaigns_histograms_are_read_once_and_merged(role_users):
    """Finished campaigns' rows come from the cache (their tasks no longer change), live ones' from the
    database at every scrape; the merged histogram is the same either way."""
    from dashboards.core.stages import stage_histograms
    from dashboards.models import Task

    research = Team.objects.get(project="research")
    now = timezone.now()

    def waited(seconds: float) -> dict:
        return {"state": "done", "queue": "agent.q", "submitted_at": now - dt.timedelta(hours=1),
                "started_at": now - dt.timedelta(hours=1) + dt.timedelta(seconds=seconds)}

    done = make_campaign(team=research, user=role_users["admin"], name="done", job_number=3101, status="finished",
                         finished_at=now, tasks=[waited(3), waited(40)])
    make_campaign(team=research, user=role_users["admin"], name="live", job_number=3102, tasks=[waited(700)])
    first = stage_histograms()["queue_wait"]
    assert [(r["queue"], r["count"], r["sum"]) for r in first] == [("agent.q", 3, pytest.approx(743, abs=1e-3))]
    # The finished campaign's tasks are not read again (here: changed behind tco's back, still counted
    # as they were); the live campaign's are.
    Task.objects.filter(campaign=done).update(submitted_at=None)
    Task.objects.filter(campaign__name="live").update(started_at=now - dt.timedelta(hours=1) + dt.timedelta(seconds=4))
    second = stage_histograms()["queue_wait"]
    assert [(r["count"], r["sum"]) for r in second] == [(3, pytest.approx(47, abs=1e-3))]
    assert dict(second[0]["buckets"])[5] == 2 and dict(second[0]["buckets"])[60] == 3
