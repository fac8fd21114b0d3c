"""Several clusters in one tco (issue 26, docs/clusters.md), without a scheduler: the real two cells are
tests/integration/test_two_clusters.py."""
from __future__ import annotations

import contextlib
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from dashboards.core import enqueue

#: The real ``enqueue.send`` (the suite records worker tasks instead; this test checks their routing).
REAL_SEND = enqueue.send
from dashboards.core.clusters import cluster_get_default, clusters_watched, scheduler_for, submit_queue
from dashboards.models import Cluster, ControlRequest, Team
from schedulers.base import SchedulerUnavailable
from tests.support.history import make_campaign

pytestmark = pytest.mark.django_db


@pytest.fixture
def second(bootstrap) -> Cluster:
    out = StringIO()
    call_command("tco_cluster", "add", "second", "--cell", "second", "--qmaster-port", "6544", "--execd-port", "6545",
                 "--flavour", "sge8", "--time-zone", "Europe/Berlin", stdout=out)
    assert "queue submit.second" in out.getvalue()
    return Cluster.objects.get(name="second")


def test_a_cluster_is_added_with_its_cell_ports_and_accounting_file(second):
    assert (second.sge_cell, second.qmaster_port, second.execd_port, second.time_zone) == (
        "second", 6544, 6545, "Europe/Berlin")
    assert second.accounting_path == "/var/lib/gridengine/second/common/accounting"
    assert [c.name for c in clusters_watched()] == [cluster_get_default().name, "second"]
    out = StringIO()
    call_command("tco_cluster", "list", "--names", stdout=out)
    assert out.getvalue().split() == [cluster_get_default().name, "second"]
    with pytest.raises(CommandError, match="exists"):
        call_command("tco_cluster", "add", "second", stdout=StringIO())
    with pytest.raises(CommandError, match="unknown time zone"):
        call_command("tco_cluster", "set", "second", "--time-zone", "Mars/Olympus", stdout=StringIO())


def test_every_command_of_a_cluster_runs_in_its_cell_with_its_ports(second, monkeypatch):
    import schedulers.gridengine.adapter as gridengine

    seen = []

    def run_command(argv, *, timeout, env_extra):
        seen.append(env_extra)
        raise SchedulerUnavailable("not reached")

    monkeypatch.setattr(gridengine, "run_command", run_command)
    for cluster in (cluster_get_default(), second):
        with pytest.raises(SchedulerUnavailable):
            scheduler_for(cluster).list_tasks()
    assert seen[0] == {"SGE_ROOT": "/var/lib/gridengine", "SGE_CELL": cluster_get_default().sge_cell}
    assert seen[1] == {"SGE_ROOT": "/var/lib/gridengine", "SGE_CELL": "second", "SGE_QMASTER_PORT": "6544",
                       "SGE_EXECD_PORT": "6545"}


def test_the_drmaa_session_of_a_process_is_bound_to_one_cell_and_its_ports(monkeypatch):
    from schedulers.gridengine import drmaa

    monkeypatch.setenv("SGE_ROOT", "/var/lib/gridengine")
    monkeypatch.setenv("SGE_CELL", "second")
    monkeypatch.setenv("SGE_QMASTER_PORT", "6544")
    drmaa._check_cell("/var/lib/gridengine", "second", {"SGE_QMASTER_PORT": "6544"})
    with pytest.raises(SchedulerUnavailable, match="SGE_QMASTER_PORT=6544, not 6444"):
        drmaa._check_cell("/var/lib/gridengine", "second", {"SGE_QMASTER_PORT": "6444"})


def test_submissions_and_control_requests_go_to_their_clusters_submit_worker(second, ops_users, monkeypatch):
    sent = []
    monkeypatch.setattr(enqueue, "send", REAL_SEND)
    monkeypatch.setattr(enqueue.current_app, "send_task", lambda name, args, **options: sent.append((name, options)))
    research = Team.objects.get(project="research")
    here = make_campaign(team=research, user=ops_users["launcher"], name="here", status="submitting")
    there = make_campaign(team=research, user=ops_users["launcher"], name="there", status="submitting")
    type(there).objects.filter(pk=there.pk).update(cluster=second)
    enqueue.send(enqueue.SUBMIT_CAMPAIGN, here.pk)
    enqueue.send(enqueue.SUBMIT_CAMPAIGN, there.pk)
    request = ControlRequest.objects.create(cluster=second, campaign=there, action="campaign_cancel",
                                            control="delete", job_number=1)
    enqueue.send(enqueue.CONTROL_JOB, request.pk)
    enqueue.send(enqueue.NOTIFY_CAMPAIGN_FINISHED, there.pk, queue="ingest")
    assert sent == [(enqueue.SUBMIT_CAMPAIGN, {"queue": "submit"}), (enqueue.SUBMIT_CAMPAIGN, {"queue": "submit.second"}),
                    (enqueue.CONTROL_JOB, {"queue": "submit.second"}),
                    (enqueue.NOTIFY_CAMPAIGN_FINISHED, {"queue": "ingest"})]
    assert submit_queue(cluster_get_default()) == "submit"


def test_each_cluster_is_polled_by_a_task_of_its_own_and_one_failing_leaves_the_other(second, monkeypatch):
    import worker.tasks as tasks

    @contextlib.contextmanager
    def always_mine(name, timeout):
        yield True

    monkeypatch.setattr(tasks, "single_flight", always_mine)
    queued = []
    monkeypatch.setattr(tasks.poll_queue, "apply_async", lambda args, expires: queued.append(args))
    assert tasks.poll_queue() == {"queued": [cluster_get_default().name, "second"], "kind": "poll"}
    assert queued == [[cluster_get_default().name], ["second"]]

    def work(cluster):
        if cluster.name == "second":
            raise SchedulerUnavailable("second: unable to contact qmaster")
        return {"ok": cluster.name}

    out = tasks.on_each_cluster("test", 10, work)
    assert out == {cluster_get_default().name: {"ok": cluster_get_default().name},
                   "second": {"error": "second: unable to contact qmaster"}}
    assert tasks.on_each_cluster("test", 10, work, only="second") == {"second": {"error": "second: unable to contact qmaster"}}


def test_the_launch_form_offers_the_cluster_once_there_are_two(bootstrap, ops_users):
    from dashboards.web.forms import LaunchForm

    form = LaunchForm(user=ops_users["launcher"])
    assert form.fields["cluster"].widget.is_hidden
    Cluster.objects.create(name="second", sge_root="/var/lib/gridengine", sge_cell="second", accounting_path="/x")
    form = LaunchForm(user=ops_users["launcher"])
    assert not form.fields["cluster"].widget.is_hidden
    assert form.fields["cluster"].initial == cluster_get_default().name
    assert [c.name for c in form.fields["cluster"].queryset] == sorted([cluster_get_default().name, "second"])
