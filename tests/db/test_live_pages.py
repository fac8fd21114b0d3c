"""The data behind the live pages: share tree, queue-depth history, bounded queries, the agent page."""
from __future__ import annotations

import datetime as dt
import json
import re
from pathlib import Path

import pytest
from django.utils import timezone

from dashboards.live import campaign as live_campaign
from dashboards.live import queue
from dashboards.models import Team
from dashboards.core.clusters import cluster_get_default
from dashboards.ingest.cluster_status import cluster_status_refresh
from schedulers.base import SchedulerParseError
from schedulers.fake import FakeScheduler
from schedulers.gridengine.parsers.sharetree import parse_share_mon

from tests.support.campaigns import DEMO_PASSWORD, make_campaign

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def test_it_parses_the_share_tree_of_sge_8():
    nodes = parse_share_mon((FIXTURES / "sge819" / "sge_share_mon_n.txt").read_bytes())
    assert [n["node"] for n in nodes] == ["/", "/research", "/engineering"]
    research = nodes[1]
    assert research["project"] == "research" and research["user"] is None
    assert research["shares"] == 50 and isinstance(research["shares"], int)
    assert 0 <= research["actual_share"] <= 1 and research["level_share"] == 0.5
    assert nodes[0]["project"] is None


def test_a_share_tree_line_that_is_not_a_number_is_an_error():
    with pytest.raises(SchedulerParseError, match="shares"):
        parse_share_mon(b"node_name=/x\tshares=many\n")
    with pytest.raises(SchedulerParseError, match="node_name"):
        parse_share_mon(b"shares=1\n")


@pytest.mark.django_db
def test_the_status_poll_stores_the_share_tree():
    cluster = cluster_get_default()
    fake = FakeScheduler()
    fake.capacity = {"anthropic_api": 96.0}
    fake.queue_rows = [{"name": "agent.q", "load": None, "used": 0, "resv": 0, "available": 4, "total": 4,
                        "temp_disabled": 0, "manual_intervention": 0}]
    cluster_status_refresh(cluster=cluster, scheduler=fake)
    cluster.refresh_from_db()
    assert [n["node"] for n in cluster.status["share_tree"]] == ["/", "/engineering", "/research"]
    assert cluster.status["global_capacity"] == {"anthropic_api": 96.0}
    assert [q["name"] for q in cluster.status["queues"]] == ["agent.q"]


# --------------------------------------------------------------------------- depth history

# --------------------------------------------------------------------------- bounded work

@pytest.mark.django_db
@pytest.mark.usefixtures("fast_passwords", "locmem_cache")
def test_the_queue_summary_costs_the_same_queries_for_many_campaigns(role_users, django_assert_max_num_queries):
    research = Team.objects.get(project="research")
    for n in range(40):
        make_campaign(team=research, user=role_users["admin"], name=f"c{n}", job_number=100 + n,
                      status="finished" if n % 2 else "submitted",
                      tasks=[{"state": "done", "ended_at": timezone.now()}, {"state": "pending"}])
    queue.queue_summary(role_users["viewer"])  # warm the finished campaigns' cache
    # 12 for the summary, 5 for the audience's landing tiles (live.tiles: task counts, the oldest pending,
    # the last hour's ends, its newest failure, the clusters), whatever the number of campaigns.
    with django_assert_max_num_queries(12 + 5):
        summary = queue.queue_summary(role_users["viewer"])
    assert len(summary["campaigns"]) == 25 and summary["campaigns_page"]["pages"] == 2
    with django_assert_max_num_queries(14 + 5):
        queue.queue_summary(role_users["admin"])


@pytest.mark.django_db
@pytest.mark.usefixtures("fast_passwords", "locmem_cache")
def test_a_campaign_page_reads_one_page_of_tasks(role_users, django_assert_max_num_queries):
    research = Team.objects.get(project="research")
    campaign = make_campaign(team=research, user=role_users["admin"], name="big",
                             tasks=[{"state": "failed" if n % 50 == 0 else "pending"} for n in range(1, 1001)])
    with django_assert_max_num_queries(8):
        detail = live_campaign.campaign_detail(role_users["viewer"], campaign.pk, page=1)
    assert len(detail["tasks"]) == 100 and detail["pages"] == 10
    assert [t["state"] for t in detail["tasks"][:20]] == ["failed"] * 20
    assert detail["tasks"][20]["task_number"] == 1
    last = live_campaign.campaign_detail(role_users["viewer"], campaign.pk, page=10)
    assert last["tasks"][-1]["task_number"] == 999


# --------------------------------------------------------------------------- agent page

@pytest.mark.django_db
@pytest.mark.usefixtures("fast_passwords", "locmem_cache")
def test_the_agent_page_shows_logs_outputs_policy_and_accounting(client, role_users, settings):
    research = Team.objects.get(project="research")
    t0 = dt.datetime(2026, 11, 2, 9, 0, tzinfo=dt.timezone.utc)
    campaign = make_campaign(team=research, user=role_users["admin"], name="agentpage", job_number=77,
                             policy="version: 1\nnetwork_policies: {}\n", tasks=[{
                                 "state": "done", "exit_status": 0, "failed_code": 0, "host": "vm",
                                 "task_started_at": t0, "agent_started_at": t0 + dt.timedelta(seconds=1),
                                 "agent_exited_at": t0 + dt.timedelta(seconds=4),
                                 "teardown_done_at": t0 + dt.timedelta(seconds=4.5), "ended_at": t0}])
    task = campaign.tasks.get()
    spool = Path(settings.TCO_SPOOL_DIR)
    records = spool / "records" / str(campaign.pk)
    records.mkdir(parents=True)
    (records / "1.stdout").write_text("demo agent (stand-in): task 1 answered 42\n")
    (records / "1.stderr").write_text("")
    work = spool / "work" / str(campaign.pk) / "1"
    work.mkdir(parents=True)
    (work / "result.json").write_text(json.dumps({"answer": 42}))
    task.runner_record = {"stdout_path": str(records / "1.stdout"), "stderr_path": str(records / "1.stderr"),
                          "exit_status": 0, "flags": [], "hostname": "vm"}
    task.save()
    from dashboards.models import AccountingRecord

    AccountingRecord.objects.create(cluster=task.cluster, task=task, job_number=77, task_number=1,
                                    submission_us=1, start_us=2, end_us=3, job_name="x", owner="tco", group="tco",
                                    queue="agent.q", hostname="vm", wallclock_s=4.5, cpu_s=0.1,
                                    maxvmem_bytes=1e6, failed=0, exit_status=0)
    assert client.login(username="viewer", password=DEMO_PASSWORD)
    page = client.get(f"/tasks/{task.pk}/").content.decode()
    detail = json.loads(page.split('<script id="initial-task" type="application/json">')[1].split("</script>")[0])
    assert detail["stdout"]["text"].startswith("demo agent") and detail["stdout"]["path"].endswith("1.stdout")
    assert detail["outputs"]["files"] == [{"name": "result.json", "size": 14}]
    assert detail["policy"] == {"text": "version: 1\nnetwork_policies: {}\n", "source": "campaign"}
    assert detail["accounting"][0]["wallclock_s"] == 4.5 and detail["scheduler"] is None
    assert detail["stages"]["agent_work"] == 3.0 and detail["stages"]["integration_overhead"] == 1.5
    # The hashed name once collectstatic has run (issue 16, bug 15), else the plain one.
    assert re.search(r'/static/plotly/plotly\.min(\.[0-9a-f]{12})?\.js"', page)


@pytest.mark.django_db
@pytest.mark.usefixtures("fast_passwords", "locmem_cache")
def test_a_rejected_campaign_without_tasks_still_has_a_page(client, role_users):
    research = Team.objects.get(project="research")
    campaign = make_campaign(team=research, user=role_users["admin"], name="nope", status="rejected", tasks=[],
                             submit_error="qsub: unknown queue")
    campaign.task_count = 3
    campaign.save()
    assert client.login(username="viewer", password=DEMO_PASSWORD)
    response = client.get(f"/campaigns/{campaign.pk}/")
    assert response.status_code == 200 and "qsub: unknown queue" in response.content.decode()
    assert client.get(f"/campaigns/{campaign.pk}/?page=99&state=bogus").status_code == 200
