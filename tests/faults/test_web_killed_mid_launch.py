"""The web process killed mid-launch: the campaign is submitted once or not at all, never twice, and
its page says which.

A launch through the launch page runs in a process of its own (tests/faults/web_child.py), killed
with SIGKILL at three points: inside the launch's transaction (after its spool files are written),
after the commit before the submission message is sent, and after the message is sent. Then what
the workers do runs as they run it: the reconciler (``reconcile_submissions``, which queues again a
campaign left ``submitting`` with no message) and the submit task, each message delivered twice (a
broker redelivers after a worker's death). Runs as the submit account (it submits through DRMAA).
Every campaign then runs to its end; the accounting file says how many jobs each got.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from django.test import Client

from dashboards.core import enqueue
from dashboards.core.clusters import cluster_get_default
from dashboards.launch.submit import campaign_job_name, campaign_submit, reconcile_submissions
from dashboards.models import AuditEntry, Campaign, Task

from .ledger import compare, report
from .services import REPO, child_env, poll_cycle, wait_for

pytestmark = [pytest.mark.integration]


def jobs_named(name: str, *, suffix: bool = False) -> set[int]:
    """Job numbers the accounting file has for job name ``name`` (or any name ending with it, with
    ``suffix``); SGE 8 colon format: field 4 is the job name, 5 the job number."""
    found = set()
    for line in Path(cluster_get_default().accounting_path).read_text(errors="replace").splitlines():
        fields = line.split(":")
        if not line.startswith("#") and len(fields) > 35 and (fields[4].endswith(name) if suffix else fields[4] == name):
            found.add(int(fields[5]))
    return found


def killed_launch(db: str, point: str, name: str, sent: Path) -> subprocess.CompletedProcess:
    """Launch ``name`` in a web process killed at ``point`` (web_child.py), on this test's database and spool."""
    from django.conf import settings

    env = {**child_env(db), "TCO_SPOOL_DIR": str(settings.TCO_SPOOL_DIR)}
    proc = subprocess.run([sys.executable, "-m", "tests.faults.web_child", "--point", point, "--sent", str(sent),
                           "--name", name], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, (point, proc.returncode, proc.stdout, proc.stderr[-2000:])
    return proc


def test_a_web_process_killed_mid_launch_submits_the_campaign_once_or_not_at_all(fault_db, ops_users, tmp_path,
                                                                                 monkeypatch):
    if os.getuid() == 0:
        pytest.fail("run as the submit account tco (scripts/faults does): it submits through DRMAA")
    cluster = cluster_get_default()
    delivered: list[int] = []
    monkeypatch.setattr(enqueue, "send", lambda name, *a, **kw: delivered.append(a[0]))
    viewer = Client()
    viewer.force_login(ops_users["launcher"])
    run = uuid.uuid4().hex[:8]  # job names stay unique across runs (the accounting file keeps them all)
    before_commit, after_commit, after_send = (f"killed-{point}-{run}" for point in ("in-tx", "committed", "sent"))

    # 1. Killed inside the transaction: nothing recorded, nothing to submit, no page to show.
    sent = tmp_path / "sent.jsonl"
    killed_launch(fault_db, "before-commit", before_commit, sent)
    assert not Campaign.objects.filter(name=before_commit).exists() and not sent.exists()
    assert not AuditEntry.objects.filter(action="launch", ok=True).exists()
    assert reconcile_submissions(grace_s=0) == {"adopted": [], "released": [], "requeued": [], "rejected": []} and delivered == []

    # 2. Killed after the commit, before the message: the campaign waits as "submitting" (its page
    # says it is not yet submitted) until the reconciler queues it again; delivered twice, one job.
    killed_launch(fault_db, "after-commit", after_commit, sent)
    lost_message = Campaign.objects.get(name=after_commit)
    assert (lost_message.status, lost_message.job_number) == ("submitting", None) and not sent.exists()
    page = viewer.get(f"/ops/campaigns/{lost_message.pk}/").content.decode()
    assert "not yet submitted" in page and "submitting" in page.lower()
    assert reconcile_submissions(grace_s=0)["requeued"] == [lost_message.pk]

    # 3. Killed after the message was sent: the message is there (the broker's), delivered twice.
    killed_launch(fault_db, "after-send", after_send, sent)
    kept_message = Campaign.objects.get(name=after_send)
    messages = [json.loads(line) for line in sent.read_text().splitlines()]
    assert messages == [{"task": enqueue.SUBMIT_CAMPAIGN, "args": [kept_message.pk]}]

    for campaign_id in [*delivered, kept_message.pk] * 2:  # each message twice, as a redelivery would
        campaign_submit(campaign_id=campaign_id)
    assert reconcile_submissions(grace_s=0) == {"adopted": [], "released": [], "requeued": [], "rejected": []}
    campaigns = [Campaign.objects.get(pk=c.pk) for c in (lost_message, kept_message)]
    for campaign in campaigns:
        assert campaign.status == "submitted" and campaign.job_number, (campaign.status, campaign.submit_error)
        page = viewer.get(f"/ops/campaigns/{campaign.pk}/").content.decode()
        assert f'<td id="job-number">{campaign.job_number}</td>' in page

    wait_for("both campaigns to end", lambda: poll_cycle(cluster) and not Task.objects.filter(
        campaign__in=campaigns, active=True).exists() and Task.objects.filter(campaign__in=campaigns).count() == 4,
        300, step=1)
    jobs = set()
    for campaign in campaigns:
        assert jobs_named(campaign_job_name(campaign)) == {campaign.job_number}  # one job, never two
        assert sorted(Task.objects.filter(campaign=campaign).values_list("task_number", "state")) == [
            (1, "done"), (2, "done")]
        jobs.add(campaign.job_number)
    assert not jobs_named(f"-{before_commit}", suffix=True)
    result = compare(cluster, [cluster.accounting_path], jobs=jobs)
    report(result, "web process killed mid-launch (in the transaction, after the commit, after the message)")
    assert (result["lost"], result["doubled"], result["extra"], result["records"]) == (0, 0, 0, 4), result
