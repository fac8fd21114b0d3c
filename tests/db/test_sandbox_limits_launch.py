"""A campaign's sandbox memory and disk limits: set on the launch form within the site's maxima,
written to the runner spec, kept by a retry, and shown on the task page with the limit that
stopped a task (issue 23, finding 1; docs/limits.md)."""
from __future__ import annotations


import pytest

from dashboards.core.errors import LaunchError
from dashboards.launch import service
from dashboards.launch import spool as launch_spool
from dashboards.models import AuditEntry, Campaign, Task
from tests.support.forms import launch_data
from tests.support.history import make_campaign, make_task

pytestmark = pytest.mark.django_db

GIB, MIB = 1 << 30, 1 << 20


@pytest.fixture
def site_limits(settings):
    """The site's ceilings: 2 GiB of memory, 3 GiB of work directory per task."""
    settings.TCO_SANDBOX_LIMITS = {"TCO_SANDBOX_MEMORY_BYTES": str(2 * GIB), "TCO_SANDBOX_WORK_BYTES": str(3 * GIB)}
    return settings


def _launch(user, team, agent, **kwargs):
    return service.launch(user=user, request=service.LaunchRequest(
        team=team, agent_definition=agent, inputs=[{"task": 1}, {"task": 2}], name="limited", **kwargs))


def test_a_campaigns_memory_and_disk_limits_reach_its_runner_spec_and_its_retry(ops_users, research, agent,
                                                                                site_limits, sent):
    campaign = _launch(ops_users["launcher"], research, agent, memory_bytes=GIB, work_bytes=512 * MIB).campaign
    spec = launch_spool.campaign_spec(campaign)
    assert spec["limits"] == {"memory_bytes": 1073741824, "work_bytes": 536870912}
    assert AuditEntry.objects.get(action="launch", ok=True).params["memory_bytes"] == 1073741824
    # A plain launch asks for nothing: its tasks take the site's values.
    plain = _launch(ops_users["launcher"], research, agent).campaign
    assert "limits" not in launch_spool.campaign_spec(plain)
    # The site lowers its memory ceiling below the campaign's: the retry keeps the rest, lowered to it.
    Task.objects.create(cluster=campaign.cluster, campaign=campaign, job_number=4242, task_number=2,
                        name="limited", state="failed", active=False)
    site_limits.TCO_SANDBOX_LIMITS = {"TCO_SANDBOX_MEMORY_BYTES": str(768 * MIB)}
    retry = service.campaign_retry(user=ops_users["launcher"], campaign=campaign).campaign
    assert launch_spool.campaign_spec(retry)["limits"] == {"memory_bytes": 805306368, "work_bytes": 536870912}


@pytest.mark.parametrize("kwargs, message", [
    ({"memory_bytes": 2 * GIB + 1}, "memory limit per task: 64 to 2048 MiB"),
    ({"memory_bytes": 64 * MIB - 1}, "memory limit per task: 64 to 2048 MiB"),
    ({"memory_bytes": True}, "memory limit per task"),
    ({"memory_bytes": "1073741824"}, "memory limit per task"),
    ({"work_bytes": 3 * GIB + 1}, "disk limit per task: 1 to 3072 MiB"),
    ({"work_bytes": 0}, "disk limit per task"),
])
def test_limits_outside_the_sites_range_are_refused_and_audited(ops_users, research, agent, site_limits, sent,
                                                                 kwargs, message):
    with pytest.raises(LaunchError, match=message):
        _launch(ops_users["launcher"], research, agent, **kwargs)
    assert not Campaign.objects.exists() and sent == []
    assert message in AuditEntry.objects.get(ok=False).result


def test_the_launch_form_is_bounded_by_the_sites_maxima_and_a_hostile_post_submits_nothing(as_user, site_limits,
                                                                                          sent):
    client = as_user("launcher")
    html = client.get("/ops/launch/").content.decode()
    memory = html.split('id="field-memory_mib"', 1)[1].split('<div class="field"', 1)[0]
    work = html.split('id="field-work_mib"', 1)[1].split('<div class="field"', 1)[0]
    assert 'max="2048"' in memory and 'min="64"' in memory and "blank: the site&#x27;s limit, 2048 MiB" in memory
    assert 'max="3072"' in work and 'min="1"' in work
    for field, value in (("memory_mib", "2049"), ("work_mib", "3073"), ("memory_mib", "63")):
        response = client.post("/ops/launch/", {**launch_data(**{field: value}), "launch": "1"})
        part = response.content.decode().split(f'id="field-{field}"', 1)[1].split('<div class="field"', 1)[0]
        assert response.status_code == 200 and "field-error" in part, (field, value)
    assert not Campaign.objects.exists() and sent == []
    response = client.post("/ops/launch/", {**launch_data(memory_mib="1024", work_mib="100"), "launch": "1"})
    campaign = Campaign.objects.get()
    assert response.status_code == 302
    assert launch_spool.campaign_spec(campaign)["limits"] == {"memory_bytes": 1073741824, "work_bytes": 104857600}


def _record(**sandbox_extra):
    return {"exit_status": None, "signal": 9, "hostname": "sge-exec2",
            "flags": ["memory_limit"], "error": "memory limit 1 GiB reached",
            "sandbox": {"limits": {"memory_bytes": GIB, "file_bytes": GIB, "cpu_s": 3600, "work_bytes": 2 * GIB,
                                   "max_processes": 256, "tmpfs_bytes": 256 * MIB},
                        "work_bytes": 5 * MIB, **sandbox_extra}}


def test_the_task_page_shows_the_limits_it_ran_with_and_the_one_that_stopped_it(as_user, ops_users, research,
                                                                                 site_limits):
    campaign = make_campaign(team=research, user=ops_users["launcher"], count=2)
    stopped = make_task(campaign, task_number=1, started_at=None, state="failed")
    Task.objects.filter(pk=stopped.pk).update(exit_status=137, failed_code=0, host="sge-exec2", runner_record=_record(
        memory_cgroup={"path": "/sys/fs/cgroup/memory/tco/x", "limit_bytes": GIB, "peak_bytes": GIB,
                       "oom_kills": 1}, seccomp="default deny-list, 64 calls"))
    client = as_user("viewer")
    html = client.get(f"/tasks/{stopped.pk}/").content.decode()
    card = html.split('id="limits"', 1)[1].split("</section>", 1)[0]
    assert "Stopped by a limit: memory limit 1 GiB reached" in card
    assert "1 GiB for the agent&#x27;s processes together (kernel memory cgroup), at most 1 GiB used" in card
    assert "2 GiB, 5 MiB used at the end" in card and "3600 s" in card and "256 MiB each" in card
    # The sandbox has only the scratch directories its policy lists (a fresh attacker found /var/tmp absent and
    # /dev/shm read-only where the card named all four at 256 MiB).
    assert "<th>each scratch directory the policy lists (/tmp, /var/tmp, /dev/shm, /run)</th>" in card
    assert "the limits it ran with (runner record)" in card
    assert "<th>system calls</th><td>seccomp filter: default deny-list, 64 calls</td>" in card
    api = client.get(f"/api/tasks/{stopped.pk}/").json()
    failure = api.get("failure") or api["task"]["failure"]
    assert failure["kind"] == "limit" and failure["text"].startswith("memory limit 1 GiB reached on sge-exec2")
    # A host without the memory cgroup: the page says the limit was per process only; a site without the filter.
    Task.objects.filter(pk=stopped.pk).update(runner_record=_record(seccomp="off"))
    card = client.get(f"/tasks/{stopped.pk}/").content.decode().split('id="limits"', 1)[1].split("</section>", 1)[0]
    assert "1 GiB per process (no memory cgroup on this host" in card
    assert "<th>system calls</th><td>no seccomp filter (turned off by the site)</td>" in card
    # Not run yet: the campaign's limits within the site's (no spec in the spool: the site's).
    waiting = make_task(campaign, task_number=2, started_at=None, state="pending")
    card = client.get(f"/tasks/{waiting.pk}/").content.decode().split('id="limits"', 1)[1].split("</section>", 1)[0]
    assert "the limits it will run with" in card and "2 GiB for the agent" in card and "<th>disk (work directory)</th><td>3 GiB</td>" in card
    assert "Stopped by a limit" not in card and "system calls" not in card
