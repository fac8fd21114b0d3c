"""Issue 16, the admin's and viewer's parts: bugs 2, 3, 4, 5, 9, 11, 13, 14 and the triage, audit
and agent pages. Each bug test fails without its fix."""
from __future__ import annotations

import datetime as dt
import re

import pytest
from django.utils import timezone

from dashboards.core.clusters import cluster_get_default
from dashboards.ingest.poll import apply_qstat_poll
from dashboards.models import Campaign, Task, Team
from schedulers.base import QstatTask

# The stylesheet, by its plain name or by its hashed name after collectstatic (tco_web/static_storage.py).
TCO_CSS = re.compile(r"css/tco(\.[0-9a-f]{12})?\.css")

pytestmark = pytest.mark.django_db

T0 = dt.datetime(2026, 11, 29, 12, 0, 0, tzinfo=dt.timezone.utc)


def qtask(job: int, task: int | None, code: str, state: str, *, host: str | None = None,
          submitted_at=T0, priority: float = 0.5) -> QstatTask:
    return QstatTask(job_number=job, task_number=task, name="tco-inst1-c1-demo", owner="tco", project="research",
                     state=state, state_code=code, restarted=False,
                     queue="agent.q" if host else None, host=host, slots=1,
                     submitted_at=submitted_at, started_at=T0 + dt.timedelta(seconds=5) if host else None,
                     priority=priority)


@pytest.fixture
def team_and_user(bootstrap, django_user_model):
    from dashboards.core.accounts import team_ensure

    team = team_ensure(name="research", project="research")
    user = django_user_model.objects.create_user("launcher1")
    return team, user


# --------------------------------------------------------------------------- bug 5

def test_bug5_campaign_status_follows_its_tasks_running_paused_submitted_finished(team_and_user):
    from tests.support.campaigns import make_campaign

    team, user = team_and_user
    cluster = cluster_get_default()
    campaign = make_campaign(team=team, user=user, name="c5", job_number=505, tasks=[{}, {}])
    apply_qstat_poll(cluster, [qtask(505, 1, "r", "running", host="vm"), qtask(505, 2, "qw", "pending")],
                     observed_at=T0)
    assert Campaign.objects.get(pk=campaign.pk).status == "running"
    # The running task went back to the queue (rescheduled) and the other is held: nothing runs, all held.
    apply_qstat_poll(cluster, [qtask(505, 1, "hqw", "held"), qtask(505, 2, "hqw", "held")],
                     observed_at=T0 + dt.timedelta(seconds=1))
    assert Campaign.objects.get(pk=campaign.pk).status == "paused"
    apply_qstat_poll(cluster, [qtask(505, 1, "qw", "pending"), qtask(505, 2, "qw", "pending")],
                     observed_at=T0 + dt.timedelta(seconds=2))
    assert Campaign.objects.get(pk=campaign.pk).status == "submitted"


def test_bug5_a_running_or_paused_campaign_can_still_be_controlled_and_finished(team_and_user):
    from dashboards.ingest.campaign_status import finish_campaigns
    from dashboards.models import CAMPAIGN_TRANSITIONS

    for state in ("running", "paused"):
        assert "finished" in CAMPAIGN_TRANSITIONS[state]
    from tests.support.campaigns import make_campaign

    team, user = team_and_user
    campaign = make_campaign(team=team, user=user, name="c5b", job_number=506, status="running",
                             tasks=[{"state": "done"}])
    finish_campaigns({campaign.pk})
    assert Campaign.objects.get(pk=campaign.pk).status == "finished"


# --------------------------------------------------------------------------- bug 2

def test_bug2_a_poll_replaces_tcos_late_submission_time_with_the_schedulers(team_and_user):
    from tests.support.campaigns import make_campaign

    team, user = team_and_user
    cluster = cluster_get_default()
    drmaa_returned = T0 + dt.timedelta(seconds=1.766)  # tco's time: DRMAA returned after the qmaster's submit
    campaign = make_campaign(team=team, user=user, name="c2", job_number=202,
                             tasks=[{"submitted_at": drmaa_returned}])
    apply_qstat_poll(cluster, [qtask(202, 1, "qw", "pending", submitted_at=T0 + dt.timedelta(seconds=1))],
                     observed_at=T0 + dt.timedelta(seconds=2))
    task = Task.objects.get(campaign=campaign)
    assert task.submitted_at == T0 + dt.timedelta(seconds=1)


def test_bug2_queue_wait_is_never_negative_and_submit_ends_where_queue_wait_begins(team_and_user):
    from dashboards.core.stages import task_stages, timeline
    from tests.support.campaigns import make_campaign

    team, user = team_and_user
    submitted = T0 + dt.timedelta(seconds=1.766)
    started = T0 + dt.timedelta(seconds=1)  # the runner started before DRMAA returned to tco
    campaign = make_campaign(team=team, user=user, name="c2b", job_number=203, launched_at=T0,
                             tasks=[{"submitted_at": submitted, "state": "running", "task_started_at": started}])
    Campaign.objects.filter(pk=campaign.pk).update(submitted_at=submitted)
    task = Task.objects.select_related("campaign").get(campaign=campaign)
    assert task_stages(task)["queue_wait"] == 0.0
    assert task.queue_wait_s == 0.0
    segments = {s["stage"]: s for s in timeline(task)}
    assert segments["queue_wait"]["seconds"] >= 0
    assert segments["submit"]["end"] <= segments["queue_wait"]["start"]
    assert segments["submit"]["seconds"] == pytest.approx(1.0)


# --------------------------------------------------------------------------- bugs 3, 4, 9



def _done_priority(admin, job_number: int, priority: int):
    from dashboards.models import AuditEntry, ControlRequest

    entry = AuditEntry.objects.create(user=admin, action="triage_priority", target=f"job:{job_number}",
                                      params={"job_number": job_number, "priority": priority, "status": "done"},
                                      ok=True, result=f"priority set: job {job_number} tasks all")
    return ControlRequest.objects.create(user=admin, audit=entry, cluster=cluster_get_default(),
                                         action="triage_priority", control="priority", job_number=job_number,
                                         priority=priority, state="done", finished_at=timezone.now())


def test_bug3_two_waiting_jobs_get_two_places_and_a_lowered_one_goes_last(ops_users):
    from dashboards.core.scheduler_cache import pending_positions

    cluster = cluster_get_default()
    # Equal JAT_prio (the scheduler has not re-weighed them yet); 301 submitted first.
    apply_qstat_poll(cluster, [qtask(301, 1, "qw", "pending", priority=0.0),
                               qtask(302, 1, "qw", "pending", priority=0.0,
                                     submitted_at=T0 + dt.timedelta(seconds=3))], observed_at=T0)
    texts = {job: reasons[0]["text"] for job, reasons in pending_positions(cluster, {301: None, 302: None},
                                                                                       user=ops_users["admin"]).items()}
    assert texts == {301: "number 1 of 2 waiting jobs in the cluster's priority order",
                     302: "number 2 of 2 waiting jobs in the cluster's priority order"}
    _done_priority(ops_users["admin"], 301, -100)
    texts = {job: reasons[0]["text"] for job, reasons in pending_positions(cluster, {301: None, 302: None},
                                                                                       user=ops_users["admin"]).items()}
    assert texts[301].startswith("number 2 of 2") and texts[302].startswith("number 1 of 2")


def _page(client, user, url):
    client.force_login(user)
    response = client.get(url)
    assert response.status_code == 200, response.status_code
    return response.content.decode()


def test_bug4_the_control_page_shows_the_admins_priority_change_and_release(client, ops_users):
    from dashboards.models import AuditEntry
    from tests.support.history import make_campaign as ops_campaign

    campaign = ops_campaign(team=ops_users["launcher"].memberships.get().team, user=ops_users["launcher"],
                            name="p4", status="submitted", count=1)
    Task.objects.create(cluster=campaign.cluster, campaign=campaign, job_number=campaign.job_number, task_number=1,
                        is_array=True, state="held", submitted_at=timezone.now())
    _done_priority(ops_users["admin"], campaign.job_number, -100)
    AuditEntry.objects.create(user=ops_users["admin"], action="triage_release", target=f"job:{campaign.job_number}",
                              params={"job_number": campaign.job_number, "status": "done"}, ok=True,
                              result=f"released: job {campaign.job_number} tasks all")
    html = _page(client, ops_users["launcher"], f"/ops/campaigns/{campaign.pk}/")
    import re

    assert re.search(r'id="priority">-100\b', html)
    assert "triage_priority to -100" in html and "triage_release" in html


def test_bug9_retry_and_cancel_are_offered_only_when_they_can_act(client, ops_users):
    from tests.support.history import make_campaign as ops_campaign

    team = ops_users["launcher"].memberships.get().team
    finished = ops_campaign(team=team, user=ops_users["launcher"], name="f9", status="finished", count=1)
    Task.objects.create(cluster=finished.cluster, campaign=finished, job_number=finished.job_number, task_number=1,
                        is_array=True, state="done", active=False)
    html = _page(client, ops_users["launcher"], f"/ops/campaigns/{finished.pk}/")
    assert 'id="control-retry"' not in html and 'id="control-cancel"' not in html
    assert "no failed tasks" in html
    Task.objects.create(cluster=finished.cluster, campaign=finished, job_number=finished.job_number, task_number=2,
                        is_array=True, state="failed", active=False)
    html = _page(client, ops_users["launcher"], f"/ops/campaigns/{finished.pk}/")
    assert 'id="control-retry"' in html and "Retry the 1 failed task<" in html
    assert 'id="control-cancel"' not in html


# --------------------------------------------------------------------------- bug 13

def test_bug13_404_is_styled_with_navigation(client, ops_users, settings):
    settings.DEBUG = False
    client.force_login(ops_users["viewer"])
    response = client.get("/campaigns/999999/")
    html = response.content.decode()
    assert response.status_code == 404
    assert 'id="error-page"' in html and 'href="/"' in html and TCO_CSS.search(html) and "Log out" in html


def test_bug13_500_is_styled_and_needs_no_database(settings):
    from django.template.loader import render_to_string
    from django.views.defaults import server_error
    from django.test import RequestFactory

    settings.DEBUG = False
    response = server_error(RequestFactory().get("/x"))
    html = response.content.decode()
    assert response.status_code == 500 and 'id="error-page"' in html and TCO_CSS.search(html)
    assert 'href="/"' in html
    assert "500" in render_to_string("500.html")


def test_bug13_a_permission_denied_is_the_styled_403(client, ops_users, settings):
    from django.core.exceptions import PermissionDenied
    from django.views.defaults import permission_denied
    from django.test import RequestFactory

    request = RequestFactory().get("/ops/x")
    request.user = ops_users["viewer"]
    response = permission_denied(request, PermissionDenied("only admins"))
    html = response.content.decode()
    assert response.status_code == 403 and 'id="error-page"' in html and "only admins" in html


# --------------------------------------------------------------------------- feature 2: triage by reason

def _triage_fixture(ops_users):
    """Jobs: 40 (3 tasks, waiting for seats), 41 (1 task, seats), 42 (held by the launcher in tco),
    43 (error), 44 (not tco's, no reason: the scheduler no longer knows it)."""
    from dashboards.core import scheduler_cache
    from dashboards.models import AuditEntry, ControlRequest
    from schedulers.fake import FakeScheduler
    from tests.support.history import make_campaign as ops_campaign

    cluster = cluster_get_default()
    cluster.status = {"global_capacity": {"anthropic_api": 96}, "quotas": [], "hosts": []}
    cluster.save()
    team = ops_users["launcher"].memberships.get().team
    now = timezone.now()

    def tasks(job, n, state, waited_s, owner="tco", campaign=None):
        for t in range(1, n + 1):
            Task.objects.create(cluster=cluster, campaign=campaign, job_number=job, task_number=t, is_array=True,
                                name=f"job{job}", owner=owner, project="research", state=state,
                                submitted_at=now - dt.timedelta(seconds=waited_s))

    c40 = ops_campaign(team=team, user=ops_users["launcher"], name="sweep-a", status="submitted", job_number=40)
    tasks(40, 3, "pending", 300, campaign=c40)
    tasks(41, 1, "pending", 900)
    c42 = ops_campaign(team=team, user=ops_users["launcher"], name="paused-b", status="paused", job_number=42)
    tasks(42, 1, "held", 60, campaign=c42)
    entry = AuditEntry.objects.create(user=ops_users["launcher"], action="campaign_pause", target=f"campaign:{c42.pk}",
                                      ok=True, result="held")
    ControlRequest.objects.create(user=ops_users["launcher"], audit=entry, cluster=cluster, campaign=c42,
                                  action="campaign_pause", control="hold", job_number=42, state="done",
                                  finished_at=now)
    tasks(43, 1, "error", 30)
    tasks(44, 1, "pending", 10, owner="alice")
    seat = "(-l anthropic_api=1) cannot run globally because it offers only gc:anthropic_api=0.000000"

    def base(job, **fields):
        return {"job_number": job, "name": "x", "owner": "tco", "project": "research", "hard_resources": {},
                "tasks": [], "holds": {}, "predecessors": [], "scheduler_messages": [], "global_messages": [],
                "context": {}, **fields}

    fake = FakeScheduler()
    fake.set_job_detail(40, base(40, scheduler_messages=[seat]))
    fake.set_job_detail(41, base(41, scheduler_messages=[seat]))
    fake.set_job_detail(42, base(42, holds={"user": [[1, 1]]}))
    fake.set_job_detail(43, base(43, tasks=[{"task_number": 1, "state": "error"}]))
    scheduler_cache.cache.clear()
    return cluster, fake


def test_triage_groups_pending_work_by_reason_with_count_oldest_wait_and_action(ops_users, monkeypatch):
    from dashboards.control import triage

    cluster, fake = _triage_fixture(ops_users)
    overview = triage.triage_overview(cluster=cluster, scheduler=fake)
    groups = {g["key"]: g for g in triage.triage_groups(overview["jobs"])}
    seats = groups["consumable:anthropic_api"]
    assert seats["tasks"] == 4 and sorted(seats["jobs"]) == [40, 41]
    assert seats["label"] == "wait for anthropic_api seats" and seats["action"]["action"] == "priority"
    assert 899 <= seats["oldest_wait_s"] <= 960
    # The pause is said relative to now, with its clock time and zone (the fixture's request finished "now").
    held = groups["held_tco:launcher:paused"]
    assert re.fullmatch(r"1 task is paused by launcher in tco \d+ s ago \(\d\d:\d\d:\d\d UTC\)", held["title"])
    from dashboards.models import ControlRequest

    paused_at = ControlRequest.objects.get(job_number=42).finished_at.astimezone(dt.timezone.utc)
    assert held["title"].endswith(f"({paused_at:%H:%M:%S} UTC)")
    assert held["action"]["action"] == "release"
    assert seats["title"] == "4 tasks wait for anthropic_api seats"
    assert groups["error"]["title"] == "1 task is in the error state"
    assert groups["error"]["action"]["action"] == "clear_error"
    assert triage.triage_groups(overview["jobs"])[0]["key"] == "error"
    by_job = {j["job_number"]: j for j in overview["jobs"]}
    assert by_job[40]["launcher"] == "launcher" and by_job[41]["launcher"] == "" and by_job[44]["owner"] == "alice"


def test_triage_names_a_campaigns_team_and_says_when_a_job_has_no_project(client, ops_users, monkeypatch):
    """The Team cell (issue 24: empty on a phone, its label over the next one's): a campaign's job is its
    campaign's team even where qstat gave no project; another job without a project says so."""
    import re

    cluster, fake = _triage_fixture(ops_users)
    Task.objects.filter(job_number__in=(40, 41)).update(project="")  # qstat gave no project
    monkeypatch.setattr("dashboards.core.clusters.scheduler_for", lambda cluster, **options: fake)
    client.force_login(ops_users["admin"])
    team = ops_users["launcher"].memberships.get().team
    html = client.get("/ops/triage/").content.decode()

    def team_cell(job):
        row = html.split(f'<tr data-job="{job}"', 1)[1].split("</tr>", 1)[0]
        return re.sub(r"<[^>]+>", "", row.split('data-label="Team">', 1)[1].split("</td>", 1)[0])
    assert team_cell(40) == team.name  # campaign sweep-a's team
    assert team_cell(41) == "no project"
    assert team_cell(44) == Team.objects.get(project="research").name  # -P research, not tco's


def test_triage_filters_search_and_sorts_on_the_server_with_the_state_in_the_url(client, ops_users, monkeypatch):
    cluster, fake = _triage_fixture(ops_users)
    monkeypatch.setattr("dashboards.core.clusters.scheduler_for", lambda cluster, **options: fake)
    client.force_login(ops_users["admin"])
    import re

    def rows(url):
        html = client.get(url).content.decode()
        return [int(n) for n in re.findall(r'<tr data-job="(\d+)"', html)]
    assert rows("/ops/triage/?reason=consumable:anthropic_api") == [41, 40]  # longest wait first
    assert rows("/ops/triage/?reason=consumable:anthropic_api&sort=tasks") == [40, 41]
    assert rows("/ops/triage/?sort=job&dir=asc") == [40, 41, 42, 43, 44]
    assert rows("/ops/triage/?state=held") == [42]
    assert rows("/ops/triage/?owner=alice") == [44]
    # alice's job 44 was submitted outside tco: the owner cell names her account, never "tco (not launched by tco)"
    row = client.get("/ops/triage/?owner=alice").content.decode().split('<tr data-job="44"', 1)[1].split("</tr>", 1)[0]
    owner = re.sub(r"<[^>]+>", "", row.split('data-col="owner"', 1)[1].split("</td>", 1)[0]).split(">", 1)[1]
    assert owner == "account alice, submitted outside tco"
    assert rows("/ops/triage/?q=sweep-a") == [40]
    assert rows("/ops/triage/?owner=launcher&sort=job&dir=asc") == [40, 42]
    html = client.get("/ops/triage/?q=nothing-like-this").content.decode()
    assert 'id="triage-empty"' in html and "No waiting job matches" in html


def _triage_as_admin(client, ops_users, monkeypatch):
    """:func:`_triage_fixture` on the fake scheduler, no worker (enqueue does nothing), the admin logged in."""
    from dashboards.core import enqueue

    cluster, fake = _triage_fixture(ops_users)
    monkeypatch.setattr("dashboards.core.clusters.scheduler_for", lambda cluster, **options: fake)
    monkeypatch.setattr(enqueue, "send", lambda name, request_id: None)
    client.force_login(ops_users["admin"])
    return cluster, fake


def test_a_group_action_asks_once_then_acts_on_every_job_and_errors_stay_inline(client, ops_users, monkeypatch,
                                                                              django_capture_on_commit_callbacks):
    import re

    from dashboards.models import ControlRequest

    cluster, fake = _triage_as_admin(client, ops_users, monkeypatch)
    post = {"group": "consumable:anthropic_api", "action": "priority", "priority": "200", "next": "?state=pending"}
    html = client.post("/ops/triage/group", post).content.decode()
    assert 'id="confirm"' in html and 'data-job="40"' in html and 'data-job="41"' in html
    assert not ControlRequest.objects.filter(action="triage_priority").exists()
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post("/ops/triage/group", {**post, "confirm": "yes", "jobs": re.findall(
            r'<input type="hidden" name="jobs" value="(\d+)">', html)})
    assert response.status_code == 302 and response["Location"] == "/ops/triage/?state=pending"
    assert sorted(ControlRequest.objects.filter(action="triage_priority").values_list("job_number", "priority")) == [
        (40, 200), (41, 200)]
    # With the page's search, the group is what the page showed: job 40 only.
    ControlRequest.objects.all().delete()
    with django_capture_on_commit_callbacks(execute=True):
        client.post("/ops/triage/group", {**post, "next": "?q=sweep-a", "confirm": "yes", "jobs": ["40", "41"]})
    assert list(ControlRequest.objects.values_list("job_number", flat=True)) == [40]
    bad = client.post("/ops/triage/group", {**post, "priority": "5000"}, follow=True)
    assert bad.status_code == 200 and "-1023 to 1024" in bad.content.decode()
    assert bad.redirect_chain[-1][0] == "/ops/triage/?state=pending"
    # A bad per-job request is shown on the triage page itself, at the job's row.
    response = client.post("/ops/triage/action", {"action": "priority", "job_number": "40", "priority": "5000",
                                                  "tasks": ""})
    html = response.content.decode()
    assert response.status_code == 400 and 'id="triage"' in html and 'class="inline-error"' in html


def test_a_group_action_acts_only_on_the_jobs_confirmed_and_names_those_that_joined_or_left(
        client, ops_users, monkeypatch, django_capture_on_commit_callbacks):
    # Attack review 5: the action ran on the group as recomputed at "Yes", so a job that joined the
    # group after the confirmation page (here 45, e.g. a launcher's) got the priority raise too.
    import copy
    import re

    from dashboards.core import scheduler_cache
    from dashboards.models import ControlRequest

    cluster, fake = _triage_as_admin(client, ops_users, monkeypatch)
    post = {"group": "consumable:anthropic_api", "action": "priority", "priority": "1000", "next": ""}
    html = client.post("/ops/triage/group", post).content.decode()
    confirmed = re.findall(r'<input type="hidden" name="jobs" value="(\d+)">', html)
    assert sorted(confirmed) == ["40", "41"]
    # Between the confirmation page and "Yes": job 45 starts waiting for the same seats, 41 starts running.
    Task.objects.create(cluster=cluster, job_number=45, task_number=1, is_array=False, name="job45", owner="tco",
                        project="research", state="pending", submitted_at=timezone.now() - dt.timedelta(seconds=5))
    detail = copy.deepcopy(fake.job_details[41])
    fake.set_job_detail(45, {**detail, "job_number": 45})
    Task.objects.filter(job_number=41).update(state="running")
    scheduler_cache.cache.clear()
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post("/ops/triage/group", {**post, "confirm": "yes", "jobs": confirmed}, follow=True)
    assert list(ControlRequest.objects.filter(action="triage_priority").values_list("job_number", flat=True)) == [40]
    shown = [str(m) for m in response.context["messages"]]
    assert any("Skipped job 45" in m and "joined the group" in m for m in shown)
    assert any("Skipped job 41" in m and "no longer in the group" in m for m in shown)
    # A confirmation without its job list (or with a bad one) does nothing.
    ControlRequest.objects.all().delete()
    for jobs in ([], ["45x"]):
        with django_capture_on_commit_callbacks(execute=True):
            response = client.post("/ops/triage/group", {**post, "confirm": "yes", "jobs": jobs}, follow=True)
        assert "nothing was done" in response.content.decode()
    assert not ControlRequest.objects.exists()


def test_confirmed_in_group_splits_the_confirmed_jobs_from_those_that_joined_or_left():
    from dashboards.control.triage import confirmed_in_group

    assert confirmed_in_group([7, 3, 9], ["3", "5", "7", "3"]) == {"act": [7, 3], "left": [5], "joined": [9]}
    with pytest.raises(ValueError):
        confirmed_in_group([7], ["7; rm"])


# --------------------------------------------------------------------------- feature 5: the audit log

def test_the_audit_log_pages_filters_sorts_links_targets_and_exports_csv(client, ops_users):
    import csv as csvmod
    import io

    from dashboards.models import AuditEntry

    admin = ops_users["admin"]
    for n in range(60):
        AuditEntry.objects.create(user=admin, action="triage_hold", target=f"job:{1000 + n}",
                                  params={"job_number": 1000 + n, "tasks": [[1, 3], [5, 5]], "priority": None},
                                  ok=True, result=f"held: job {1000 + n}")
    AuditEntry.objects.create(user=ops_users["launcher"], action="campaign_cancel", target="campaign:7", params={},
                              ok=False, result="refused: no pending or running tasks to cancel")
    client.force_login(ops_users["viewer"])
    assert client.get("/ops/audit/").status_code == 403
    assert client.get("/ops/audit.csv").status_code == 403
    client.force_login(admin)
    html = client.get("/ops/audit/").content.decode()
    assert html.count("<tr class=") == 50 and "page 1 of 2 (61 entries)" in html
    assert '<a href="/ops/campaigns/7/">campaign:7</a>' in html
    assert "<dt>tasks</dt><dd>1-3,5</dd>" in html and "<dt>priority</dt><dd>—</dd>" in html
    html = client.get("/ops/audit/?sort=at&dir=desc&page=2").content.decode()
    assert html.count("<tr class=") == 11 and '<a href="/ops/triage/?q=1000">job:1000</a>' in html
    html = client.get("/ops/audit/?ok=no").content.decode()
    assert html.count("<tr class=") == 1 and "campaign_cancel" in html
    html = client.get("/ops/audit/?who=launcher&sort=target&dir=asc").content.decode()
    assert html.count("<tr class=") == 1
    html = client.get("/ops/audit/?q=job+1059").content.decode()
    assert html.count("<tr class=") == 1
    response = client.get("/ops/audit.csv?action=triage_hold")
    rows = list(csvmod.reader(io.StringIO(b"".join(response.streaming_content).decode())))
    assert rows[0][:3] == ["at_utc", "user", "action"] and len(rows) == 61
    assert {r[2] for r in rows[1:]} == {"triage_hold"}
    html = client.get("/ops/audit/?q=nothing-like-this").content.decode()
    assert 'id="audit-empty"' in html


# --------------------------------------------------------------------------- feature 6: the agent page

def test_accounting_fields_have_readable_names_and_units():
    from dashboards.live.task import accounting_fields

    rows = dict(accounting_fields({"wallclock_s": 125.0, "cpu_s": 0.25, "maxvmem_bytes": 3 * (1 << 29),
                                   "ended_at": "2026-12-01T10:00:05Z", "failed": 0, "usage": {}, "start_us": 1,
                                   "department": ""}))
    assert rows == {"wall clock": "125 s (2 min 05 s)", "CPU time": "0.250 s",
                    "peak virtual memory": "1.50 GiB (1610612736 bytes)", "ended (UTC)": "2026-12-01 10:00:05",
                    "failed code (0: none)": "0"}


def test_a_running_task_has_elapsed_time_progress_neighbours_and_a_running_segment(team_and_user):
    from dashboards.live.task import task_neighbours, task_progress
    from dashboards.core.stages import timeline
    from tests.support.campaigns import make_campaign

    team, user = team_and_user
    now = timezone.now()
    campaign = make_campaign(team=team, user=user, name="c6", job_number=606, tasks=[
        {"state": "done", "active": False, "wallclock_s": 100.0},
        {"state": "done", "active": False, "wallclock_s": 300.0},
        {"state": "running", "started_at": now - dt.timedelta(seconds=50)}])
    running = Task.objects.select_related("campaign__agent_definition").get(campaign=campaign, task_number=3)
    progress = task_progress(running, now=now)
    assert progress["elapsed_s"] == pytest.approx(50.0) and progress["expected_s"] == pytest.approx(200.0)
    assert progress["pct"] == pytest.approx(25.0) and "median of 2" in progress["expected_from"]
    assert task_progress(Task.objects.get(campaign=campaign, task_number=1)) is None
    segments = {s["stage"]: s for s in timeline(running)}
    assert segments["running"]["end"] is None and segments["running"]["start"].startswith(
        (now - dt.timedelta(seconds=50)).strftime("%Y-%m-%dT%H:%M:%S"))
    admin = type(user).objects.create_superuser("root2", password=None)
    admin.is_staff = True
    admin.save()
    near = task_neighbours(admin, running)
    assert near["previous"]["task_id"] == "606.2" and near["next"] is None


def test_the_log_tail_is_scoped_like_the_task(client, ops_users):
    from tests.support.history import make_campaign as ops_campaign

    team = ops_users["launcher"].memberships.get().team
    campaign = ops_campaign(team=team, user=ops_users["launcher"], name="logs", status="running", count=1)
    task = Task.objects.create(cluster=campaign.cluster, campaign=campaign, job_number=campaign.job_number,
                               task_number=1, is_array=True, state="running")
    client.force_login(ops_users["viewer"])
    body = client.get(f"/tasks/{task.pk}/logs.json").json()
    assert body["active"] is True and set(body) >= {"stdout", "stderr"}
    client.force_login(ops_users["other"])
    assert client.get(f"/tasks/{task.pk}/logs.json").status_code == 404


# --------------------------------------------------------------------------- feature 5: the tasks table

def test_the_task_table_sorts_and_searches_on_the_server_with_the_state_in_the_url(client, ops_users):
    import json
    import re

    from tests.support.history import make_campaign as ops_campaign

    team = ops_users["launcher"].memberships.get().team
    campaign = ops_campaign(team=team, user=ops_users["launcher"], name="tbl", status="finished", count=4)
    for n, (state, host, exit_status) in enumerate([("done", "vm-b", 0), ("failed", "vm-a", 2), ("done", "vm-c", 0),
                                                    ("done", "vm-a", 1)], 1):
        Task.objects.create(cluster=campaign.cluster, campaign=campaign, job_number=campaign.job_number,
                            task_number=n, is_array=True, state=state, host=host, exit_status=exit_status,
                            active=False)
    client.force_login(ops_users["viewer"])

    def numbers(query):
        html = client.get(f"/campaigns/{campaign.pk}/?{query}").content.decode()
        data = json.loads(re.search(r'<script id="initial-campaign" type="application/json">(.*?)</script>',
                                    html, re.S).group(1))
        return [t["task_number"] for t in data["tasks"]], data
    assert numbers("")[0] == [2, 1, 3, 4]  # failures first by default
    assert numbers("sort=host&dir=asc")[0] == [2, 4, 1, 3]
    assert numbers("sort=exit&dir=desc")[0] == [2, 4, 3, 1]
    found, data = numbers("q=vm-a&sort=task")
    assert found == [2, 4] and data["matching"] == 2 and data["q"] == "vm-a" and data["sort"] == "task"
    assert numbers("q=3")[0] == [3]
    Task.objects.filter(campaign=campaign, task_number=3).update(host="")
    assert numbers("sort=host&dir=asc")[0] == [2, 4, 1, 3] and numbers("sort=host&dir=desc")[0] == [1, 4, 2, 3]
    assert numbers("sort=nonsense")[1]["sort"] is None


def test_the_stylesheet_defines_every_colour_variable_in_both_themes():
    import re
    from pathlib import Path

    css = (Path(__file__).resolve().parents[2] / "static" / "css" / "tco.css").read_text()
    light, dark = (dict(re.findall(r"(--[\w-]+):\s*([^;]+);", block)) for block in
                   re.findall(r":root\s*\{([^}]*)\}", css)[:2])
    assert set(dark) <= set(light) and set(light) - set(dark) <= {"--focus"}
    for theme in (light, dark):
        for name, value in theme.items():
            assert "var(" not in value, f"{name} refers to a variable: {value}"
    used = set(re.findall(r"var\((--[\w-]+)\)", css))
    assert used <= set(light), used - set(light)


def test_the_campaign_finished_notice_is_one_dismissible_notice_of_the_latest_with_the_count(client, ops_users):
    # Trial 4 (session 4) changed this: four "Campaign finished" notices stacked at the top of every
    # page; now one notice names the latest and counts the others, one dismiss button for it.
    from tests.support.history import make_campaign as ops_campaign

    team = ops_users["launcher"].memberships.get().team
    done = [ops_campaign(team=team, user=ops_users["launcher"], name=f"n{i}", status="finished") for i in (1, 2, 3)]
    for minutes, c in zip((30, 20, 10), done):
        Campaign.objects.filter(pk=c.pk).update(finished_at=timezone.now() - dt.timedelta(minutes=minutes))
    client.force_login(ops_users["launcher"])
    html = client.get("/").content.decode()
    latest = Campaign.objects.get(pk=done[-1].pk)
    assert html.count("data-notice=") == 1
    assert f'data-notice="campaign-finished-{latest.pk}-{int(latest.finished_at.timestamp())}"' in html
    assert "and 2 more" in html and f"n1 (#{done[0].pk})" in html and f"n2 (#{done[1].pk})" in html
    assert html.count('class="dismiss"') == 1 and re.search(r"js/notices(\.[0-9a-f]{12})?\.js", html)
