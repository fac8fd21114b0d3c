"""Issue 23 (done means, finding 1): a task that a limit stopped (failure kind ``limit``) shows in
triage with its clear reason ("memory limit 4 GiB reached"), beside the waiting jobs; an agent's own
failure, an old stop and a finished task do not."""
from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone

from dashboards.control import triage
from dashboards.core.clusters import cluster_get_default
from dashboards.models import Task, Team
from tests.support.campaigns import make_campaign

pytestmark = pytest.mark.django_db

GIB = 1024 ** 3


def _sandbox_stop(flag: str, error: str) -> dict:
    return {"exit_status": None, "signal": 9, "hostname": "sge-exec1", "flags": [flag], "error": error,
            "sandbox": {"limits": {"memory_bytes": 4 * GIB, "work_bytes": 2 * GIB}, "work_bytes": 12345}}


@pytest.fixture
def stopped(ops_users):
    now = timezone.now()
    research = Team.objects.get(project="research")
    ended = now - dt.timedelta(minutes=3)
    campaign = make_campaign(team=research, user=ops_users["launcher"], name="hog", job_number=4100, status="done",
                             tasks=[
        {"state": "failed", "host": "sge-exec1", "failed_code": 0, "exit_status": 137, "ended_at": ended,
         "runner_record": _sandbox_stop("memory_limit", "memory limit 4 GiB reached")},
        {"state": "failed", "host": "sge-exec2", "failed_code": 0, "exit_status": 1,
         "ended_at": ended - dt.timedelta(minutes=1),
         "runner_record": _sandbox_stop("workdir_over_quota", "work directory (disk) limit 2 GiB reached")},
        {"state": "failed", "host": "sge-exec2", "failed_code": 37, "exit_status": 137,
         "ended_at": ended - dt.timedelta(minutes=2), "runner_record": None},
        # Not a limit: the agent's own failure, a finished task, a limit stop older than the window.
        {"state": "failed", "host": "sge-exec1", "failed_code": 0, "exit_status": 3, "ended_at": ended,
         "runner_record": {"exit_status": 3, "flags": [], "error": None}},
        {"state": "done", "host": "sge-exec1", "failed_code": 0, "exit_status": 0, "ended_at": ended},
        {"state": "failed", "host": "sge-exec1", "failed_code": 0, "exit_status": 137,
         "ended_at": now - dt.timedelta(days=2),
         "runner_record": _sandbox_stop("memory_limit", "memory limit 1 GiB reached")},
    ])
    return campaign, {t.task_number: t for t in Task.objects.filter(campaign=campaign)}


def test_limit_stopped_lists_the_limit_failures_newest_first_with_their_reason(stopped):
    campaign, tasks = stopped
    found = triage.limit_stopped(cluster=cluster_get_default())
    assert [t["task_id"] for t in found["tasks"]] == [tasks[1].pk, tasks[2].pk, tasks[3].pk]
    first = found["tasks"][0]
    assert first["reason"] == "memory limit 4 GiB reached"
    assert first["text"] == "memory limit 4 GiB reached on sge-exec1 (the sandbox stopped the agent; exit status 137)"
    assert (first["campaign_id"], first["team"], first["launcher"], first["job_number"], first["task_number"]) == (
        campaign.pk, "research", "launcher", 4100, 1)
    assert found["tasks"][1]["reason"] == "work directory (disk) limit 2 GiB reached"
    assert found["tasks"][2]["reason"] == "the qmaster enforced a limit (h_rt, h_cpu or h_vmem)"
    assert found["total"] == 3
    assert sorted((r["reason"], r["tasks"]) for r in found["reasons"]) == [
        ("memory limit 4 GiB reached", 1), ("the qmaster enforced a limit (h_rt, h_cpu or h_vmem)", 1),
        ("work directory (disk) limit 2 GiB reached", 1)]
    # A wider window takes in the old one; a narrower one only the newest.
    assert triage.limit_stopped(cluster=cluster_get_default(), window_s=3 * 86400)["total"] == 4
    assert triage.limit_stopped(cluster=cluster_get_default(), window_s=200)["total"] == 1
    assert len(triage.limit_stopped(cluster=cluster_get_default(), shown=1)["tasks"]) == 1


def test_the_triage_page_shows_them_with_the_reason(as_user, stopped, monkeypatch):
    from schedulers.fake import FakeScheduler

    monkeypatch.setattr("dashboards.core.clusters.scheduler_for", lambda cluster, **options: FakeScheduler())
    campaign, tasks = stopped
    html = as_user("admin").get("/ops/triage/").content.decode()
    section = html.split('id="limit-stopped"', 1)[1].split("</section>", 1)[0]
    assert "Stopped by a limit" in section and "(last 24 h)" in section
    rows = section.split("<tbody>", 1)[1].split("<tr ")[1:]
    assert len(rows) == 3
    assert f'data-task="{tasks[1].pk}"' in rows[0] and "memory limit 4 GiB reached on sge-exec1" in rows[0]
    assert f'href="/tasks/{tasks[1].pk}/"' in rows[0] and "4100.1" in rows[0] and "research" in rows[0]
    assert "1 task: memory limit 4 GiB reached" in section
    assert "exit status 3" not in section and "memory limit 1 GiB" not in section
    # Nothing stopped by a limit: no section.
    Task.objects.filter(campaign=campaign, state="failed").delete()
    assert 'id="limit-stopped"' not in as_user("admin").get("/ops/triage/").content.decode()
