"""A submitter killed between the DRMAA call and the commit, on the real dev cluster: the
reconciler finds the job by its name in qstat and adopts it; the campaign ends with one job.
Another install sharing the cell (another install id, the same campaign id and name, the same
submit account) does not find that job (issue 23, trust7)."""
from __future__ import annotations

import pytest

from dashboards.core import enqueue
from dashboards.core.clusters import scheduler_for
from dashboards.launch import submit
from dashboards.launch.service import LaunchRequest, launch
from dashboards.models import AgentDefinition, Campaign, CampaignStatus, Install, Task, Team
from tests.support.cluster import qdel_quietly, qstat_jobs

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


class Killed(BaseException):
    pass


def test_a_killed_submitter_leaves_one_job_which_the_reconciler_adopts(ops_users, monkeypatch, settings):
    monkeypatch.setattr(enqueue, "send", lambda *args, **kw: None)
    campaign = launch(user=ops_users["launcher"], request=LaunchRequest(
        team=Team.objects.get(project="research"), agent_definition=AgentDefinition.objects.get(name="demo-agent"),
        inputs=[{"task": n, "duration_s": 30.0} for n in (1, 2)], name="killed-submitter")).campaign
    accepted = []

    def die(job_number):
        accepted.append(job_number)
        raise Killed()

    try:
        with pytest.raises(Killed):
            submit.campaign_submit(campaign_id=campaign.pk, after_submit=die)
        assert Campaign.objects.get(pk=campaign.pk).job_number is None
        name = submit.campaign_job_name(campaign)
        assert [n for n, job in qstat_jobs().items() if job["name"] == name] == accepted
        assert name == f"tco-{Install.objects.get(pk=1).install_id}-c{campaign.pk}-killed-submitter"

        # Install B, on the same cell and account, with a campaign of the same id and name: its lookup
        # (qstat of the real cell, then its polled tasks and accounting) does not find A's job.
        mine, settings.TCO_INSTALL_ID = settings.TCO_INSTALL_ID, "trust7b"
        assert submit.find_campaign_job(campaign, scheduler_for(campaign.cluster)) is None
        settings.TCO_INSTALL_ID = mine

        out = submit.reconcile_submissions(grace_s=0)
        assert campaign.pk in out["adopted"]
        done = Campaign.objects.get(pk=campaign.pk)
        assert done.status == CampaignStatus.SUBMITTED and done.job_number == accepted[0]
        assert Task.objects.filter(campaign=done).count() == 2
        # No second job, whatever runs next.
        submit.campaign_submit(campaign_id=campaign.pk)
        assert submit.reconcile_submissions(grace_s=0)["adopted"] == []
        assert [n for n, job in qstat_jobs().items() if job["name"] == name] == accepted
    finally:
        qdel_quietly(*accepted)
