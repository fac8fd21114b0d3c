"""The landing page's host and failure tiles read the cluster as it is (issue 24, round 4): a host in
load alarm is up and busy, not down; failures of jobs tco did not launch (the demo's sweep, whose runs
fail on purpose, or another account's qsub) are said to be theirs and open their task."""
from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone

from dashboards.core.clusters import cluster_get_default
from dashboards.models import Cluster, Team
from schedulers.hosts import parse_queue_instances
from schedulers.gridengine.parsers.qhost import parse_qhost
from tests.support.history import make_campaign, make_task
from tests.support.paths import REPO

pytestmark = pytest.mark.django_db

MULTIHOST = REPO / "tests" / "fixtures" / "multihost"


def _tiles(user, now=None):
    from dashboards.web.landing import landing_tiles

    return {t["key"]: t for t in landing_tiles(user, seat_resource="anthropic_api", now=now)}


def _poll(qhost: str, qstat_f: str) -> None:
    Cluster.objects.filter(pk=cluster_get_default().pk).update(status={
        "queues": [], "quotas": [], "global_capacity": {},
        "hosts": parse_qhost((MULTIHOST / qhost).read_bytes()),
        "queue_instances": parse_queue_instances((MULTIHOST / qstat_f).read_bytes())})


def test_a_host_in_load_alarm_is_busy_not_down(ops_users):
    # qstat_f_alarm.xml: agent.q@mh-exec1 unknown (u), agent.q@mh-exec2 disabled (d), classic.q@mh-exec3
    # in load alarm ("alarm hl:np_load_avg=1.766601 load-threshold=0.1"); qhost_F_ok.xml: every host reports.
    _poll("qhost_F_ok.xml", "qstat_f_alarm.xml")
    hosts = _tiles(ops_users["admin"])["hosts"]
    # Two of three down (unreachable, disabled): more than half, red; mh-exec3 is not counted among them.
    assert (hosts["value"], hosts["number"], hosts["level"]) == ("2 of 3 hosts", 2, "red")
    assert hosts["detail"] == ("mh-exec1 unreachable; mh-exec2 disabled; mh-exec3 busy: classic.q in load alarm "
                               "(np_load_avg 1.77 over 0.1), no new work there")


def test_only_a_load_alarm_leaves_every_host_up(ops_users):
    xml = (MULTIHOST / "qstat_f_alarm.xml").read_bytes()
    # The same poll with the unknown and disabled instances healthy: only the load alarm is left.
    healthy = xml.replace(b"<state>u</state>", b"<state></state>").replace(b"<state>d</state>", b"<state></state>")
    Cluster.objects.filter(pk=cluster_get_default().pk).update(status={
        "queues": [], "quotas": [], "global_capacity": {},
        "hosts": parse_qhost((MULTIHOST / "qhost_F_ok.xml").read_bytes()),
        "queue_instances": parse_queue_instances(healthy)})
    hosts = _tiles(ops_users["admin"])["hosts"]
    assert (hosts["value"], hosts["number"], hosts["level"]) == ("0 of 3 hosts", 0, "ok")
    assert hosts["detail"].startswith("every host is up; mh-exec3 busy: classic.q in load alarm")


def test_failures_of_jobs_tco_did_not_launch_are_said_as_theirs_and_open_their_task(ops_users):
    now = timezone.now()
    # The demo's sweep: job 4242 under engineering, not a tco campaign; runs 5 and 8 fail on purpose.
    for n, state, minutes_ago in ((1, "done", 12), (5, "failed", 10), (8, "failed", 8)):
        make_task(None, task_number=n, job_number=4242, project="engineering", state=state,
                  started_at=now - dt.timedelta(minutes=minutes_ago), wallclock_s=30)
    admin = _tiles(ops_users["admin"], now)["failed"]
    assert (admin["number"], admin["value"], admin["level"]) == (2, "2 tasks", "amber")
    # "2 of jobs not launched by tco" read as broken English (fresh user, 2026-12-03).
    assert admin["detail"] == "of 3 tasks that ended; 2 tasks of jobs tco did not launch (job 4242)"
    from dashboards.models import Task
    newest = Task.objects.get(job_number=4242, task_number=8)  # it ended last, 2 min after task 5
    assert admin["href"] == f"/tasks/{newest.pk}/"
    # A team lead is not shown other accounts' jobs at all (core.scope: a campaign's tasks only).
    lead = _tiles(ops_users["lead"], now)["failed"]
    assert (lead["number"], lead["detail"]) == (0, "of 0 tasks that ended")
    # A campaign's failure, when there is one, is what the tile opens.
    campaign = make_campaign(team=Team.objects.get(project="research"), user=ops_users["launcher"], name="f")
    make_task(campaign, task_number=1, state="failed", started_at=now - dt.timedelta(minutes=5), wallclock_s=10)
    assert _tiles(ops_users["admin"], now)["failed"]["href"] == f"/campaigns/{campaign.pk}/?state=failed"


def test_a_host_the_banner_names_unreachable_is_counted_down_by_the_tile(ops_users):
    # The execd of mh-exec1 is silent: qhost has no load from it (qhost_F_unknown.xml) while its queue
    # instance has no "u" yet (qstat_f_running.xml). A task there whose runner finished 5 min ago is named
    # in the admins' health banner; the hosts tile counted 0 down beside it.
    from dashboards.core import health

    _poll("qhost_F_unknown.xml", "qstat_f_running.xml")
    ended = timezone.now() - dt.timedelta(minutes=5)
    from tests.support.campaigns import make_campaign as make_listed

    make_listed(team=Team.objects.get(project="research"), user=ops_users["admin"], name="silent", job_number=7,
                tasks=[{"state": "running", "host": "mh-exec1", "active": True,
                        "runner_record": {"version": 2, "exit_status": 0}, "agent_exited_at": ended,
                        "teardown_done_at": ended}])
    [silence] = health.execd_silences()
    assert (silence.host, silence.no_load) == ("mh-exec1", True)
    hosts = _tiles(ops_users["admin"])["hosts"]
    assert (hosts["value"], hosts["number"], hosts["detail"]) == ("1 of 3 hosts", 1, "mh-exec1 unreachable")


def test_the_failures_tile_says_how_many_the_infrastructure_failed(ops_users):
    # A fresh user read 22 tasks failed by a host crash as the agents' failures: the tile now says apart those
    # whose failure is the infrastructure's (core.failures: lost, a scheduler's failed code, tco's runner/proxy).
    from dashboards.models import Task

    now = timezone.now()
    campaign = make_campaign(team=Team.objects.get(project="research"), user=ops_users["launcher"])
    for n, state in ((1, "done"), (2, "failed"), (3, "failed"), (4, "lost")):
        make_task(campaign, task_number=n, state=state, started_at=now - dt.timedelta(minutes=10), wallclock_s=30)
    Task.objects.filter(campaign=campaign, task_number=2).update(failed_code=19, exit_status=0)  # host lost
    Task.objects.filter(campaign=campaign, task_number=3).update(failed_code=0, exit_status=3)   # the agent's
    tile = _tiles(ops_users["lead"], now)["failed"]
    assert (tile["number"], tile["detail"]) == (3, "of 4 tasks that ended; 2 the infrastructure's")
    Task.objects.filter(campaign=campaign, task_number__in=(2, 4)).update(state="done", failed_code=0)
    assert _tiles(ops_users["lead"], now)["failed"]["detail"] == "of 4 tasks that ended"
