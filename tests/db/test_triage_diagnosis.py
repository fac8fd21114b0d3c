"""Triage's diagnosis: the binding constraint heads a waiting job's group (a full queue instance before
the share tree), no action is offered that cannot move the jobs, and the share-tree line gives the
configured shares, the same on the triage page, the task page and in the assistant's answer."""
from __future__ import annotations

import datetime as dt
import re
from pathlib import Path

import pytest
from django.utils import timezone

from dashboards.core.clusters import cluster_get_default
from dashboards.models import Task
from schedulers.fake import FakeScheduler
from schedulers.gridengine.parsers.qstat_j import parse_job_detail
from schedulers.gridengine.parsers.sharetree import parse_share_mon

pytestmark = pytest.mark.django_db

SGE819 = Path(__file__).resolve().parents[1] / "fixtures" / "sge819"
FIRST, BEHIND = 70, 71


def _share_tree() -> list[dict]:
    """The captured sge_share_mon -n (research and engineering, 50 shares each), research's node as the
    demo showed it: no jobs counted (long_target_share 0) while it used 86% of the cluster."""
    tree = parse_share_mon((SGE819 / "sge_share_mon_n.txt").read_bytes())
    for node in tree:
        if node["project"] == "research":
            node.update(long_target_share=0.0, job_count=0, actual_share=0.86)
    return tree


@pytest.fixture
def waiting(ops_users, monkeypatch):
    """Job 70: first in line (the higher priority), pending behind the full classic.q (the captured
    qstat -j); job 71: behind it, the scheduler naming nothing but its place. Both research's."""
    from dashboards.core import scheduler_cache

    cluster = cluster_get_default()
    cluster.status = {"share_tree": _share_tree(), "quotas": [], "hosts": [], "global_capacity": {}}
    cluster.save()
    now = timezone.now()
    for job, priority, waited in ((FIRST, 0.6, 600), (BEHIND, 0.5, 300)):
        Task.objects.create(cluster=cluster, job_number=job, task_number=1, is_array=True, name=f"job{job}",
                            owner="tco", project="research", state="pending", priority=priority,
                            submitted_at=now - dt.timedelta(seconds=waited))
    captured = parse_job_detail((SGE819 / "qstat_j_pending_classic.xml").read_bytes())
    fake = FakeScheduler()
    fake.set_job_detail(FIRST, {**captured, "job_number": FIRST, "project": "research"})
    fake.set_job_detail(BEHIND, {**captured, "job_number": BEHIND, "project": "research", "scheduler_messages": [],
                                 "global_messages": [], "hard_queues": []})
    monkeypatch.setattr("dashboards.core.clusters.scheduler_for", lambda cluster, **options: fake)
    scheduler_cache.cache.clear()
    return cluster, fake


SHARE_LINE = ("team research has used 86% of the cluster lately, above the 50% its 50 of 100 share-tree shares "
              "give it, so its jobs get fewer tickets than other teams' waiting jobs")


def test_the_job_first_in_line_behind_a_full_queue_is_grouped_by_the_queue_without_a_priority_action(waiting):
    from dashboards.control import triage

    cluster, fake = waiting
    overview = triage.triage_overview(cluster=cluster, scheduler=fake)
    by_job = {j["job_number"]: j for j in overview["jobs"]}
    first = [r["text"] for r in by_job[FIRST]["reasons"]]
    assert first[0] == "queue instance classic.q@vm is full"
    assert "number 1 of 2 waiting jobs in the cluster's priority order" in first and SHARE_LINE in first
    assert by_job[FIRST]["group"] == {"key": "queue_full:classic.q", "kind": "queue_full",
                                      "label": "wait for a free slot in classic.q@vm, full"}
    # Behind another job, with nothing else named: the share tree is what orders it.
    assert by_job[BEHIND]["group"]["kind"] == "share_tree"
    groups = {g["key"]: g for g in triage.triage_groups(overview["jobs"])}
    full = groups["queue_full:classic.q"]
    assert full["title"] == "1 task waits for a free slot in classic.q@vm, full"
    assert full["action"]["action"] == "" and "qconf -mq" in full["action"]["why"]
    assert groups["share_tree"]["action"]["action"] == "priority"


def test_the_triage_page_offers_no_raise_for_the_full_queue_and_never_a_zero_target(client, ops_users, waiting):
    client.force_login(ops_users["admin"])
    html = client.get("/ops/triage/").content.decode()
    group = html.split('data-group="queue_full:classic.q"', 1)[1].split("</div>", 1)[0]
    assert "1 task waits for a free slot in classic.q@vm, full" in group
    assert "No action in tco moves these" in group and "Raise the priority" not in group
    row = html.split(f'<tr data-job="{FIRST}"', 1)[1].split("</tr>", 1)[0]
    reasons = re.findall(r"<li title=\"[^\"]*\">([^<]*)</li>", row)
    assert reasons[0] == "queue instance classic.q@vm is full"
    assert "target of 0%" not in html and "share-tree target" not in html
    assert SHARE_LINE.replace("'", "&#x27;") in row


def test_the_task_page_and_the_assistant_say_the_same_share_tree_line(ops_users, waiting):
    from assistant import views as assistant_views
    from dashboards.live import task as live_task

    row = Task.objects.get(job_number=FIRST)
    page = [r["text"] for r in live_task.task_detail(ops_users["admin"], row.pk)["pending_reasons"]]
    answer = [r["text"] for r in assistant_views.why_pending(ops_users["admin"], f"{FIRST}.1")["reasons"]]
    assert page[0] == answer[0] == "queue instance classic.q@vm is full"
    assert SHARE_LINE in page and SHARE_LINE in answer
    assert not any("target of 0%" in t for t in page + answer)


def test_a_closed_instance_and_a_host_resource_shortage_are_their_own_groups():
    from dashboards.control.triage import GROUP_ACTIONS, _group_of

    def group(*texts):
        return _group_of({"errors": 0, "held": 0, "reasons": [{"text": t} for t in texts]}, None)

    closed = group("queue instance agent.q@node02 is unavailable (exec host down or not reporting)",
                   "number 1 of 4 waiting jobs in the cluster's priority order")
    assert closed["kind"] == "queue" and GROUP_ACTIONS["queue"][0] == ""
    short = group("host node01 has only 2.000G h_vmem free, 4G requested")
    assert short == {"key": "resource:h_vmem", "kind": "resource", "label": "wait for h_vmem on a host or queue"}
    # Behind others with its team above its share: the share tree, whose raise can help.
    behind = group("number 3 of 4 waiting jobs in the cluster's priority order", SHARE_LINE)
    assert behind["kind"] == "share_tree" and GROUP_ACTIONS["share_tree"][0] == "priority"
    # First in line, nothing else named: its share is not what holds it back.
    first = group("number 1 of 4 waiting jobs in the cluster's priority order", SHARE_LINE)
    assert first == {"key": "next", "kind": "next", "label": "are first in the priority order"}
    assert GROUP_ACTIONS["next"][0] == ""
