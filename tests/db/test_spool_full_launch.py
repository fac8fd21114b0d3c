"""A full spool, as the web side meets it: a launch whose files cannot be written is refused with the
reason and records nothing; a task whose runner could not write its record reads as tco's failure,
retryable with the infrastructure's (docs/reliability.md, "The spool's disk full")."""
from __future__ import annotations

import errno

import pytest

from dashboards.core import failures
from dashboards.core.errors import LaunchError
from dashboards.launch import service
from dashboards.launch import spool as launch_spool
from dashboards.models import AuditEntry, Campaign, Task
from tests.support.history import make_campaign

pytestmark = pytest.mark.django_db


def test_a_launch_onto_a_full_spool_is_refused_with_the_reason_and_records_nothing(ops_users, research, agent, sent,
                                                                                  monkeypatch):
    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(launch_spool, "campaign_spool_write", full)
    with pytest.raises(LaunchError, match="could not be written to the spool: No space left on device; nothing was"):
        service.launch(user=ops_users["launcher"], request=service.LaunchRequest(
            team=research, agent_definition=agent, inputs=[{"task": 1}], name="onto-full"))
    assert not Campaign.objects.exists() and sent == []
    entry = AuditEntry.objects.get()
    assert not entry.ok and "No space left on device" in entry.result


def test_a_task_whose_runner_left_no_record_after_an_internal_error_is_the_infrastructures(ops_users, research):
    campaign = make_campaign(team=research, user=ops_users["launcher"], count=3)
    cases = {1: (70, None), 2: (70, {"flags": [], "error": None}), 3: (3, None)}
    for number, (status, record) in cases.items():
        Task.objects.create(cluster=campaign.cluster, campaign=campaign, job_number=campaign.job_number,
                            task_number=number, name=campaign.name, state="failed", active=False, failed_code=0,
                            exit_status=status, host="sge-exec1", runner_record=record)
    text = failures.failure_of(state="failed", failed_code=0, exit_status=70, host="sge-exec1").text
    assert text.startswith("tco's runner failed on sge-exec1 before it could write its record (exit status 70")
    assert failures.failure_of(state="failed", failed_code=0, exit_status=70, runner={"flags": []}).kind == "agent"
    assert list(Task.objects.filter(campaign=campaign).filter(failures.infrastructure_filter())
                .values_list("task_number", flat=True)) == [1]
    assert failures.infrastructure_failed(campaign) == 1
