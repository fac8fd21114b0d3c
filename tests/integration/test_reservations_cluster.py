"""Advance reservations and resource reservation on the real dev cluster (issue 17, items 1 and 3).

1. A launcher books a reservation on classic.q through tco (qrsub; agent.q takes only its projects'
   jobs, and SGE 8.1.9's qrsub has no -P, so it cannot be reserved) that starts about 45 s from now, launches a
   campaign into it (-ar), sees it pending with the reservation as the reason, and sees it start
   once the reservation starts (qacct's arid and start time say so, not tco).
2. classic.q has 2 slots on one host: a blocker takes one, a 2-slot PE job asks for a resource
   reservation (-R y), and a small job that would fit in the free slot stays pending; tco's
   reason (task page and triage) names the reserving job.
"""
from __future__ import annotations

import datetime as dt
import re
import subprocess
import time
import uuid

import pytest
from django.utils import timezone

from dashboards.launch import reservations
from dashboards.core.clusters import cluster_get_default, scheduler_for
from dashboards.ingest.cluster_status import cluster_status_refresh
from dashboards.ingest.poll import apply_qstat_poll
from dashboards.launch.service import LaunchRequest, launch
from dashboards.models import AgentDefinition, Campaign, Task, Team
from dashboards.launch.submit import campaign_submit
from tests.helpers import wait_until
from tests.support.cluster import qdel_quietly, qstat_jobs, SGE_ENV

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def run(argv: list[str]) -> str:
    out = subprocess.run(argv, capture_output=True, text=True, env={**SGE_ENV, "TZ": "UTC"}, timeout=60)
    assert out.returncode == 0, f"{argv}: {out.stderr or out.stdout}"
    return out.stdout


def poll() -> None:
    cluster = cluster_get_default()
    apply_qstat_poll(cluster, scheduler_for(cluster).list_tasks(), observed_at=timezone.now())
    cluster_status_refresh(cluster=cluster)


def qrstat_times(ar_id: int) -> tuple[dt.datetime, dt.datetime]:
    """start and end of a reservation from plain ``qrstat -ar ID`` (read here, not by tco's parser)."""
    text = run(["qrstat", "-ar", str(ar_id)])
    found = dict(re.findall(r"^(start_time|end_time)\s+(.+?)\s*$", text, re.M))
    assert len(found) == 2, text

    def parse(value: str) -> dt.datetime:
        for fmt in ("%m/%d/%Y %H:%M:%S", "%Y-%m-%d %H:%M:%S", "%Y-%m-%dT%H:%M:%S.%f"):
            try:
                return dt.datetime.strptime(value, fmt).replace(tzinfo=dt.timezone.utc)
            except ValueError:
                continue
        raise AssertionError(f"qrstat time {value!r}")
    return parse(found["start_time"]), parse(found["end_time"])


def qacct_fields(job: int) -> dict[str, str]:
    out = subprocess.run(["qacct", "-j", str(job)], capture_output=True, text=True, env={**SGE_ENV, "TZ": "UTC"},
                         timeout=30)
    return dict(re.findall(r"^(\w+)\s+(.*?)\s*$", out.stdout, re.M)) if out.returncode == 0 else {}


def test_a_campaign_in_a_reservation_waits_for_its_start_then_runs(sge_cluster, ops_users):
    research = Team.objects.get(project="research")
    # Far enough ahead for the checks made before it starts (asserted below), near enough not to wait long.
    start = (timezone.now() + dt.timedelta(seconds=45)).replace(microsecond=0)
    booked = reservations.book(user=ops_users["launcher"], request=reservations.BookRequest(
        team=research, name=f"it-ar-{uuid.uuid4().hex[:6]}", start=start, duration_s=300, queue="classic.q",
        seats=2))
    ar = booked.ar_id
    job = None
    try:
        qr_start, qr_end = qrstat_times(ar)
        assert qr_start == start and (qr_end - qr_start).total_seconds() == 300
        row = next(r for r in cluster_get_default().status["reservations"] if r["id"] == ar)
        assert row["team"] == "research" and row["booked_by"] == "launcher" and row["state"] == "waiting"
        assert row["resources"].get("anthropic_api") in ("2", "2.000000"), row

        agent = AgentDefinition.objects.get(name="demo-agent")
        outcome = launch(user=ops_users["launcher"], request=LaunchRequest(
            team=research, agent_definition=agent, name=f"in-ar-{uuid.uuid4().hex[:6]}",
            inputs=[{"task": 1, "duration_s": 1.0}], queue="classic.q", advance_reservation=ar))
        campaign = campaign_submit(campaign_id=outcome.campaign.pk)
        job = campaign.job_number
        assert campaign.status == "submitted", campaign.submit_error
        assert f"<JB_ar>{ar}</JB_ar>" in run(["qstat", "-j", str(job), "-xml"])

        def pending_task():
            poll()
            return Task.objects.filter(campaign=campaign, state="pending", active=True).first()
        task = wait_until(pending_task, 60, "the campaign's task pending in tco", 1.0)
        from dashboards.live.task import task_detail
        texts = [r["text"] for r in task_detail(ops_users["launcher"], task.pk)["pending_reasons"]]
        wanted = f"waits for advance reservation {ar} (team research), which starts at {qr_start:%H:%M} UTC (in "
        assert any(t.startswith(wanted) for t in texts), texts
        assert timezone.now() < qr_start  # still before the start: the reason was not a late guess

        # The reservation starts: the task runs in it (qacct: arid, a start not before the AR's).
        def accounted():
            fields = qacct_fields(job)
            return fields if fields.get("arid") else None
        fields = wait_until(accounted, 180, f"job {job} run and accounted", 2.0)
        assert int(fields["arid"]) == ar
        started = dt.datetime.strptime(fields["start_time"], "%a %b %d %H:%M:%S %Y").replace(tzinfo=dt.timezone.utc)
        assert started >= qr_start, (started, qr_start)
    finally:
        qdel_quietly(job)
        subprocess.run(["qrdel", str(ar)], capture_output=True, env=SGE_ENV)


def test_another_teams_reservation_is_refused_at_launch(sge_cluster, ops_users):
    research, engineering = Team.objects.get(project="research"), Team.objects.get(project="engineering")
    booked = reservations.book(user=ops_users["launcher"], request=reservations.BookRequest(
        team=research, name="it-ar-mine", start=timezone.now() + dt.timedelta(hours=2), duration_s=600,
        queue="classic.q", seats=1))
    try:
        from dashboards.core.errors import LaunchError
        agent = AgentDefinition.objects.get(name="demo-agent")
        with pytest.raises(LaunchError, match="booked for team"):
            launch(user=ops_users["other"], request=LaunchRequest(
                team=engineering, agent_definition=agent, name="it-ar-theirs", inputs=[{"task": 1}],
                queue="classic.q", advance_reservation=booked.ar_id))
        assert not Campaign.objects.filter(name="it-ar-theirs").exists()
        reservations.delete(user=ops_users["launcher"], cluster=cluster_get_default(), ar_id=booked.ar_id)
        assert str(booked.ar_id) not in run(["qrstat", "-u", "*"]).split()
    finally:
        subprocess.run(["qrdel", str(booked.ar_id)], capture_output=True, env=SGE_ENV)


def classic_slots() -> tuple[int, int]:
    """(used, total) slots of classic.q from ``qstat -g c`` (plain text, read here)."""
    for line in run(["qstat", "-g", "c"]).splitlines():
        parts = line.split()
        if parts and parts[0] == "classic.q":
            # CLUSTER QUEUE CQLOAD USED RES AVAIL TOTAL aoACDS cdsuE
            return int(parts[2]), int(parts[5])
    raise AssertionError("no classic.q in qstat -g c")


def test_small_jobs_wait_behind_a_resource_reservation_and_tco_names_it(sge_cluster, ops_users):
    wait_until(lambda: classic_slots()[0] == 0, 60, "classic.q idle", 1.0)
    assert "max_reservation 32" in " ".join(run(["qconf", "-ssconf"]).split())
    tag = uuid.uuid4().hex[:6]
    jobs: list[int] = []

    def qsub(*options: str, name: str) -> int:
        out = run(["qsub", "-terse", "-b", "y", "-o", "/dev/null", "-e", "/dev/null", "-N", name, "-q", "classic.q",
                   *options, "/bin/sleep", "120"])
        jobs.append(int(out.strip().split(".")[0]))
        return jobs[-1]

    try:
        blocker = qsub("-l", "h_rt=150", name=f"rr-blocker-{tag}")
        wait_until(lambda: "r" in qstat_jobs().get(blocker, {}).get("states", ""), 60, "the blocker running", 0.5)
        big = qsub("-pe", "smp", "2", "-R", "y", "-l", "h_rt=150", name=f"rr-big-{tag}")
        time.sleep(3)  # a few scheduling runs (schedule_interval 1 s): the big job reserves
        small = qsub("-l", "h_rt=3600", name=f"rr-small-{tag}")
        # It would fit in the free slot, yet it stays pending: the slot is reserved for the big job.
        for _ in range(6):
            time.sleep(1)
            assert "qw" in qstat_jobs().get(small, {}).get("states", ""), qstat_jobs().get(small)
            assert classic_slots() == (1, 2)
        assert re.search(r"^reserve:\s+y\s*$", run(["qstat", "-j", str(big)]), re.M)

        poll()
        status = cluster_get_default().status
        assert [j["job_number"] for j in status["reserving_jobs"]] == [big], status.get("reserving_jobs")
        wanted = f"slots on sge-exec3 are reserved for job {big} (-R y), which needs 2 slots"
        from dashboards.control.triage import triage_overview
        overview = {j["job_number"]: j for j in triage_overview(cluster=cluster_get_default())["jobs"]}
        assert wanted in [r["text"] for r in overview[small]["reasons"]], overview[small]["reasons"]
        assert overview[small]["group"]["kind"] == "reservation"
        assert any(r["text"].startswith("asked for a resource reservation (-R y)") for r in overview[big]["reasons"])
    finally:
        qdel_quietly(*jobs)
