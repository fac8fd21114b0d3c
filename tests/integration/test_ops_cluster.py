"""Bills against the real qacct, campaign control and hostile input on the real dev cluster."""
from __future__ import annotations

import datetime as dt
import re
import shutil
import subprocess
import uuid
from decimal import Decimal

import pytest
from django.conf import settings
from django.test import Client
from django.utils import timezone

import zoneinfo
from dashboards.billing import bills
from dashboards.billing import periods
from dashboards.control import actions
from dashboards.launch.service import LaunchRequest, launch
from dashboards.models import AccountingRecord, AgentDefinition, AuditEntry, Budget, Campaign, Cluster, Task, Team
from dashboards.launch.submit import campaign_submit
from dashboards.core.clusters import cluster_get_default, scheduler_for
from tests.helpers import wait_until
from tests.support.cluster import job_gone_or_deleting, qdel_quietly, qstat_jobs, SGE_ENV
from dashboards.ingest.poll import apply_qstat_poll
from dashboards.ingest.accounting import ingest_accounting

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

def qstat_task_states(job_number: int) -> dict[int, str]:
    """task number -> state letters of one array job, from ``qstat -g d`` (each task on its own)."""
    out = subprocess.run(["qstat", "-xml", "-u", "*", "-g", "d"], capture_output=True, text=True, check=True,
                         env={**SGE_ENV, "TZ": "UTC"}).stdout
    states = {}
    for block in re.findall(r"<job_list[^>]*>(.*?)</job_list>", out, re.S):
        if f"<JB_job_number>{job_number}</JB_job_number>" not in block:
            continue
        state = re.search(r"<state>([^<]*)</state>", block).group(1)
        tasks = re.search(r"<tasks>([^<]*)</tasks>", block)
        for n in _expand(tasks.group(1) if tasks else "1"):
            states[n] = state
    return states


def _expand(text: str) -> list[int]:
    numbers = []
    for part in text.split(","):
        m = re.fullmatch(r"(\d+)(?:-(\d+)(?::(\d+))?)?", part.strip())
        first, last, step = int(m.group(1)), int(m.group(2) or m.group(1)), int(m.group(3) or 1)
        numbers.extend(range(first, last + 1, step))
    return numbers


# ----------------------------------------------------------------------------- bills = qacct

def qacct_wallclock(accounting: str, project: str, begin: str, end: str, tz: str) -> float:
    """WALLCLOCK of ``qacct -f FILE -P PROJECT -b BEGIN -e END`` run in time zone ``tz`` (0 when it lists none)."""
    out = subprocess.run(["qacct", "-f", accounting, "-P", project, "-b", begin, "-e", end],
                         capture_output=True, text=True, env={**SGE_ENV, "TZ": tz}, timeout=60)
    assert out.returncode == 0, out.stderr
    for line in out.stdout.splitlines():
        parts = line.split()
        if parts and parts[0] == project:
            return float(parts[1])
    return 0.0


def run_small_campaign(user, team: Team, name: str, count: int = 2) -> Campaign:
    agent = AgentDefinition.objects.get(name="demo-agent")
    outcome = launch(user=user, request=LaunchRequest(team=team, agent_definition=agent, name=name,
                                                inputs=[{"task": n, "duration_s": 1.0} for n in range(1, count + 1)]))
    campaign = campaign_submit(campaign_id=outcome.campaign.pk)
    assert campaign.status == "submitted", campaign.submit_error
    return campaign


def test_the_bill_wallclock_per_team_equals_qacct_for_every_period_and_time_zone(bootstrap, ops_users, tmp_path):
    research = Team.objects.get(project="research")
    engineering = Team.objects.get(project="engineering")
    jobs = [run_small_campaign(ops_users["launcher"], research, "bill-r").job_number,
            run_small_campaign(ops_users["admin"], engineering, "bill-e").job_number]
    accounting = cluster_get_default().accounting_path

    def written() -> bool:
        text = open(accounting, errors="replace").read()
        return all(len(re.findall(rf"^[^:]*:[^:]*:[^:]*:[^:]*:[^:]*:{job}:", text, re.M)) == 2 for job in jobs)

    wait_until(written, 120, "the accounting records of both campaigns")
    # A snapshot: other suites keep writing to the cluster's file, and qacct and the bill must read the same lines.
    snapshot = tmp_path / "accounting"
    shutil.copyfile(accounting, snapshot)
    cluster = cluster_get_default()
    result = ingest_accounting(cluster, path=str(snapshot), time_budget_s=300)
    assert AccountingRecord.objects.filter(job_number__in=jobs).count() == 4, result
    started = AccountingRecord.objects.filter(started_at__isnull=False)
    first_start = min(started.values_list("started_at", flat=True))
    last_start = max(started.values_list("started_at", flat=True))

    zones = ["UTC", "America/New_York", "Asia/Kolkata", "Pacific/Kiritimati"]
    # A zone whose local midnight falls inside the span of the records, so a day boundary splits them.
    middle = first_start + (last_start - first_start) / 2
    if last_start - first_start >= dt.timedelta(hours=2):
        offset = -round(middle.hour + middle.minute / 60) % 24  # hours east of UTC that put `middle` at 00:00
        offset = offset - 24 if offset > 12 else offset
        zones.append(f"Etc/GMT{'-' if offset >= 0 else '+'}{abs(offset)}")  # Etc/ signs are inverted
    checked = nonzero = 0
    for tz_name in zones:
        Cluster.objects.filter(pk=cluster.pk).update(time_zone=tz_name)
        tz = zoneinfo.ZoneInfo(tz_name)
        first = (first_start.astimezone(tz) - dt.timedelta(days=1)).date()
        last = (last_start.astimezone(tz) + dt.timedelta(days=1)).date()
        for period in ("day", "week", "month") if tz_name == "America/New_York" else ("day",):
            bill = bills.bill(teams=[research, engineering], period=period, first=first, last=last)
            # tco's line and, apart, the jobs tco did not launch under the project: together what qacct -P counts.
            ours: dict = {}
            for r in bill["rows"]:
                ours[(r["period"], r["project"])] = ours.get((r["period"], r["project"]), 0.0) + r["wallclock_s"]
            start = bill["first"]
            while start <= bill["last"]:
                begin, end = periods.period_bounds(start, period, tz)
                for project in ("research", "engineering"):
                    theirs = qacct_wallclock(str(snapshot), project, periods.qacct_time(begin, tz),
                                             periods.qacct_time(end - dt.timedelta(seconds=1), tz), tz_name)
                    mine = ours.get((start, project), 0.0)
                    assert round(mine) == round(theirs), (tz_name, period, start, project, mine, theirs)
                    checked += 1
                    nonzero += theirs > 0
                start = periods.next_period_start(start, period)
    assert checked >= 12 and nonzero >= 6, (checked, nonzero)
    # The campaigns just run are in today's bill (UTC) with their tasks.
    Cluster.objects.filter(pk=cluster.pk).update(time_zone="UTC")
    today = timezone.now().date()
    bill = bills.bill(teams=[research], period="day", first=today, last=today, group_by="campaign")
    labels = {r["label"] for r in bill["rows"]}
    assert any(label.startswith("bill-r (#") for label in labels)


def test_period_boundaries_match_qacct_to_the_second(bootstrap, tmp_path):
    """Real accounting lines moved to start one second before, at and after local midnights
    (a month start, both DST changes, a Monday), read by the real qacct and by the bill."""
    source = [line for line in open(cluster_get_default().accounting_path, errors="replace").read().splitlines()
              if line and not line.startswith("#") and line.split(":")[9] != "0"
              and float(line.split(":")[13]) > 0][:3]
    assert source, "the dev cluster's accounting file has no record yet"
    tz_name = "America/New_York"
    tz = zoneinfo.ZoneInfo(tz_name)
    boundaries = [periods.local_midnight(day, tz) for day in
                  (dt.date(2026, 2, 1), dt.date(2026, 2, 2), dt.date(2026, 3, 8), dt.date(2026, 3, 9),
                   dt.date(2026, 11, 1), dt.date(2026, 11, 2))]
    lines, job = [], 9_000_000
    for boundary in boundaries:
        for delta in (-1, 0, 1):
            for raw in source:
                fields = raw.split(":")
                start = int(fields[9])
                shift = int(boundary.timestamp()) + delta - start
                for i in (8, 9, 10):  # submission, start, end
                    fields[i] = str(int(fields[i]) + shift)
                fields[5] = str(job)
                fields[31] = "research"
                job += 1
                lines.append(":".join(fields))
    synthetic = tmp_path / "accounting"
    synthetic.write_text("# Version: 8.1.9\n" + "\n".join(lines) + "\n")
    cluster = Cluster.objects.create(name="boundaries", sge_root=settings.SGE_ROOT, accounting_path=str(synthetic),
                                     time_zone=tz_name)
    ingest_accounting(cluster, path=str(synthetic))
    assert AccountingRecord.objects.filter(cluster=cluster).count() == len(lines)
    research = Team.objects.get(project="research")
    compared = 0
    for period in ("day", "week", "month"):
        bill = bills.bill(teams=[research], period=period, first=dt.date(2026, 1, 25), last=dt.date(2026, 11, 8),
                            clusters=[cluster])
        ours = {r["period"]: r["wallclock_s"] for r in bill["rows"]}
        starts = {periods.period_start((b + dt.timedelta(seconds=d)).astimezone(tz).date(), period)
                  for b in boundaries for d in (-1, 0, 1)}
        for start in sorted(starts):
            begin, end = periods.period_bounds(start, period, tz)
            theirs = qacct_wallclock(str(synthetic), "research", periods.qacct_time(begin, tz),
                                     periods.qacct_time(end - dt.timedelta(seconds=1), tz), tz_name)
            assert round(ours.get(start, 0.0)) == round(theirs), (period, start, ours.get(start), theirs)
            compared += 1
        assert sum(ours.values()) == pytest.approx(sum(float(l.split(":")[13]) for l in lines))
    assert compared >= 15


# ----------------------------------------------------------------------------- control

def poll(cluster) -> None:
    apply_qstat_poll(cluster, scheduler_for(cluster).list_tasks(), observed_at=timezone.now())


def test_pause_resume_and_cancel_hold_release_and_delete_on_the_real_cluster(bootstrap, ops_users):
    cluster = cluster_get_default()
    research = Team.objects.get(project="research")
    agent = AgentDefinition.objects.get(name="demo-agent")
    campaign = launch(user=ops_users["launcher"], request=LaunchRequest(team=research, agent_definition=agent, name="ctl-real", concurrency_cap=1,
        inputs=[{"task": n, "duration_s": 60.0} for n in range(1, 4)])).campaign
    campaign = campaign_submit(campaign_id=campaign.pk)
    job = campaign.job_number
    try:
        def first_running():
            poll(cluster)
            return Task.objects.filter(campaign=campaign, state="running").exists()

        wait_until(first_running, 60, "task 1 running")
        entry = actions.campaign_control(user=ops_users["launcher"], campaign=campaign, action="pause")
        entry = actions.control_execute(request_id=entry.pk)
        assert entry.ok, entry.result
        states = qstat_task_states(job)
        running = [n for n, s in states.items() if "r" in s]
        assert running and all(states[n] == "hqw" for n in states if n not in running), states

        poll(cluster)
        entry = actions.campaign_control(user=ops_users["launcher"], campaign=campaign, action="resume")
        assert actions.control_execute(request_id=entry.pk).ok
        states = qstat_task_states(job)
        assert all(s in ("qw", "r", "t") for s in states.values()), states

        entry = actions.campaign_control(user=ops_users["urgent"], campaign=campaign, action="cancel")
        assert actions.control_execute(request_id=entry.pk).ok
        wait_until(lambda: job_gone_or_deleting(job), 30, "the job deleted")
        assert AuditEntry.objects.filter(action__in=["campaign_pause", "campaign_resume", "campaign_cancel"],
                                         ok=True).count() == 3
    finally:
        qdel_quietly(job)


def test_predecessor_and_budget_hold_reach_the_scheduler(bootstrap, ops_users):
    research = Team.objects.get(project="research")
    agent = AgentDefinition.objects.get(name="demo-agent")
    first = second = None
    try:
        first = launch(user=ops_users["launcher"], request=LaunchRequest(team=research, agent_definition=agent, name="pred-a",
            inputs=[{"task": n, "duration_s": 30.0} for n in (1, 2)])).campaign
        first = campaign_submit(campaign_id=first.pk)
        Budget.objects.create(team=research, period="day", amount_usd=Decimal("1"), thresholds=[1.0],
                              on_exceed="hold")
        second = launch(user=ops_users["launcher"], request=LaunchRequest(team=research, agent_definition=agent, name="pred-b",
            predecessor_job=first.job_number, cost_cap_usd=Decimal("5"),
            inputs=[{"task": n} for n in (1, 2)]))
        assert second.held_for_budget
        second = campaign_submit(campaign_id=second.campaign.pk)
        assert second.status == "submitted", second.submit_error
        detail = scheduler_for(cluster_get_default()).job_detail(second.job_number)
        assert first.job_number in detail["predecessors"]
        # SGE 8.1.9's qstat -j -xml lists no hold ranges for tasks not yet enrolled; qstat's letters show it.
        assert set(qstat_task_states(second.job_number).values()) == {"hqw"}
        assert "Job is in hold state" in detail["scheduler_messages"]
    finally:
        qdel_quietly(second.job_number if second else None, first.job_number if first else None)


# ----------------------------------------------------------------------------- hostile input

MARKER = "hostile" + uuid.uuid4().hex[:6]


def test_hostile_input_on_every_form_leaves_the_scheduler_untouched(bootstrap, ops_users):
    from tests.support.forms import HOSTILE, launch_data

    before = qstat_jobs()
    client = Client()
    client.force_login(ops_users["launcher"])
    for overrides, _field in HOSTILE:
        if overrides.get("team") == "engineering":
            overrides = {"team": Team.objects.get(project="engineering").pk}
        data = launch_data(**{"name": MARKER, **overrides})
        if "name" in overrides:
            data["name"] = overrides["name"] + MARKER
        for button in ("preview", "launch"):
            assert client.post("/ops/launch/", {**data, button: "1"}).status_code == 200
    # Urgent agents: a launcher may not, and an urgent launcher's bad input is refused.
    urgent = {"agent_definition": AgentDefinition.objects.get(name="demo-agent").pk,
              "team": Team.objects.get(project="research").pk, "queue": "agent.q", "seats_per_task": "1",
              "model": "", "name": MARKER, "input": '{"task": 1}'}
    assert client.post("/ops/urgent/", urgent).status_code == 403
    client.force_login(ops_users["urgent"])
    for bad in ({"name": f"-u root{MARKER}"}, {"queue": "agent.q -u root"}, {"seats_per_task": "-4"},
                {"input": "not json"}, {"team": Team.objects.get(project="engineering").pk}):
        assert client.post("/ops/urgent/", {**urgent, **bad}).status_code == 200
    # Triage: non-admins are refused; admins' bad job numbers, tasks and priorities are refused.
    for bad in ({"job_number": "1 -u root"}, {"job_number": "-5"}, {"tasks": "1;rm -rf /"},
                {"action": "priority", "priority": "100000"}, {"action": "qconf -km"}):
        post = {"action": "delete", "job_number": "1", "tasks": "", "priority": "", "confirm": "True", **bad}
        assert client.post("/ops/triage/action", post).status_code == 403
        client.force_login(ops_users["admin"])
        assert client.post("/ops/triage/action", post).status_code in (302, 400)
        client.force_login(ops_users["urgent"])
    # The service layer refuses the same, and the adapter refuses a hostile spec before DRMAA.
    from schedulers.base import ArrayJobSpec
    from schedulers.base import InvalidSubmission

    scheduler = scheduler_for(cluster_get_default())
    for name, queue, project in ((f"-u root {MARKER}", "agent.q", "research"), (MARKER, "agent.q -u root", "research"),
                                 (MARKER, "agent.q", "research -u root"), (f"{MARKER}\n-l h_rt=1", "agent.q", "x")):
        spec = ArrayJobSpec(name=name, command="/bin/true", args=[], count=1, queue=queue, project=project,
                            resources={}, environment={}, working_directory="/tmp", output_path="/tmp",
                            error_path="/tmp")
        with pytest.raises(InvalidSubmission):
            scheduler.submit_array(spec)
    for bad in (("delete", -1, None, None), ("priority", 1, None, 5000), ("qconf", 1, None, None),
                ("hold", 1, [0], None)):
        with pytest.raises(InvalidSubmission):
            scheduler.control(*bad)

    assert not Campaign.objects.exists()
    assert not AuditEntry.objects.filter(ok=True).exists()
    assert not AuditEntry.objects.filter(params__status="queued").exists()
    after = qstat_jobs()
    new = {n: j for n, j in after.items() if n not in before}
    assert not [j for j in after.values() if MARKER in j["name"]], after
    assert not [j for j in new.values() if j["owner"] == "root" or j["project"] not in ("research", "engineering", "")]
