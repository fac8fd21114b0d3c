"""The REST API: token and session authentication, the same scoping as the pages, the shapes."""
from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from dashboards.core.accounts import api_token_rotate
from dashboards.core import rollups
from dashboards.models import AccountingRecord, ApiToken, ModelRequest, Task, Team
from schedulers.fake import FakeScheduler

from tests.support.campaigns import DEMO_PASSWORD, make_campaign

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fast_passwords", "locmem_cache")]

T0 = dt.datetime(2026, 11, 2, 9, 0, 0, tzinfo=dt.timezone.utc)


def stages(n: int, *, wait: float, sandbox: float, agent: float, overhead: float) -> dict:
    """Task fields for a finished task whose stages last the given seconds (n shifts its start)."""
    submitted = T0 + dt.timedelta(seconds=n)
    started = submitted + dt.timedelta(seconds=wait)
    create = started + dt.timedelta(seconds=overhead / 2)
    ready = create + dt.timedelta(seconds=sandbox)
    agent_start = ready
    agent_end = agent_start + dt.timedelta(seconds=agent)
    return {"submitted_at": submitted, "task_started_at": started, "started_at": started,
            "sandbox_create_at": create, "sandbox_ready_at": ready, "agent_started_at": agent_start,
            "agent_exited_at": agent_end, "teardown_done_at": agent_end + dt.timedelta(seconds=overhead / 2),
            "ended_at": agent_end + dt.timedelta(seconds=overhead / 2), "state": "done", "exit_status": 0,
            "failed_code": 0}


@pytest.fixture
def data(role_users):
    research = Team.objects.get(project="research")
    engineering = Team.objects.get(project="engineering")
    admin = role_users["admin"]
    alpha_tasks = [
        {**stages(1, wait=1.0, sandbox=0.01, agent=3.0, overhead=0.2), "input_tokens": 100, "output_tokens": 50,
         "cost_usd": Decimal("0.001"), "wallclock_s": 4.0},
        {**stages(2, wait=2.0, sandbox=0.02, agent=5.0, overhead=0.4), "input_tokens": 10, "output_tokens": 5,
         "cost_usd": Decimal("0.0005"), "wallclock_s": 6.0},
        {**stages(3, wait=3.0, sandbox=0.03, agent=7.0, overhead=0.6), "state": "failed", "exit_status": 3},
        {"state": "error", "state_code": "Eqw"},
        {"state": "pending"},
    ]
    alpha = make_campaign(team=research, user=admin, name="alpha", job_number=1001, tasks=alpha_tasks,
                          launched_at=T0 - dt.timedelta(seconds=1))
    beta = make_campaign(team=engineering, user=admin, name="beta", job_number=1002,
                         tasks=[{**stages(1, wait=1, sandbox=1, agent=1, overhead=1), "input_tokens": 7,
                                 "cost_usd": Decimal("0.5"), "wallclock_s": 3.0}],
                         launched_at=T0 - dt.timedelta(seconds=1))
    for t in Task.objects.filter(wallclock_s__gt=0):  # wall clock is billed from accounting records
        AccountingRecord.objects.create(
            cluster=t.cluster, task=t, job_number=t.job_number, task_number=t.task_number, submission_us=0,
            start_us=int(t.started_at.timestamp() * 1e6), end_us=int(t.ended_at.timestamp() * 1e6),
            submitted_at=t.submitted_at, started_at=t.started_at, ended_at=t.ended_at, job_name="x", owner="tco",
            group="tco", project=t.campaign.team.project, queue="agent.q", hostname="vm", slots=1,
            wallclock_s=t.wallclock_s, cpu_s=0.0, maxvmem_bytes=0.0, failed=0, exit_status=0)
    rollups.rebuild()  # the usage rollups of these records, as ingest keeps them
    task = alpha.tasks.get(task_number=1)
    ModelRequest.objects.create(task=task, seq=1, at=T0, provider="anthropic", method="POST", path="/v1/messages",
                                status=200, model="claude-x", input_tokens=100, output_tokens=50,
                                cost_usd=Decimal("0.001"))
    return {"users": role_users, "alpha": alpha, "beta": beta, "task": task}


def token_client(user) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {api_token_rotate(user=user).key}")
    return client


def test_without_credentials_every_endpoint_is_refused(data):
    client = APIClient()
    for path in ("/api/me/", "/api/queue/", "/api/queue/depth/", "/api/campaigns/",
                 f"/api/campaigns/{data['alpha'].pk}/", f"/api/campaigns/{data['alpha'].pk}/tasks/",
                 f"/api/tasks/{data['task'].pk}/", "/api/usage/", "/api/schema/"):
        assert client.get(path).status_code == 401, path


def test_a_wrong_token_is_refused(data):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Token not-a-token")
    assert client.get("/api/campaigns/").status_code == 401


@pytest.mark.parametrize("username", ["viewer", "lead", "launcher", "urgent"])
def test_a_token_sees_what_its_user_sees(data, username):
    client = token_client(data["users"][username])
    listing = client.get("/api/campaigns/").json()
    assert [c["name"] for c in listing["results"]] == ["alpha"]
    assert listing["page"] == {"page": 1, "pages": 1, "per_page": 25, "total": 1}
    assert client.get(f"/api/campaigns/{data['beta'].pk}/").status_code == 404
    assert client.get(f"/api/campaigns/{data['beta'].pk}/tasks/").status_code == 404
    assert client.get(f"/api/tasks/{data['beta'].tasks.get().pk}/").status_code == 404
    queue = client.get("/api/queue/").json()
    assert [c["name"] for c in queue["campaigns"]] == ["alpha"] and queue["other_jobs"] is None
    admin = token_client(data["users"]["admin"])
    assert {c["name"] for c in admin.get("/api/campaigns/").json()["results"]} == {"alpha", "beta"}


def test_a_token_can_be_obtained_with_a_password_and_revoked_by_rotation(data):
    client = APIClient()
    response = client.post("/api/token/", {"username": "viewer", "password": DEMO_PASSWORD}, format="json")
    assert response.status_code == 200
    key = response.json()["token"]
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    assert client.get("/api/me/").json()["username"] == "viewer"
    api_token_rotate(user=data["users"]["viewer"])
    assert client.get("/api/me/").status_code == 401
    assert APIClient().post("/api/token/", {"username": "viewer", "password": "wrong"}).status_code == 400


def test_me_lists_teams_roles_and_capabilities(data):
    me = token_client(data["users"]["lead"]).get("/api/me/").json()
    assert me["teams"] == [{"team": "research", "project": "research", "role": "lead"}]
    assert me["capabilities"]["bill"] == ["research"] and me["capabilities"]["launch"] == []
    admin = token_client(data["users"]["admin"]).get("/api/me/").json()
    assert admin["admin"] is True and admin["capabilities"]["triage"] == ["engineering", "research"]


@pytest.mark.parametrize("username", ["viewer", "launcher", "urgent", "eng-viewer"])
def test_usage_is_refused_to_roles_without_bills(data, username):
    assert token_client(data["users"][username]).get("/api/usage/").status_code == 403


def test_usage_sums_a_team_leads_teams_only(data):
    client = token_client(data["users"]["lead"])
    body = client.get("/api/usage/", {"since": "2026-11-01", "until": "2026-12-01"}).json()
    assert [r["team"] for r in body["teams"]] == ["research"]
    row = body["teams"][0]
    assert row["tasks"] == 3 and row["input_tokens"] == 110 and row["output_tokens"] == 55 and row["tokens"] == 165
    assert Decimal(row["cost_usd"]) == Decimal("0.0015") and row["wallclock_s"] == 10.0
    # A task belongs to the period of its start: none started in October.
    october = client.get("/api/usage/", {"since": "2026-10-01", "until": "2026-11-01"}).json()
    assert october["teams"] == []
    admin = token_client(data["users"]["admin"]).get("/api/usage/", {"since": "2026-11-01"}).json()
    assert {r["team"] for r in admin["teams"]} == {"research", "engineering"}
    assert client.get("/api/usage/", {"since": "yesterday"}).status_code == 400


def test_campaign_detail_lists_errors_and_failures_first_then_by_task_number(data):
    client = token_client(data["users"]["viewer"])
    body = client.get(f"/api/campaigns/{data['alpha'].pk}/").json()
    assert [(t["task_number"], t["state"]) for t in body["tasks"]] == [
        (3, "failed"), (4, "error"), (1, "done"), (2, "done"), (5, "pending")]
    assert body["states"]["done"] == 2 and body["failures"] == 2 and body["ended"] == 3
    assert body["progress_pct"] == 60.0
    paged = client.get(f"/api/campaigns/{data['alpha'].pk}/tasks/", {"per_page": 2, "page": 2}).json()
    assert [t["task_number"] for t in paged["tasks"]] == [1, 2] and paged["pages"] == 3
    filtered = client.get(f"/api/campaigns/{data['alpha'].pk}/tasks/", {"state": "done"}).json()
    assert [t["task_number"] for t in filtered["tasks"]] == [1, 2]
    assert client.get(f"/api/campaigns/{data['alpha'].pk}/tasks/", {"state": "bogus"}).status_code == 400
    first = body["tasks"][2]
    assert first["tokens"] == 150 and first["cost_usd"] == "0.00100000"
    assert first["queue_wait_s"] == 1.0 and first["agent_work_s"] == 3.0
    assert first["integration_overhead_s"] == pytest.approx(0.2)


def test_the_stage_table_has_the_medians_of_the_source_article(data):
    body = token_client(data["users"]["viewer"]).get(f"/api/campaigns/{data['alpha'].pk}/").json()
    rows = {r["stage"]: r for r in body["stages"]["rows"]}
    assert list(rows) == ["submit", "queue_wait", "sandbox_start", "agent_work", "integration_overhead"]
    assert rows["submit"]["median_s"] == pytest.approx(0.25)
    assert rows["queue_wait"]["median_s"] == pytest.approx(2.0, abs=1e-3)
    assert rows["sandbox_start"]["median_s"] == pytest.approx(0.02, abs=1e-3)
    assert rows["agent_work"]["median_s"] == pytest.approx(5.0, abs=1e-3)
    assert rows["integration_overhead"]["median_s"] == pytest.approx(0.4, abs=1e-3)
    assert rows["agent_work"]["n"] == 3 and sum(rows["agent_work"]["histogram"]["counts"]) == 3
    assert body["stages"]["tasks_with_record"] == 3


def fake_cluster_scheduler(monkeypatch) -> FakeScheduler:
    """Every ``scheduler_for`` answers with one FakeScheduler (which records its ``qstat -j`` calls)."""
    fake = FakeScheduler()
    monkeypatch.setattr("dashboards.core.clusters.scheduler_for", lambda cluster, **options: fake)
    return fake


def test_task_detail_has_requests_and_no_scheduler_call_when_asked_not_to(data, monkeypatch):
    fake = fake_cluster_scheduler(monkeypatch)
    pending = data["alpha"].tasks.get(task_number=5)
    client = token_client(data["users"]["viewer"])
    body = client.get(f"/api/tasks/{pending.pk}/", {"scheduler": "false"}).json()
    assert body["scheduler"] is None and body["pending_reasons"] is None
    assert fake.job_detail_calls == []
    body = client.get(f"/api/tasks/{data['task'].pk}/").json()
    assert body["requests"]["count"] == 1 and body["requests"]["rows"][0]["model"] == "claude-x"
    assert body["requests"]["totals"]["cost_usd"] == "0.00100000"
    assert [s["stage"] for s in body["timeline"]] == ["submit", "queue_wait", "runner_setup", "sandbox_start",
                                                      "handoff", "agent_work", "teardown"]


def test_pending_reasons_come_from_one_cached_qstat_call(data, monkeypatch):
    fake = fake_cluster_scheduler(monkeypatch)
    fake.set_job_detail(1001, {"job_number": 1001, "tasks": [], "holds": {}, "predecessors": [],
                               "scheduler_messages": ['(-l anthropic_api=1) cannot run globally because it '
                                                      'offers only gc:anthropic_api=0.000000'],
                               "global_messages": []})
    pending = data["alpha"].tasks.get(task_number=5)
    client = token_client(data["users"]["viewer"])
    for _ in range(3):
        body = client.get(f"/api/tasks/{pending.pk}/").json()
    # One qstat -j for three views, bounded by the web timeout (3 s).
    assert fake.job_detail_calls == [(1001, 3.0)]
    assert body["pending_reasons"][0]["text"].startswith("waiting for a model API seat")
    assert body["scheduler"]["detail"]["job_number"] == 1001


def test_a_scheduler_error_is_shown_not_raised(data, monkeypatch):
    fake = fake_cluster_scheduler(monkeypatch)
    fake.unavailable = True
    pending = data["alpha"].tasks.get(task_number=5)
    body = token_client(data["users"]["viewer"]).get(f"/api/tasks/{pending.pk}/").json()
    assert body["scheduler"]["error"].startswith("SchedulerUnavailable: ") and body["pending_reasons"] is None

    from django.core.cache import cache

    cache.clear()
    fake.unavailable = False  # and the fake holds no job 1001: qstat -j says it is unknown
    body = token_client(data["users"]["viewer"]).get(f"/api/tasks/{pending.pk}/").json()
    assert body["scheduler"]["error"] == "the scheduler no longer knows this job"


def test_the_openapi_schema_lists_the_endpoints(data):
    client = APIClient()
    client.force_authenticate(data["users"]["viewer"])
    response = client.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert response.status_code == 200
    text = response.content.decode()
    for path in ("/api/queue/", "/api/campaigns/{campaign_id}/tasks/", "/api/tasks/{task_id}/", "/api/usage/"):
        assert path in text


def test_the_session_works_for_the_api_too(client, data):
    assert client.login(username="eng-viewer", password=DEMO_PASSWORD)
    assert [c["name"] for c in client.get("/api/campaigns/").json()["results"]] == ["beta"]


def test_the_token_page_shows_a_new_key_once(client, data):
    assert client.login(username="viewer", password=DEMO_PASSWORD)
    response = client.post("/account/token/", {"action": "rotate"}, follow=True)
    key = response.context["new_key"]
    assert len(key) == 40 and key in response.content.decode()
    token_client_ = APIClient()
    token_client_.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    assert token_client_.get("/api/me/").json()["username"] == "viewer"
    assert key not in client.get("/account/token/").content.decode()
    client.post("/account/token/", {"action": "revoke"})
    assert not ApiToken.objects.filter(user=data["users"]["viewer"]).exists()
    assert token_client_.get("/api/me/").status_code == 401


def test_campaign_pages_are_paginated_on_the_queue(data):
    research = Team.objects.get(project="research")
    for n in range(30):
        make_campaign(team=research, user=data["users"]["admin"], name=f"old{n}", job_number=3000 + n,
                      status="finished", tasks=[{"state": "done", "ended_at": timezone.now()}],
                      launched_at=T0 - dt.timedelta(days=1, minutes=n), finished_at=T0)
    client = token_client(data["users"]["viewer"])
    first = client.get("/api/queue/").json()
    assert first["campaigns_page"] == {"page": 1, "pages": 2, "per_page": 25, "total": 31}
    assert first["campaigns"][0]["name"] == "alpha"  # unfinished first
    second = client.get("/api/queue/", {"page": 2}).json()
    assert len(second["campaigns"]) == 6 and second["campaigns"][-1]["states"]["done"] == 1
    assert client.get("/api/campaigns/", {"status": "finished"}).json()["page"]["total"] == 30
    assert Task.objects.count() == 36
