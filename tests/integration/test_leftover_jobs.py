"""A cluster test that fails before its own qdel leaves nothing on the shared cluster: the teardown hook
(tests/conftest.py, ``tests.support.cluster.qdel_leftover_campaign_jobs``) deletes its campaigns' jobs,
matched by number and name, and never a job of the same number that is not this database's."""
from __future__ import annotations

import time

from django.utils import timezone

from dashboards.core.clusters import cluster_get_default
from dashboards.launch.service import LaunchRequest, launch
from dashboards.launch.submit import campaign_submit
from dashboards.models import AgentDefinition, Campaign, Install, Team
from tests.support.cluster import job_gone_or_deleting, qdel_leftover_campaign_jobs, qdel_quietly, qstat_jobs


def _long_campaign(admin) -> Campaign:
    """Two demo agents of 300 s each, submitted: a job the cluster lists for the whole test."""
    request = LaunchRequest(team=Team.objects.get(project="research"), name="itest-leftover",
                            agent_definition=AgentDefinition.objects.get(name="demo-agent"),
                            inputs=[{"task": n, "duration_s": 300.0} for n in (1, 2)])
    return campaign_submit(campaign_id=launch(user=admin, request=request).campaign.pk)


def test_a_campaign_left_on_the_cluster_is_deleted_and_a_namesake_number_is_not(bootstrap, django_user_model):
    admin = django_user_model.objects.get(username="admin")
    campaign = _long_campaign(admin)
    team, agent = campaign.team, campaign.agent_definition
    job = campaign.job_number
    try:
        assert qstat_jobs()[job]["name"] == f"tco-{Install.objects.get(pk=1).install_id}-c{campaign.pk}-itest-leftover"
        # A campaign of this database whose number is the job's but whose job name is not (a number reused):
        # never deleted by it. The name is the one its first submission claim stored (Campaign.job_name).
        stored = Campaign.objects.get(pk=campaign.pk).job_name
        assert stored == qstat_jobs()[job]["name"]
        Campaign.objects.filter(pk=campaign.pk).update(name="someone-elses", job_name="tco-x-c0-someone-elses")
        assert qdel_leftover_campaign_jobs() == []
        assert not job_gone_or_deleting(job)
        Campaign.objects.filter(pk=campaign.pk).update(name="itest-leftover", job_name=stored)
        # A campaign with a job number the cluster does not list (a test's made-up number): nothing to do.
        Campaign.objects.create(name="made-up", cluster=cluster_get_default(), team=team, agent_definition=agent,
                                launched_by=admin, queue="agent.q", task_count=1, job_number=job + 100_000,
                                launched_at=timezone.now())
        assert qdel_leftover_campaign_jobs() == [job]
        deadline = time.monotonic() + 30
        while not job_gone_or_deleting(job) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert job_gone_or_deleting(job)
    finally:
        qdel_quietly(job)
