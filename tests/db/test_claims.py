"""Explicit states and the reconciler (issue 10, item 6): a submitter or control worker killed
between its claim and its commit leaves work that ends right, exactly once (fake scheduler)."""
from __future__ import annotations

import datetime as dt
import importlib
import subprocess
import sys

import pytest
from django.apps import apps
from django.utils import timezone

from dashboards.control import actions
from dashboards.control_models import ControlState
from dashboards.core import enqueue
from dashboards.launch import submit
from dashboards.launch.service import LaunchRequest, launch
from dashboards.models import (
    CAMPAIGN_TRANSITIONS,
    AgentDefinition,
    AuditEntry,
    Campaign,
    CampaignStatus,
    ControlRequest,
    Install,
    Task,
    Team,
    transition,
)
from schedulers.base import SchedulerUnavailable
from schedulers.fake import FakeScheduler

pytestmark = pytest.mark.django_db


class Killed(BaseException):
    """Stands for the worker dying (SIGKILL, OOM): nothing after it runs, no except clause catches it."""


def die(*args):
    raise Killed()


@pytest.fixture
def sent(monkeypatch):
    calls = []
    monkeypatch.setattr(enqueue, "send", lambda name, *args, **kw: calls.append((name, args)))
    return calls


@pytest.fixture
def campaign(ops_users, bootstrap, sent):
    team = Team.objects.get(project="research")
    agent = AgentDefinition.objects.get(name="demo-agent")
    return launch(user=ops_users["launcher"], request=LaunchRequest(
        team=team, agent_definition=agent, inputs=[{"task": n} for n in (1, 2, 3)], name="claims")).campaign


def reconcile(fake, **kw):
    return submit.reconcile_submissions(scheduler=fake, grace_s=0, **kw)


def test_a_submitter_killed_after_the_drmaa_call_is_adopted_never_resubmitted(campaign, sent):
    fake = FakeScheduler(first_job_number=500)
    with pytest.raises(Killed):
        submit.campaign_submit(campaign_id=campaign.pk, scheduler=fake, after_submit=die)
    stuck = Campaign.objects.get(pk=campaign.pk)
    assert stuck.status == CampaignStatus.SUBMITTING and stuck.job_number is None
    assert stuck.submit_claimed_at is not None and stuck.submit_claimed_by and len(fake.submissions) == 1

    # A duplicated delivery of the submit message while claimed does nothing.
    assert submit.campaign_submit(campaign_id=campaign.pk, scheduler=fake).job_number is None
    assert reconcile(fake) == {"adopted": [campaign.pk], "released": [], "requeued": [], "rejected": []}
    done = Campaign.objects.get(pk=campaign.pk)
    assert done.status == CampaignStatus.SUBMITTED and done.job_number == 500 and done.submit_claimed_at is None
    assert sorted(Task.objects.filter(campaign=done).values_list("task_number", flat=True)) == [1, 2, 3]
    # Once: nothing more on a second pass, on a late redelivery, or by the scheduler.
    assert reconcile(fake) == {"adopted": [], "released": [], "requeued": [], "rejected": []}
    submit.campaign_submit(campaign_id=campaign.pk, scheduler=fake)
    assert len(fake.submissions) == 1 and Task.objects.filter(campaign=done).count() == 3


def test_a_submitter_killed_before_the_drmaa_call_is_released_and_submitted_once(campaign, sent, monkeypatch):
    fake = FakeScheduler(first_job_number=600)
    monkeypatch.setattr(fake, "submit_array", die)
    with pytest.raises(Killed):
        submit.campaign_submit(campaign_id=campaign.pk, scheduler=fake)
    monkeypatch.undo()
    assert fake.submissions == []
    assert reconcile(fake)["released"] == [campaign.pk]
    assert Campaign.objects.get(pk=campaign.pk).submit_claimed_at is None
    done = submit.campaign_submit(campaign_id=campaign.pk, scheduler=fake)
    assert done.status == CampaignStatus.SUBMITTED and done.job_number == 600 and len(fake.submissions) == 1
    assert done.submit_attempts == 2


def test_a_job_accepted_while_the_scheduler_looked_unreachable_is_adopted_on_the_retry(campaign, monkeypatch):
    fake = FakeScheduler(first_job_number=700)
    real_submit = fake.submit_array

    def accepted_then_timeout(spec):
        real_submit(spec)
        raise SchedulerUnavailable("qmaster did not answer in time")

    monkeypatch.setattr(fake, "submit_array", accepted_then_timeout)
    with pytest.raises(SchedulerUnavailable):
        submit.campaign_submit(campaign_id=campaign.pk, scheduler=fake)
    assert Campaign.objects.get(pk=campaign.pk).submit_claimed_at is None  # released for the retry
    monkeypatch.setattr(fake, "submit_array", real_submit)
    retried = submit.campaign_submit(campaign_id=campaign.pk, scheduler=fake)
    assert retried.job_number == 700 and len(fake.submissions) == 1  # found by name, not submitted again


def test_a_job_that_already_left_qstat_is_found_in_what_the_polls_recorded(campaign):
    fake = FakeScheduler(first_job_number=800)
    with pytest.raises(Killed):
        submit.campaign_submit(campaign_id=campaign.pk, scheduler=fake, after_submit=die)
    fake.run_to_completion(800)
    assert fake.list_tasks() == []
    now = timezone.now()
    name = submit.campaign_job_name(campaign)
    assert name == f"tco-{Install.objects.get(pk=1).install_id}-c{campaign.pk}-claims"
    for n in (1, 2, 3):  # the poll saw the job before it ended
        Task.objects.create(cluster=campaign.cluster, job_number=800, task_number=n, is_array=True, name=name,
                            owner="tco", state="done", active=False, submitted_at=now)
    assert reconcile(fake)["adopted"] == [campaign.pk]
    assert Campaign.objects.get(pk=campaign.pk).job_number == 800 and len(fake.submissions) == 1


def test_an_unreachable_scheduler_releases_nothing(campaign):
    fake = FakeScheduler()
    with pytest.raises(Killed):
        submit.campaign_submit(campaign_id=campaign.pk, scheduler=fake, after_submit=die)
    fake.unavailable = True
    with pytest.raises(SchedulerUnavailable):
        reconcile(fake)
    assert Campaign.objects.get(pk=campaign.pk).submit_claimed_at is not None


def test_a_fresh_claim_of_a_live_worker_is_left_alone(campaign):
    fake = FakeScheduler()
    with pytest.raises(Killed):
        submit.campaign_submit(campaign_id=campaign.pk, scheduler=fake, after_submit=die)
    assert submit.reconcile_submissions(scheduler=fake, grace_s=3600) == {"adopted": [], "released": [],
                                                                             "requeued": [], "rejected": []}


def test_a_claim_of_a_dead_process_on_this_host_is_stale_at_once():
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = f"{submit.claim_owner().rpartition(':')[0]}:{int(child.stdout)}"
    now = timezone.now()
    assert submit.claim_is_stale(dead, now, now=now, grace_s=3600)
    assert not submit.claim_is_stale(submit.claim_owner(), now, now=now, grace_s=3600)
    assert submit.claim_is_stale(submit.claim_owner(), now - dt.timedelta(seconds=61), now=now, grace_s=60)


def test_a_submission_never_picked_up_is_sent_again(campaign, sent):
    Campaign.objects.filter(pk=campaign.pk).update(launched_at=timezone.now() - dt.timedelta(hours=1))
    sent.clear()
    out = submit.reconcile_submissions(scheduler=FakeScheduler(), grace_s=60)
    assert out["requeued"] == [campaign.pk] and sent == [(enqueue.SUBMIT_CAMPAIGN, (campaign.pk,))]


def test_states_move_only_along_the_allowed_transitions(campaign):
    with pytest.raises(ValueError, match="submitting -> finished is not an allowed transition"):
        transition(Campaign.objects.filter(pk=campaign.pk), field="status", transitions=CAMPAIGN_TRANSITIONS,
                   source=CampaignStatus.SUBMITTING, target=CampaignStatus.FINISHED)
    assert Campaign.objects.get(pk=campaign.pk).status == CampaignStatus.SUBMITTING
    assert set(CampaignStatus.values) == set(CAMPAIGN_TRANSITIONS)


# --------------------------------------------------------------------------- control requests

@pytest.fixture
def submitted(campaign):
    fake = FakeScheduler(first_job_number=900)
    return submit.campaign_submit(campaign_id=campaign.pk, scheduler=fake), fake


def test_a_control_worker_killed_before_its_commit_is_run_again_and_recorded_once(ops_users, submitted, sent):
    campaign, fake = submitted
    request = actions.campaign_control(user=ops_users["launcher"], campaign=campaign, action="cancel")
    with pytest.raises(Killed):
        actions.control_execute(request_id=request.pk, scheduler=fake, after_control=die)
    assert ControlRequest.objects.get(pk=request.pk).state == ControlState.CLAIMED
    sent.clear()
    out = actions.reconcile_control_requests(grace_s=0)
    assert out["released"] == [request.pk]
    assert ControlRequest.objects.get(pk=request.pk).state == ControlState.QUEUED
    done = actions.control_execute(request_id=request.pk, scheduler=fake)
    # The first qdel went through before the worker died; the repeat finds the job gone: done, once.
    assert done.state == ControlState.DONE and done.attempts == 2 and "gone already" in done.result
    assert fake.list_tasks() == [] and [c[0] for c in fake.control_calls] == ["qdel"]  # the fake logs accepted calls
    assert done.finished_at is not None
    entry = AuditEntry.objects.get(pk=done.audit_id)
    assert entry.params["status"] == done.state and entry.result == done.result
    # Settled: nothing more happens.
    assert actions.reconcile_control_requests(grace_s=0) == {"released": [], "requeued": [], "given_up": []}
    assert actions.control_execute(request_id=request.pk, scheduler=fake).attempts == 2


def test_a_hold_repeated_after_a_dead_worker_ends_done(ops_users, submitted):
    campaign, fake = submitted
    request = actions.campaign_control(user=ops_users["launcher"], campaign=campaign, action="pause")
    with pytest.raises(Killed):
        actions.control_execute(request_id=request.pk, scheduler=fake, after_control=die)
    actions.reconcile_control_requests(grace_s=0)
    done = actions.control_execute(request_id=request.pk, scheduler=fake)
    assert done.state == ControlState.DONE and all(t.held for t in fake.tasks.values())


def test_a_request_whose_workers_keep_dying_is_given_up(ops_users, submitted):
    campaign, fake = submitted
    request = actions.campaign_control(user=ops_users["launcher"], campaign=campaign, action="pause")
    for _ in range(actions.MAX_ATTEMPTS):
        with pytest.raises(Killed):
            actions.control_execute(request_id=request.pk, scheduler=fake, after_control=die)
        actions.reconcile_control_requests(grace_s=0)
    final = ControlRequest.objects.get(pk=request.pk)
    assert final.state == ControlState.GIVEN_UP and final.attempts == actions.MAX_ATTEMPTS
    assert AuditEntry.objects.get(pk=final.audit_id).params["status"] == "given_up"


# --------------------------------------------------------------------------- the data migration

def test_the_migration_moves_queued_audit_entries_and_stuck_campaigns_into_states(campaign, ops_users):
    Campaign.objects.filter(pk=campaign.pk).update(status="submitted")  # the old claim: no job number
    running = AuditEntry.objects.create(user=ops_users["admin"], action="triage_hold", target="job:5", ok=False,
                                        result="running", params={"status": "queued", "cluster": campaign.cluster.pk,
                                                                  "control": "hold", "job_number": 5, "tasks": None})
    queued = AuditEntry.objects.create(user=ops_users["launcher"], action="campaign_cancel", ok=False,
                                       target=f"campaign:{campaign.pk}", result="queued for the submit worker",
                                       params={"status": "queued", "cluster": campaign.cluster.pk,
                                               "control": "delete", "job_number": 6, "tasks": [[1, 2]],
                                               "campaign": campaign.pk})
    AuditEntry.objects.create(user=None, action="launch", ok=True, result="campaign 1 accepted", params={})
    migration = importlib.import_module("dashboards.migrations.0007_launch_states_endpoints_ceilings")
    migration.forward(apps, None)
    by_audit = {r.audit_id: r for r in ControlRequest.objects.all()}
    assert set(by_audit) == {running.pk, queued.pk}
    assert by_audit[running.pk].state == "claimed" and by_audit[running.pk].claimed_at == running.at
    assert by_audit[queued.pk].state == "queued" and by_audit[queued.pk].tasks == [[1, 2]]
    assert by_audit[queued.pk].campaign_id == campaign.pk and by_audit[queued.pk].control == "delete"
    moved = Campaign.objects.get(pk=campaign.pk)
    assert moved.status == "submitting" and moved.submit_claimed_at == moved.launched_at


def test_a_job_submitted_before_the_install_id_or_the_name_changed_is_still_adopted_never_doubled(
        campaign, sent, settings):
    # Review: the name was computed again at each look-up, so a change of TCO_INSTALL_ID (or of the
    # campaign's name) between the DRMAA call and the reconciler made the job unfindable and the
    # campaign was submitted a second time, its tasks run twice.
    settings.TCO_INSTALL_ID = "sitea"
    fake = FakeScheduler(first_job_number=800)
    with pytest.raises(Killed):
        submit.campaign_submit(campaign_id=campaign.pk, scheduler=fake, after_submit=die)
    assert fake.submissions[0][1].name == f"tco-sitea-c{campaign.pk}-claims"
    settings.TCO_INSTALL_ID = "siteb"
    Campaign.objects.filter(pk=campaign.pk).update(name="renamed")
    assert reconcile(fake)["adopted"] == [campaign.pk]
    done = Campaign.objects.get(pk=campaign.pk)
    assert (done.status, done.job_number, len(fake.submissions)) == (CampaignStatus.SUBMITTED, 800, 1)
    assert done.job_name == f"tco-sitea-c{campaign.pk}-claims"
    assert set(Task.objects.filter(campaign=done).values_list("name", flat=True)) == {done.job_name}
