"""Issue 16 user trials (ux2): triage groups by the real reason kind, the campaign page's controls
follow the pushed status, the campaign facts and actions, the bills' campaign links and the
forecast's history. Each test fails without its fix."""
from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest


pytestmark = pytest.mark.django_db

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "sge819"
NOW = dt.datetime(2026, 12, 1, 17, 0, tzinfo=dt.timezone.utc)


def _detail(job, messages, **fields):
    return {"job_number": job, "name": "x", "owner": "tco", "project": "research", "hard_resources": {},
            "tasks": [{"task_number": 1, "state": "running"}, {"task_number": 2, "state": "pending"}],
            "holds": {}, "predecessors": [], "scheduler_messages": messages, "global_messages": [],
            "context": {}, **fields}


def _job(number, reasons, tasks=1):
    return {"job_number": number, "errors": 0, "held": 0, "tasks": tasks, "wait_s": 60.0, "reasons": reasons}


def test_the_qstat_j_parser_reads_the_start_time_and_the_task_cap():
    from schedulers.gridengine.parsers.qstat_j import parse_job_detail

    xml = (FIXTURES / "qstat_j_held.xml").read_bytes()
    assert b"<JB_execution_time>0</JB_execution_time>" in xml
    plain = parse_job_detail(xml)
    assert plain["start_at"] is None and plain["task_concurrency"] is None
    start = int(dt.datetime(2026, 12, 1, 18, 30, tzinfo=dt.timezone.utc).timestamp())
    xml = xml.replace(b"<JB_execution_time>0<", f"<JB_execution_time>{start}<".encode())
    xml = xml.replace(b"<JB_ja_task_concurrency>0<", b"<JB_ja_task_concurrency>2<")
    parsed = parse_job_detail(xml)
    assert parsed["start_at"] == dt.datetime(2026, 12, 1, 18, 30, tzinfo=dt.timezone.utc)
    assert parsed["task_concurrency"] == 2


def test_triage_gives_a_start_time_and_a_task_cap_their_own_groups_not_the_priority_order():
    from dashboards.control.triage import _group_of, triage_groups
    from schedulers.pending import explain_pending, policy_position

    start = dt.datetime(2026, 12, 1, 18, 30, tzinfo=dt.timezone.utc)
    waits_for_a = explain_pending(_detail(7, ["execution time not reached"], start_at=start), now=NOW)
    capped = explain_pending(_detail(8, ["not all array task may be started due to 'max_aj_instances'"],
                                     task_concurrency=2), now=NOW)
    position = policy_position(rank=1, of=3, priority=0.5, project="research")
    behind = policy_position(rank=2, of=3, priority=0.4, project="research")
    jobs = [_job(7, waits_for_a + position), _job(8, capped + position, tasks=5), _job(9, list(behind), tasks=2)]
    for job in jobs:
        job["group"] = _group_of(job, None)
    groups = {g["kind"]: g for g in triage_groups(jobs)}
    assert groups["start_time"]["jobs"] == [7]
    assert groups["start_time"]["title"] == "1 task starts at 18:30 UTC (requested start time)"
    assert groups["start_time"]["action"]["action"] == ""  # raising the priority cannot start it
    assert groups["task_limit"]["jobs"] == [8]
    assert groups["task_limit"]["title"] == ("5 tasks are limited to 2 running at once by the campaign's "
                                             "concurrency cap (-tc)")
    assert groups["task_limit"]["action"]["action"] == ""
    assert groups["scheduling"]["jobs"] == [9]  # only its place in the order: that one is its turn
    # First in that order with nothing else named: no raise can move it further up.
    assert _group_of(_job(12, list(position)), None)["kind"] == "next"
    # A reason the groups do not know is never "their turn" either.
    odd = _job(10, [{"text": "something new the scheduler says", "raw": ""}] + position)
    assert _group_of(odd, None)["kind"] == "other"
    # The -q note says where it may run, not why it waits: with only its place besides, it is its turn.
    only_q = explain_pending(_detail(11, ['cannot run in queue "classic.q" because it is not contained in its hard '
                                          'queue list (-q)'], hard_queues=["agent.q"]), now=NOW)
    assert only_q and only_q[0]["text"].startswith("only runs in the queues it requested (-q)")
    assert _group_of(_job(11, only_q + behind), None)["kind"] == "scheduling"


def test_the_triage_page_offers_no_button_for_a_group_no_tco_control_moves(client, ops_users, monkeypatch):
    from django.utils import timezone

    from dashboards.core import scheduler_cache
    from dashboards.core.clusters import cluster_get_default
    from dashboards.models import Task
    from schedulers.fake import FakeScheduler

    cluster = cluster_get_default()
    cluster.status = {"quotas": [], "hosts": []}
    cluster.save()
    Task.objects.create(cluster=cluster, job_number=70, task_number=1, is_array=True, name="later", owner="tco",
                        project="research", state="pending", submitted_at=timezone.now())
    fake = FakeScheduler()
    fake.set_job_detail(70, _detail(70, ["execution time not reached"],
                                    start_at=timezone.now() + dt.timedelta(hours=1)))
    scheduler_cache.cache.clear()
    monkeypatch.setattr("dashboards.core.clusters.scheduler_for", lambda cluster, **options: fake)
    client.force_login(ops_users["admin"])
    html = client.get("/ops/triage/").content.decode()
    card = html[html.index('data-kind="start_time"'):]
    card = card[:card.index("</div>")]
    assert "(requested start time)" in card and "Raise the priority" not in card and "<button" not in card


def _research_campaign(ops_users, **fields):
    from dashboards.models import Team
    from tests.support.history import make_campaign

    team = Team.objects.get(project="research")
    return make_campaign(team=team, user=ops_users["launcher"], name="sweep", **fields)


def test_the_campaign_facts_have_no_empty_parenthesis_and_actions_name_their_target(client, ops_users):
    from django.utils import timezone

    from dashboards.models import AuditEntry

    campaign = _research_campaign(ops_users, status="submitting", count=8)
    AuditEntry.objects.create(user=ops_users["launcher"], action="launch", target=f"campaign:{campaign.pk}", ok=True,
                              params={"priority": 0, "tasks": 8}, result="queued")
    AuditEntry.objects.create(user=ops_users["admin"], action="triage_priority", target=f"job:{campaign.job_number}",
                              ok=True, params={"priority": 100, "job_number": campaign.job_number}, result="done",
                              at=timezone.now() + dt.timedelta(seconds=1))
    client.force_login(ops_users["launcher"])
    html = client.get(f"/ops/campaigns/{campaign.pk}/").content.decode()
    facts = html[html.index('id="task-count"'):]
    facts = facts[:facts.index("</td>")]
    assert "()" not in facts and "8" in facts
    history = html[html.index('id="history"'):]
    history = history[:history.index("</table>")]
    assert "launch to 0" not in history
    assert f"campaign:{campaign.pk}" in history and f"job:{campaign.job_number}" in history
    assert "triage_priority to 100" in history


def test_the_control_box_is_redrawn_from_the_campaign_as_it_is_now(client, ops_users):
    from dashboards.models import Campaign, Task

    campaign = _research_campaign(ops_users, status="submitting", count=2)
    client.force_login(ops_users["launcher"])
    page = client.get(f"/ops/campaigns/{campaign.pk}/").content.decode()
    url = f"/ops/campaigns/{campaign.pk}/controls"
    assert f'id="control-buttons" data-url="{url}"' in page  # what campaign_progress.js fetches
    before = client.get(url).content.decode()
    assert "Pause: not offered (the campaign is " in before
    assert 'id="control-pause"' not in before
    # The poll has seen the job run: one task running, one pending.
    for number, state in ((1, "running"), (2, "pending")):
        Task.objects.create(cluster=campaign.cluster, campaign=campaign, job_number=campaign.job_number,
                            task_number=number, is_array=True, name="sweep", owner="tco", project="research",
                            state=state)
    Campaign.objects.filter(pk=campaign.pk).update(status="running")
    after = client.get(url).content.decode()
    assert "not offered (the campaign is" not in after
    assert 'id="control-pause">Pause the 1 pending task<' in after
    assert 'id="control-cancel" class="danger">Cancel 2 tasks<' in after
    client.force_login(ops_users["viewer"])
    assert client.get(url).status_code == 403


def test_a_campaign_name_in_the_bill_opens_its_breakdown_with_a_small_link_to_its_page(client, ops_users):
    import html as html_lib
    import re

    from tests.support.history import make_task

    campaign = _research_campaign(ops_users, status="finished", count=1)
    make_task(campaign, started_at=dt.datetime(2026, 11, 10, 9, tzinfo=dt.timezone.utc), wallclock_s=10,
              cost_usd="1.5", tokens={"output_tokens": 10})
    client.force_login(ops_users["lead"])
    html = client.get("/ops/bills/", {"period": "day", "first": "2026-11-09", "last": "2026-11-15",
                                      "group_by": "campaign"}).content.decode()
    row = html.split(f'data-key="sweep (#{campaign.pk})"', 1)[1].split("</tr>", 1)[0]
    links = [(html_lib.unescape(href), label) for href, label in re.findall(r'<a href="([^"]+)"[^>]*>([^<]+)</a>', row)]
    name_href = next(href for href, label in links if label == f"sweep (#{campaign.pk})")
    assert name_href.startswith("?") and f"campaign={campaign.pk}" in name_href and "/ops/campaigns/" not in name_href
    # Issue 24: the small link opens the campaign's tasks, the most expensive first (it was the control page).
    assert (f"/campaigns/{campaign.pk}/?sort=cost&dir=desc", "tasks by cost") in links


def test_the_forecast_says_what_history_it_is_based_on_and_when_the_inputs_differ(client, ops_users):
    import json
    import re

    from dashboards.launch import spool
    from tests.support.history import make_task
    from tests.support.forms import launch_data

    history = _research_campaign(ops_users, status="finished", count=3)
    started = dt.datetime(2026, 11, 30, 9, tzinfo=dt.timezone.utc)
    for n, wall in enumerate((1.0, 2.0, 3.0), start=1):
        make_task(history, task_number=n, started_at=started, wallclock_s=wall, cost_usd="0",
                  tokens={"output_tokens": 0})
    path = Path(spool.spool_layout().inputs_path(history.pk))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"duration_s": 1}) + "\n" for _ in range(3)), encoding="utf-8")
    client.force_login(ops_users["launcher"])

    def preview(params):
        html = client.post("/ops/launch/", {**launch_data(input_params=params), "preview": "1"}).content.decode()
        assert 'id="forecast-basis"' in html, html[:3000]
        return html

    html = preview("duration_s=40")
    basis = re.sub(r"\s+", " ", html.split('id="forecast-basis"', 1)[1].split("</p>", 1)[0])
    assert "3 finished runs of demo-agent v1" in basis and "median 2 s" in basis
    misfit = re.sub(r"\s+", " ", html.split('id="forecast-misfit"', 1)[1].split("</p>", 1)[0])
    assert "<code>duration_s</code> is 40 here, 1 in the history" in misfit
    assert 'id="forecast-misfit"' not in preview("duration_s=1")  # the same inputs: no warning
