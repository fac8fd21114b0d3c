"""Trial 4 (issue 16), findings 2, 3, 4 and the triage items of 10.

A campaign whose tasks wait for their ``-hold_jid_ad`` predecessor is ``waiting``, not ``paused``;
the forecast counts the predecessor and the chosen queue; triage says who holds what in tco.
The qstat shapes are real captures (tests/fixtures/sge819/README.md, "Array dependencies").
"""
from __future__ import annotations

import datetime as dt
import json
import re
from pathlib import Path

import pytest
from django.utils import timezone

from dashboards.core.clusters import cluster_get_default
from dashboards.models import AgentDefinition, AuditEntry, Campaign, ControlRequest, Task, Team
from schedulers.fake import FakeScheduler
from schedulers.gridengine.parsers.qstat_j import parse_job_detail
from tests.support.history import make_campaign, make_task, timing
from tests.support.forms import launch_data

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "sge819"
PRED, SUCC, SUCC_HELD = 1046, 1047, 1048  # the captured jobs


def _detail(name: str) -> dict:
    return parse_job_detail((FIXTURES / name).read_bytes())


@pytest.fixture(autouse=True)
def _fake_scheduler(monkeypatch):
    """No unit test asks the dev cluster: ``scheduler_for`` is a FakeScheduler (its qstat -j answers
    are the captured ones where a test sets them)."""
    from dashboards.core import scheduler_cache

    fake = FakeScheduler()
    monkeypatch.setattr("dashboards.core.clusters.scheduler_for", lambda cluster, **options: fake)
    scheduler_cache.cache.clear()
    return fake


# --------------------------------------------------------------------------- what qstat tells (real shapes)

# --------------------------------------------------------------------------- status, counts, controls

def _pair(ops_users, *, succ_state="held", n=2, pred_running=1, pred_started_s=10):
    """A predecessor campaign (job 1046, ``pred_running`` of ``n`` tasks running since
    ``pred_started_s`` s, the others pending) and its successor (job 1047, -hold_jid_ad 1046)."""
    team = Team.objects.get(project="research")
    now = timezone.now()
    pred = make_campaign(team=team, user=ops_users["launcher"], name="pred", status="running", job_number=PRED,
                         count=n)
    for t in range(1, n + 1):
        running = t <= pred_running
        Task.objects.create(cluster=pred.cluster, campaign=pred, job_number=PRED, task_number=t, is_array=True,
                            project="research", state="running" if running else "pending",
                            submitted_at=now - dt.timedelta(seconds=pred_started_s + 1),
                            started_at=now - dt.timedelta(seconds=pred_started_s) if running else None)
    succ = make_campaign(team=team, user=ops_users["launcher"], name="succ", status="submitted", job_number=SUCC,
                         count=n)
    Campaign.objects.filter(pk=succ.pk).update(predecessor_job=PRED)
    succ.refresh_from_db()
    for t in range(1, n + 1):
        Task.objects.create(cluster=succ.cluster, campaign=succ, job_number=SUCC, task_number=t, is_array=True,
                            name="succ", owner="tco", project="research", state=succ_state,
                            submitted_at=now - dt.timedelta(seconds=5))
    return pred, succ


def _tco_control(user, campaign, control, action, minutes_ago=0):
    entry = AuditEntry.objects.create(user=user, action=action, target=f"campaign:{campaign.pk}", ok=True, result="")
    return ControlRequest.objects.create(user=user, audit=entry, cluster=campaign.cluster, campaign=campaign,
                                         action=action, control=control, job_number=campaign.job_number,
                                         state="done",
                                         finished_at=timezone.now() - dt.timedelta(minutes=minutes_ago))


def test_a_campaign_held_only_by_its_predecessor_is_waiting_and_a_paused_one_stays_paused(ops_users):
    from dashboards.ingest.campaign_status import campaign_status_follow

    _pred, succ = _pair(ops_users)
    campaign_status_follow([succ.pk])
    succ.refresh_from_db()
    assert succ.status == "waiting" and succ.get_status_display() == "waiting for its predecessor"
    # The launcher pauses it (a tco hold, done): paused, though it also has a predecessor.
    _tco_control(ops_users["launcher"], succ, "hold", "campaign_pause", minutes_ago=2)
    campaign_status_follow([succ.pk])
    succ.refresh_from_db()
    assert succ.status == "paused"
    # Resumed: waiting again (the dependency stays until the predecessor's tasks end).
    _tco_control(ops_users["launcher"], succ, "release", "campaign_resume", minutes_ago=1)
    campaign_status_follow([succ.pk])
    succ.refresh_from_db()
    assert succ.status == "waiting"


def test_a_campaign_submitted_on_hold_with_a_predecessor_is_paused_and_one_without_is_paused(ops_users):
    from dashboards.ingest.campaign_status import campaign_status_follow

    _pred, succ = _pair(ops_users)
    Campaign.objects.filter(pk=succ.pk).update(submit_on_hold=True)
    plain = make_campaign(team=succ.team, user=ops_users["launcher"], name="plain", status="submitted", job_number=77)
    Task.objects.create(cluster=plain.cluster, campaign=plain, job_number=77, task_number=1, state="held")
    campaign_status_follow([succ.pk, plain.pk])
    assert dict(Campaign.objects.filter(pk__in=[succ.pk, plain.pk]).values_list("name", "status")) == {
        "succ": "paused", "plain": "paused"}


def test_the_control_page_says_it_waits_for_the_predecessor_and_offers_no_resume(as_user, ops_users):
    from dashboards.control import actions
    from dashboards.ingest.campaign_status import campaign_status_follow
    from dashboards.core.errors import LaunchError

    _pred, succ = _pair(ops_users)
    campaign_status_follow([succ.pk])
    succ.refresh_from_db()
    controls = actions.campaign_controls(succ, {"held": 2})
    assert controls["resume"]["count"] == 0 and f"predecessor job {PRED}" in controls["resume"]["why"]
    assert controls["pause"]["count"] == 2 and controls["waiting"]["campaign"] == "pred"
    with pytest.raises(LaunchError, match=f"wait for predecessor job {PRED}"):
        actions.campaign_control(user=ops_users["launcher"], campaign=succ, action="resume")
    html = as_user("launcher").get(f"/ops/campaigns/{succ.pk}/").content.decode()
    assert 'id="control-resume"' not in html and "Resume the" not in html
    assert f"2 tasks wait for predecessor job {PRED}" in html.replace("<strong>", "").replace("</strong>", "")
    states = html.split('id="progress-states"', 1)[1].split("</p>", 1)[0]
    assert 'data-state="waiting">2 waiting' in states and "held" not in states
    assert '<span id="progress-status">waiting</span>' in html


def test_pausing_a_waiting_campaign_holds_its_waiting_tasks(ops_users, monkeypatch):
    from dashboards.core import enqueue
    from dashboards.control import actions

    monkeypatch.setattr(enqueue, "send", lambda name, request_id: None)
    _pred, succ = _pair(ops_users)
    request = actions.campaign_control(user=ops_users["launcher"], campaign=succ, action="pause")
    assert request.control == "hold" and request.tasks == [[1, 2]]


def test_the_api_and_campaign_page_count_waiting_tasks_not_held_ones(as_user, ops_users):
    from dashboards.ingest.campaign_status import campaign_status_follow

    _pred, succ = _pair(ops_users)
    campaign_status_follow([succ.pk])
    client = as_user("launcher")
    data = client.get(f"/api/campaigns/{succ.pk}/").json()
    assert data["campaign"]["status"] == "waiting"
    assert data["states"]["waiting"] == 2 and "held" not in data["states"]
    only = client.get(f"/api/campaigns/{succ.pk}/", {"state": "waiting"}).json()
    assert sorted(t["task_number"] for t in only["tasks"]) == [1, 2]
    # The task rows say it too (qstat's hqw is "held"; the re-trial saw "held" rows under "waiting" counts).
    assert {t["state"] for t in data["tasks"]} == {"waiting"}
    html = client.get(f"/campaigns/{succ.pk}/").content.decode()
    header = html.split('id="states"', 1)[1].split("</thead>", 1)[0]
    assert ">waiting<" in header and ">held<" not in header


# --------------------------------------------------------------------------- triage

def _triage(ops_users, fake):
    """Job 1047 (succ, waits for 1046), 1048 (paused by the launcher in tco, also with a predecessor:
    stays paused), 977 (held outside tco, with a full classic.q in its reasons)."""
    pred, succ = _pair(ops_users)
    cluster = succ.cluster
    cluster.status = {"quotas": [], "hosts": [], "queues": []}
    cluster.save()
    paused = make_campaign(team=succ.team, user=ops_users["launcher"], name="paused-c", status="paused",
                           job_number=SUCC_HELD, count=2)
    Campaign.objects.filter(pk=paused.pk).update(predecessor_job=PRED)
    now = timezone.now()
    for t in (1, 2):
        Task.objects.create(cluster=cluster, campaign=paused, job_number=SUCC_HELD, task_number=t, is_array=True,
                            name="paused-c", owner="tco", project="research", state="held",
                            submitted_at=now - dt.timedelta(seconds=60))
    _tco_control(ops_users["launcher"], paused, "hold", "campaign_pause")
    for t in (3, 4, 5):
        Task.objects.create(cluster=cluster, job_number=977, task_number=t, is_array=True, name="true", owner="alice",
                            project="", state="held", submitted_at=now - dt.timedelta(seconds=900))
    fake.set_job_detail(SUCC, _detail("qstat_j_hold_jid_ad.xml"))
    fake.set_job_detail(SUCC_HELD, _detail("qstat_j_hold_jid_ad_held.xml"))
    full = 'queue instance "classic.q@sge-exec3" dropped because it is full'
    fake.set_job_detail(977, {"job_number": 977, "name": "true", "owner": "alice", "project": None,
                              "hard_resources": {}, "tasks": [], "holds": {"user": [[3, 5, 1]]}, "predecessors": [],
                              "scheduler_messages": ["Job is in hold state"], "global_messages": [full],
                              "hard_queues": ["classic.q"], "context": {}})
    return cluster


def test_triage_groups_a_predecessor_wait_apart_with_no_release(ops_users, _fake_scheduler):
    from dashboards.control import triage

    cluster = _triage(ops_users, _fake_scheduler)
    overview = triage.triage_overview(cluster=cluster, scheduler=_fake_scheduler)
    groups = {g["key"]: g for g in triage.triage_groups(overview["jobs"])}
    wait = groups[f"predecessor:{PRED}"]
    assert wait["jobs"] == [SUCC] and wait["title"] == f"2 tasks wait for predecessor job {PRED} (campaign pred)"
    assert wait["action"]["action"] == "" and "not a hold" in wait["action"]["why"]
    paused = groups["held_tco:launcher:paused"]
    assert paused["jobs"] == [SUCC_HELD] and paused["action"]["action"] == "release"
    outside = groups["held"]
    assert outside["jobs"] == [977]  # never the jobs of another reason
    by_job = {j["job_number"]: j for j in overview["jobs"]}
    assert by_job[SUCC]["state"] == "waiting" and by_job[SUCC_HELD]["state"] == "held"
    succ_reasons = [r["text"] for r in by_job[SUCC]["reasons"]]
    assert succ_reasons[0].startswith(f"waits for predecessor job {PRED} (campaign pred), task by task")
    # The task ranges say "waiting", not qstat's "held" (the re-trial saw "held: tasks 1-6" beside "not held").
    assert set(by_job[SUCC]["ranges"]) == {"waiting"} and set(by_job[SUCC_HELD]["ranges"]) == {"held"}
    assert not any(r.startswith("held by") for r in succ_reasons)
    # The launcher's pause is said in the row in its group's words, not as a hold by user/operator/system.
    paused_reasons = [r["text"] for r in by_job[SUCC_HELD]["reasons"]]
    assert paused_reasons[0] == paused["label"][len("are "):]
    assert re.fullmatch(r"paused by launcher in tco \d+ s ago \(\d\d:\d\d:\d\d UTC\)", paused_reasons[0])
    assert not any("user/operator/system" in r for r in paused_reasons)
    # A held job's full queue instance is secondary (it holds nothing back while the job is held).
    full = [r for r in by_job[977]["reasons"] if "classic.q@sge-exec3" in r["text"]]
    assert full and all(r.get("secondary") for r in full)


def test_a_group_bulk_action_other_than_its_own_is_refused(client, ops_users, _fake_scheduler, monkeypatch):
    from dashboards.core import enqueue

    _triage(ops_users, _fake_scheduler)
    monkeypatch.setattr(enqueue, "send", lambda name, request_id: None)
    client.force_login(ops_users["admin"])
    response = client.post("/ops/triage/group", {"group": f"predecessor:{PRED}", "action": "release", "next": "",
                                                 "confirm": "yes"}, follow=True)
    assert "no action in tco moves these" in response.content.decode()
    assert not ControlRequest.objects.filter(action="triage_release").exists()
    html = client.get("/ops/triage/").content.decode()
    group = html.split(f'data-group="predecessor:{PRED}"', 1)[1].split("</div>", 1)[0]
    assert "No action in tco moves these" in group and "<button" not in group
    waiting_row = html.split(f'<tr data-job="{SUCC}"', 1)[1].split("</tr>", 1)[0]
    assert 'value="release"' not in waiting_row and "held:" not in waiting_row and "waiting:" in waiting_row
    row = html.split(f'<tr data-job="{SUCC_HELD}"', 1)[1].split("</tr>", 1)[0]
    words = re.sub(r"<[^>]+>", "", row)  # "36 s ago" is in a <time data-at> that keeps it moving
    assert "paused by launcher in tco " in words and " s ago (" in words and "user/operator/system" not in words
    assert re.search(r'in tco <time class="ticking" datetime="[^"]+" data-at="[0-9.]+">\d+ s ago</time> \(', row)
    held = html.split('<tr data-job="977"', 1)[1].split("</tr>", 1)[0]
    assert 'class="muted secondary">once released: queue instance' in held


# --------------------------------------------------------------------------- forecast

def _forecast(team, **kw):

    args = dict(cluster=cluster_get_default(), team=team, count=2, queue="agent.q", seats_per_task=0,
                concurrency_cap=None, priority=0, duration_s={"p10": 2.0, "p50": 2.0, "p90": 3.0})
    args.update(kw)
    return timing(**args)


def test_the_forecast_starts_no_earlier_than_the_predecessors_tasks_likely_end(ops_users, _fake_scheduler):
    team = Team.objects.get(project="research")
    _fake_scheduler.queue_rows = [{"name": "agent.q", "used": 1, "resv": 0, "available": 95, "total": 96}]
    # The predecessor's agent (demo-agent) took 45 s a run; its task 1 started 10 s ago, task 2 waits.
    history = make_campaign(team=team, user=ops_users["launcher"], name="history")
    for n in range(1, 4):
        make_task(history, task_number=n, started_at=timezone.now() - dt.timedelta(hours=1), wallclock_s=45)
    _pair(ops_users, pred_running=1, pred_started_s=10)
    now = timezone.now()
    t = _forecast(team, now=now, predecessor_job=PRED, user=ops_users["launcher"])
    before = t["predecessor"]
    assert before["running"] == 1 and before["waiting"] == 1 and before["task_s"] == 45
    started = Task.objects.get(job_number=PRED, task_number=1).started_at
    first_end = started + dt.timedelta(seconds=45)
    assert t["start_at"] == first_end and t["wait_s"] == pytest.approx((first_end - now).total_seconds())
    # Task 2 of the predecessor starts when task 1 ends and runs 45 s; our task 2 then runs 2 s (median).
    assert before["last_end_at"] == first_end + dt.timedelta(seconds=45)
    assert t["finish_at"]["p50"] == before["last_end_at"] + dt.timedelta(seconds=2)
    assert f"waits for predecessor job {PRED} (campaign pred), task by task" in before["text"]
    assert before["tasks"] == 2 and "This campaign has" not in before["text"]
    # Without the predecessor the same launch starts at once.
    assert _forecast(team, now=now)["wait_s"] == 0
    # A campaign of another size is told before Launch (which refuses it), in the launch's words.
    other = _forecast(team, now=now, count=3, predecessor_job=PRED, user=ops_users["launcher"])["predecessor"]
    assert other["text"].startswith(f"This campaign has 3 tasks, but -hold_jid_ad pairs task N with task N of "
                                    f"predecessor job {PRED}, which has 2: give it 2 tasks. Launch refuses it")


def test_a_predecessor_that_has_ended_adds_no_wait(ops_users, _fake_scheduler):
    team = Team.objects.get(project="research")
    _fake_scheduler.queue_rows = [{"name": "agent.q", "used": 0, "resv": 0, "available": 96, "total": 96}]
    pred, _succ = _pair(ops_users)
    Task.objects.filter(campaign=pred).update(state="done", active=False)
    t = _forecast(team, predecessor_job=PRED, user=ops_users["launcher"])
    assert t["wait_s"] == 0 and t["predecessor"]["ended"] and "has ended" in t["predecessor"]["text"]


def test_the_forecast_on_classic_q_counts_only_its_work_its_free_slots_now_and_the_agents_history(
        ops_users, _fake_scheduler):
    team = Team.objects.get(project="research")
    cluster = cluster_get_default()
    # The last poll says classic.q has 2 free slots; the scheduler now says none (another campaign took them).
    cluster.status = {"queues": [{"name": "classic.q", "used": 0, "resv": 0, "available": 2, "total": 2},
                                 {"name": "agent.q", "used": 0, "resv": 0, "available": 96, "total": 96}],
                      "quotas": [], "hosts": []}
    cluster.save()
    _fake_scheduler.queue_rows = [{"name": "classic.q", "used": 2, "resv": 0, "available": 0, "total": 2}]
    agent = AgentDefinition.objects.get(name="demo-agent")
    history = make_campaign(team=team, user=ops_users["launcher"], name="history")
    for n in range(1, 6):  # the agent ran on agent.q only: 30 s each
        task = make_task(history, task_number=n, started_at=timezone.now() - dt.timedelta(hours=1), wallclock_s=30)
        Task.objects.filter(pk=task.pk).update(queue="agent.q")
    for n in range(1, 20):  # jobs not launched by tco that took no time on classic.q
        task = make_task(None, task_number=n, started_at=timezone.now() - dt.timedelta(minutes=5), wallclock_s=0)
        Task.objects.filter(pk=task.pk).update(queue="classic.q")
    on_agent_q = make_campaign(team=team, user=ops_users["launcher"], name="busy-agent-q", status="submitted")
    for n in range(1, 9):
        make_task(on_agent_q, task_number=n, started_at=None, state="pending")
    on_classic = make_campaign(team=team, user=ops_users["launcher"], name="rank-a", status="submitted")
    Campaign.objects.filter(pk=on_classic.pk).update(queue="classic.q")
    for n in range(1, 5):
        make_task(on_classic, task_number=n, started_at=None, state="pending")
    from dashboards.billing import costs

    durations = costs.forecast(agent_definition=agent, count=2)["duration_s"]
    now = timezone.now()
    t = _forecast(team, queue="classic.q", seats_per_task=0, duration_s=durations, agent_definition=agent, now=now)
    assert t["ahead"] == 4  # rank-a's 4 tasks; not agent.q's 8
    assert t["free_now"] == 0 and t["slots_source"] == "qstat -g c now"
    assert t["history_queues"] == [("agent.q", 5)]
    # classic.q's tasks took no time: the wait is timed by the agent's own 30 s: (4 + 1) x 30 / 2 slots.
    assert t["queue_task_s"] == 30 and t["wait_s"] == pytest.approx(75)
    assert t["start_at"] == now + dt.timedelta(seconds=75)
    assert t["finish_at"]["p50"] == now + dt.timedelta(seconds=75 + 30)
    # The scheduler not answering: the poll's figures, said so (2 free, less the 4 ahead: none now).
    _fake_scheduler.unavailable = True
    t = _forecast(team, queue="classic.q", seats_per_task=0, duration_s=durations, agent_definition=agent, now=now)
    assert t["free_now"] == 0 and t["slots_source"].startswith("the last cluster poll")


# --------------------------------------------------------------------------- the form

def test_the_form_gives_a_forecast_without_a_campaign_name_and_needs_one_to_launch(as_user, ops_users):
    client = as_user("launcher")
    data = {**launch_data(), "name": ""}
    html = client.post("/ops/launch/", {**data, "preview": "1"}).content.decode()
    assert 'id="forecast-when"' in html and 'id="launch-submit"' in html
    assert "This field is required" not in html
    name_input = html.split('name="name"', 1)[1].split(">", 1)[0]
    assert "required" not in name_input
    html = client.post("/ops/launch/", {**data, "launch": "1"}).content.decode()
    assert "a campaign name is needed to launch" in html
    assert not Campaign.objects.filter(launched_by=ops_users["launcher"]).exists()
    json.dumps(data)  # the form data stays plain


def test_the_launch_page_says_the_predecessor_wait_in_words(as_user, ops_users, _fake_scheduler):
    _fake_scheduler.queue_rows = [{"name": "agent.q", "used": 1, "resv": 0, "available": 95, "total": 96}]
    team = Team.objects.get(project="research")
    history = make_campaign(team=team, user=ops_users["launcher"], name="history")
    for n in range(1, 4):
        make_task(history, task_number=n, started_at=timezone.now() - dt.timedelta(hours=1), wallclock_s=45)
    _pair(ops_users, n=3, pred_running=1, pred_started_s=10)
    html = as_user("launcher").post("/ops/launch/", {**launch_data(), "predecessor_job": str(PRED),
                                                     "preview": "1"}).content.decode()
    said = html.split('id="forecast-predecessor">', 1)[1].split("</dd>", 1)[0]
    assert f"waits for predecessor job {PRED} (campaign pred), task by task" in said
    start = html.split('id="forecast-start">', 1)[1].split("</dd>", 1)[0]
    assert "at once" not in start and f"first task of predecessor job {PRED} likely ends" in start
