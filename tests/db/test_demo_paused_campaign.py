"""make demo's job that stays pending (issue 24, round 4): ``tco_demo_campaign --pause`` launches a
capped campaign as the launcher and pauses it through tco's control path, so triage finds it held by
the launcher with Release to offer. The submit worker is this process here (a fake scheduler)."""
from __future__ import annotations

import pytest
from django.core.management import call_command

from dashboards.core import enqueue
from dashboards.core.holds import tco_holds
from dashboards.models import AuditEntry, Campaign, ControlRequest, Task
from schedulers.fake import FakeScheduler


@pytest.mark.django_db(transaction=True)
def test_the_demo_leaves_a_campaign_paused_by_its_launcher(ops_users, monkeypatch, capsys):
    from dashboards.control.actions import control_execute
    from dashboards.launch.submit import campaign_submit

    fake = FakeScheduler()
    sent = []

    def send(name, *args, queue=None):  # the submit worker, inline
        sent.append(name)
        if name == enqueue.SUBMIT_CAMPAIGN:
            campaign_submit(campaign_id=args[0], scheduler=fake)
        elif name == enqueue.CONTROL_JOB:
            control_execute(request_id=args[0], scheduler=fake)

    monkeypatch.setattr(enqueue, "send", send)
    call_command("tco_demo_campaign", "--count", "5", "--user", "launcher", "--name", "nightly-eval", "--pause")
    campaign = Campaign.objects.get(name="nightly-eval")
    assert campaign.launched_by == ops_users["launcher"] and campaign.team.project == "research"
    assert campaign.concurrency_cap == 1 and campaign.job_number is not None
    assert sent == [enqueue.SUBMIT_CAMPAIGN, enqueue.CONTROL_JOB]
    # No task had started (the fake starts none): all five held, by the launcher, through tco, audited.
    assert fake.control_calls == [["qhold", f"{campaign.job_number}.1-5"]]
    request = ControlRequest.objects.get(campaign=campaign)
    assert (request.state, request.user, request.action) == ("done", ops_users["launcher"], "campaign_pause")
    assert AuditEntry.objects.get(pk=request.audit_id).ok
    hold = tco_holds(campaign.cluster, [campaign])[campaign.job_number]
    assert (hold["verb"], hold["who"]) == ("paused", "launcher")
    assert Task.objects.filter(campaign=campaign).count() == 5
    assert "tasks 1-5 paused by launcher" in capsys.readouterr().out


@pytest.mark.django_db(transaction=True)
def test_a_second_demo_cancels_the_first_ones_paused_campaign_through_tco(ops_users, monkeypatch, capsys):
    """make demo twice (no make stop deletes jobs): the first run's paused nightly-eval is deleted through
    tco's control path (qdel, audited, as the launcher), not left held beside the second one."""
    from dashboards.control.actions import control_execute
    from dashboards.launch.submit import campaign_submit

    fake = FakeScheduler()

    def send(name, *args, queue=None):  # the submit worker, inline
        if name == enqueue.SUBMIT_CAMPAIGN:
            campaign_submit(campaign_id=args[0], scheduler=fake)
        elif name == enqueue.CONTROL_JOB:
            control_execute(request_id=args[0], scheduler=fake)

    monkeypatch.setattr(enqueue, "send", send)
    args = ("tco_demo_campaign", "--count", "3", "--user", "launcher", "--name", "nightly-eval", "--pause", "--replace")
    call_command(*args)
    first = Campaign.objects.get(name="nightly-eval")
    # The same user's campaign of another name is not touched.
    call_command("tco_demo_campaign", "--count", "2", "--user", "launcher", "--name", "other", "--pause")
    other = Campaign.objects.get(name="other")
    call_command(*args)
    second = Campaign.objects.exclude(pk__in=[first.pk, other.pk]).get(name="nightly-eval")
    # The earlier campaign's job deleted before the new one is held; the other campaign's job left held.
    assert fake.control_calls == [["qhold", f"{first.job_number}.1-3"], ["qhold", f"{other.job_number}.1-2"],
                                  ["qdel", f"{first.job_number}"], ["qhold", f"{second.job_number}.1-3"]]
    cancel = ControlRequest.objects.get(campaign=first, action="campaign_cancel")
    assert (cancel.state, cancel.user) == ("done", ops_users["launcher"]) and AuditEntry.objects.get(pk=cancel.audit_id).ok
    assert not ControlRequest.objects.filter(campaign=other, action="campaign_cancel").exists()
    assert f"campaign {first.pk} (nightly-eval, job {first.job_number}) of an earlier run: cancel requested" \
        in capsys.readouterr().out


def test_pause_needs_two_tasks_or_more(ops_users):
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="--count 2 or more"):
        call_command("tco_demo_campaign", "--count", "1", "--user", "launcher", "--pause")
    assert not Campaign.objects.exists()
