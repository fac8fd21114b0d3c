"""Submitting a recorded campaign through DRMAA: claims, adoption of a job already submitted, the reconciler.

A submission is claimed with a conditional update (owner, time); a worker
that died after the scheduler accepted the job leaves a job that
:func:`campaign_adopt` finds by its name and adopts instead of submitting
twice (:func:`reconcile_submissions`).
"""
from __future__ import annotations

import datetime as dt
import logging
import os
import re
import socket
from pathlib import Path

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from dashboards.core import clusters as core_clusters
from dashboards.core import enqueue, realtime
from dashboards.core.bulk import insert_like
from dashboards.core.install import install_id, install_row
from dashboards.ingest.campaign_status import campaign_status_follow
from dashboards.launch.tracing import export_launch, trace_environment
from dashboards.launch.spool import sandbox_shared_paths, sandbox_state_paths, spool_dir, spool_layout
from dashboards.models import CAMPAIGN_TRANSITIONS, Campaign, CampaignStatus, Cluster, Task, transition
from execution.spool.files import make_private_dirs
from schedulers.base import ArrayJobSpec, SchedulerCommandError, SchedulerUnavailable
from schedulers.gridengine.native_spec import sanitize_name

log = logging.getLogger(__name__)


def campaign_job_spec(campaign: Campaign) -> ArrayJobSpec:
    """The array job a campaign submits: tco's runner once per task, as the submit account."""
    base = spool_dir()
    layout = spool_layout()
    logs = Path(layout.logs_dir(campaign.pk))
    work = Path(layout.work_dir(campaign.pk))
    make_private_dirs(logs)  # 0700: the submit account's alone, like the whole spool
    make_private_dirs(work)
    resources: dict[str, str | int] = {}
    if campaign.seats_per_task:
        resources[settings.TCO_SEAT_RESOURCE] = campaign.seats_per_task
    return ArrayJobSpec(
        name=campaign_job_name(campaign),
        command=settings.TCO_RUNNER_PYTHON,
        args=["-m", "execution.runner"],
        count=campaign.task_count,
        queue=campaign.queue,
        project=campaign.team.project,
        resources=resources,
        environment={
            "TCO_CAMPAIGN_ID": str(campaign.pk),
            "TCO_SPOOL_DIR": str(base),
            # tco's state (secret key, database, passwords) stays hidden from agents even if
            # a policy lists a directory above it (execution/runner/).
            "TCO_SANDBOX_MASK": ":".join(sandbox_state_paths()),
            # ... except the demo sweeps' outputs, which its review agents read (demo/sweep.py).
            "TCO_SANDBOX_SHARED": ":".join(sandbox_shared_paths()),
            "PYTHONPATH": str(settings.BASE_DIR),
            "PYTHONDONTWRITEBYTECODE": "1",
            # The site's sandbox limits (docs/limits.md); the runner's defaults otherwise.
            **getattr(settings, "TCO_SANDBOX_LIMITS", {}),
            **({"TCO_SANDBOX_WORKDIR": settings.TCO_SANDBOX_WORKDIR} if getattr(settings, "TCO_SANDBOX_WORKDIR", "")
               else {}),
            **({"TCO_SANDBOX_SECCOMP": settings.TCO_SANDBOX_SECCOMP} if getattr(settings, "TCO_SANDBOX_SECCOMP", "")
               else {}),
            # OpenTelemetry traces, when the site points tco at a receiver (docs/otel.md).
            **trace_environment(campaign),
        },
        working_directory=str(work),
        output_path=str(logs),
        error_path=str(logs),
        account=re.sub(r"[^A-Za-z0-9_.-]", "_", campaign.launched_by.get_username())[:64] or "tco",
        priority=campaign.priority,
        concurrency_cap=campaign.concurrency_cap,
        hold_jid_ad=campaign.predecessor_job,
        advance_reservation=campaign.advance_reservation,
        hold=campaign.submit_on_hold,
        rerunnable=campaign.rerunnable,
    )


def claim_owner() -> str:
    """Who holds a claim: ``<host>:<pid>`` of this process."""
    return f"{socket.gethostname()}:{os.getpid()}"[:128]


def claim_is_stale(claimed_by: str, claimed_at: dt.datetime | None, *, now: dt.datetime, grace_s: float) -> bool:
    """Whether a claim outlived its holder: older than ``grace_s`` seconds, or held by a process of
    this host that no longer exists (``claimed_by`` as :func:`claim_owner` writes it)."""
    if claimed_at is None:
        return False
    if (now - claimed_at).total_seconds() >= grace_s:
        return True
    host, _, pid = claimed_by.rpartition(":")
    if host == socket.gethostname() and pid.isdigit():
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
    return False


def campaign_job_name(campaign: Campaign) -> str:
    """The job name tco gives a campaign's array job: ``tco-<install>-c<id>-<name>`` (sanitised for
    Grid Engine, at most 64 characters: a long campaign name is cut, the prefix never).

    ``<install>`` is this install's id (``core.install.install_id``): campaign ids start at 1 in every
    install's database, so without it two installs sharing a cell and a submit account gave their
    campaigns of one id the same name, and one adopted the other's job (:func:`find_campaign_job`).
    Once a submission claimed the campaign, its name is the one stored then (``Campaign.job_name``):
    a claim retried after ``TCO_INSTALL_ID`` or the campaign's name changed still finds the job the
    first claim submitted, and never submits a second.
    """
    return campaign.job_name or sanitize_name(f"tco-{install_id()}-c{campaign.pk}-{campaign.name}")


def legacy_job_name(campaign: Campaign) -> str:
    """The name tco gave a campaign's job before install ids (migration 0025): ``tco-c<id>-<name>``.
    Any install's campaign of that id had it; read only by :func:`find_campaign_job`."""
    return sanitize_name(f"tco-c{campaign.pk}-{campaign.name}")


class AmbiguousLegacyJob(Exception):
    """A campaign launched before install ids has no job under its name but one under its old name
    (:func:`legacy_job_name`), which another install sharing the cell may have submitted.

    ``job_numbers``: the jobs found (ascending); ``name``: the old name. The message says what an
    admin should check.
    """

    def __init__(self, name: str, job_numbers: list[int]) -> None:
        self.name, self.job_numbers = name, job_numbers
        jobs = ", ".join(str(n) for n in job_numbers)
        super().__init__(
            f"job {jobs} named {name} (the name before install ids) is at the scheduler; another tco install "
            f"sharing this cell may have given one of its campaigns that name, so tco neither adopted it nor "
            f"submitted again. Check the job (qstat -j while it is listed: the TCO_SPOOL_DIR of its env_list says "
            f"whose it is), delete it if it is this campaign's, and launch the campaign again.")


def _jobs_named(campaign: Campaign, scheduler, name: str, owner: str) -> dict[int, set[int]]:
    """``{job_number: {task_number}}`` of the jobs named ``name`` owned by ``owner``: the scheduler's
    list, else the tasks the polls recorded, else the accounting records, the last two since the
    campaign was launched, on its cluster."""
    from dashboards.models import AccountingRecord

    found: dict[int, set[int]] = {}
    for task in scheduler.list_tasks():
        if task.name == name and task.owner == owner:
            found.setdefault(task.job_number, set()).add(task.task_number or 0)
    if not found:
        for job_number, task_number in Task.objects.filter(
                cluster=campaign.cluster, name=name, owner=owner, submitted_at__gte=campaign.launched_at
        ).values_list("job_number", "task_number"):
            found.setdefault(job_number, set()).add(task_number)
    if not found:
        for job_number, task_number in AccountingRecord.objects.filter(
                cluster=campaign.cluster, job_name=name, owner=owner, submitted_at__gte=campaign.launched_at
        ).values_list("job_number", "task_number"):
            found.setdefault(job_number, set()).add(task_number)
    return found


def find_campaign_job(campaign: Campaign, scheduler) -> tuple[int, list[int]] | None:
    """The array job a campaign already has at the scheduler, found by its job name
    (:func:`campaign_job_name`) among the jobs of the submit account (``TCO_SUBMIT_USER``):
    ``(job_number, task_numbers)`` or None.

    Looks in the scheduler's job list (``list_tasks``), then, for a job that
    already left it, in the tasks the polls recorded and in the accounting
    records, all since the campaign was launched. The name is predictable, so a
    job of any other owner is never the campaign's (another user could submit one,
    held, to have it adopted). The name carries this install's id, so a job of
    another tco install on the same cell and submit account (whose campaign ids
    are the same small numbers) is never the campaign's either.

    Old names (``tco-c<id>-<name>``, :func:`legacy_job_name`): a campaign launched
    before this install had an id (``Install.created_at``) may have a job under
    it, but so may another install's campaign of the same id, and nothing in the
    name tells them apart. Such a job is never adopted: when the new name finds
    nothing and the old one finds a job, :class:`AmbiguousLegacyJob` is raised
    (the callers reject the campaign with its message rather than submit a second
    job that may run its tasks twice). Raises SchedulerUnavailable (the caller must
    not resubmit then).
    """
    owner = settings.TCO_SUBMIT_USER
    found = _jobs_named(campaign, scheduler, campaign_job_name(campaign), owner)
    if not found:
        if campaign.launched_at < install_row().created_at:
            old = legacy_job_name(campaign)
            legacy = _jobs_named(campaign, scheduler, old, owner)
            if legacy:
                raise AmbiguousLegacyJob(old, sorted(legacy))
        return None
    job_number = min(found)  # tco submits once per claim; the first is the campaign's
    return job_number, list(range(1, campaign.task_count + 1))


def _transition_campaign(campaign_id: int, source, target: str, *, where: dict | None = None, **changes) -> int:
    return transition(Campaign.objects.filter(pk=campaign_id, **(where or {})), field="status",
                      transitions=CAMPAIGN_TRANSITIONS, source=source, target=target, **changes)


def _release_submission(campaign_id: int) -> None:
    """Claimed -> unclaimed (submitting), for another attempt."""
    _transition_campaign(campaign_id, CampaignStatus.SUBMITTING, CampaignStatus.SUBMITTING,
                         submit_claimed_at=None, submit_claimed_by="")


def campaign_adopt(campaign: Campaign, job_number: int, task_numbers: list[int], *, job_name: str) -> bool:
    """Commit a submission: the campaign's job number, ``submitted``, its tasks (pending).

    One transaction; only from ``submitting`` (a second adoption does nothing
    and returns False).
    """
    now = timezone.now()
    with transaction.atomic():
        moved = _transition_campaign(campaign.pk, CampaignStatus.SUBMITTING, CampaignStatus.SUBMITTED,
                                     job_number=job_number, submitted_at=now, submit_claimed_at=None,
                                     submit_claimed_by="")
        if not moved:
            return False
        # One prepared row per task: bulk_create's model instance per row took 1.5 s for 10,000 tasks, and
        # the next campaign on this submit worker waited for it (issue 15 item 3).
        insert_like(Task(cluster=campaign.cluster, campaign=campaign, job_number=job_number, is_array=True,
                         name=job_name, owner=settings.TCO_SUBMIT_USER, project=campaign.team.project,
                         state="pending", state_code="qw", submitted_at=now, first_seen_at=now),
                    "task_number", task_numbers)
        # A poll may have seen the job before we knew its number: adopt those rows. Their states are the
        # scheduler's (running, or hqw waiting for the predecessor), and later polls see no change in them
        # to move the campaign by: it follows them now (a campaign stayed "submitted" while its tasks waited).
        adopted = Task.objects.filter(
            cluster=campaign.cluster, job_number=job_number, active=True, campaign__isnull=True
        ).update(campaign=campaign)
        if adopted:
            campaign_status_follow([campaign.pk])
    return True


def campaign_submit(*, campaign_id: int, scheduler=None, after_submit=None) -> Campaign:
    """Submit a campaign as one array job and create its tasks (pending).

    States (``models.CAMPAIGN_TRANSITIONS``): the campaign is claimed
    (``submitting`` with ``submit_claimed_at``/``_by``) with a conditional
    update, so a duplicated delivery submits nothing twice; the job number
    and ``submitted`` are committed together after the DRMAA call returns. A
    claim whose worker died in between is settled by
    :func:`reconcile_submissions`. A campaign claimed before (a released claim)
    is first looked up at the scheduler by its job name and adopted if found,
    so it is never submitted twice. A refusal by the scheduler marks it
    ``rejected`` with the scheduler's message, and so does a job found only
    under the campaign's old name (:class:`AmbiguousLegacyJob`, with its
    message); ``SchedulerUnavailable``
    releases the claim and propagates, for the caller to retry.
    ``after_submit`` (tests) is called between the DRMAA call and the commit.
    """
    claimed = _transition_campaign(
        campaign_id, CampaignStatus.SUBMITTING, CampaignStatus.SUBMITTING,
        where={"submit_claimed_at__isnull": True, "job_number__isnull": True},
        submit_claimed_at=timezone.now(), submit_claimed_by=claim_owner(), submit_attempts=F("submit_attempts") + 1)
    campaign = Campaign.objects.select_related("team", "cluster", "launched_by").get(pk=campaign_id)
    if not claimed:
        return campaign
    if not campaign.job_name:  # the first claim fixes the name every later look-up uses
        campaign.job_name = campaign_job_name(campaign)
        Campaign.objects.filter(pk=campaign_id, job_name="").update(job_name=campaign.job_name)
    scheduler = scheduler or core_clusters.scheduler_for(campaign.cluster)
    try:
        spec = campaign_job_spec(campaign)
        existing = find_campaign_job(campaign, scheduler) if campaign.submit_attempts > 1 else None
        if existing is not None:
            log.warning("campaign %s: job %s already at the scheduler; adopted, not resubmitted", campaign_id,
                        existing[0])
            job_number, task_numbers = existing
        else:
            job_number, task_numbers = scheduler.submit_array(spec)
            export_launch(campaign, spec.environment, job_number)
            if after_submit is not None:
                after_submit(job_number)
    except SchedulerUnavailable:
        _release_submission(campaign_id)
        raise
    except (SchedulerCommandError, ValueError, AmbiguousLegacyJob) as exc:
        message = getattr(exc, "stderr", "") or str(exc)
        _transition_campaign(campaign_id, CampaignStatus.SUBMITTING, CampaignStatus.REJECTED,
                             submit_error=message[:2000], submit_claimed_at=None, submit_claimed_by="")
        log.warning("campaign %s rejected: %s", campaign_id, message)
        realtime.queue_changed(campaign.cluster.name, {campaign_id})
        campaign.refresh_from_db()
        return campaign
    campaign_adopt(campaign, job_number, task_numbers, job_name=spec.name)
    realtime.queue_changed(campaign.cluster.name, {campaign_id})
    campaign.refresh_from_db()
    return campaign


def reconcile_submissions(*, scheduler=None, now: dt.datetime | None = None, grace_s: float | None = None,
                          cluster: Cluster | None = None) -> dict[str, list[int]]:
    """Settle submissions left between claim and commit, and re-queue ones never picked up.

    For each ``submitting`` campaign whose claim is stale (:func:`claim_is_stale`;
    ``grace_s`` defaults to ``TCO_SUBMIT_CLAIM_GRACE_S``, longer than the submit
    task's time limit): if the scheduler has its job (:func:`find_campaign_job`)
    the job is adopted (job number, tasks, ``submitted``); if only a job under
    its old name is found (:class:`AmbiguousLegacyJob`: maybe another install's)
    it is ``rejected`` with that message, neither adopted nor submitted again;
    else the claim is released and the submission queued again. An unclaimed
    ``submitting`` campaign older than ``grace_s`` is queued again (its message
    may have been lost). Returns ``{"adopted": [ids], "released": [ids],
    "requeued": [ids], "rejected": [ids]}``. Raises SchedulerUnavailable
    (nothing released: a job may exist).
    """
    now = now or timezone.now()
    grace_s = float(getattr(settings, "TCO_SUBMIT_CLAIM_GRACE_S", 900) if grace_s is None else grace_s)
    out: dict[str, list[int]] = {"adopted": [], "released": [], "requeued": [], "rejected": []}
    pending = Campaign.objects.filter(status=CampaignStatus.SUBMITTING, job_number__isnull=True).select_related(
        "team", "cluster")
    if cluster is not None:
        pending = pending.filter(cluster=cluster)
    for campaign in pending:
        if campaign.submit_claimed_at is None:
            if (now - campaign.launched_at).total_seconds() >= grace_s:
                enqueue.send(enqueue.SUBMIT_CAMPAIGN, campaign.pk)
                out["requeued"].append(campaign.pk)
            continue
        if not claim_is_stale(campaign.submit_claimed_by, campaign.submit_claimed_at, now=now, grace_s=grace_s):
            continue
        try:
            found = find_campaign_job(campaign, scheduler or core_clusters.scheduler_for(campaign.cluster))
        except AmbiguousLegacyJob as exc:
            if _transition_campaign(campaign.pk, CampaignStatus.SUBMITTING, CampaignStatus.REJECTED,
                                    where={"submit_claimed_at": campaign.submit_claimed_at},
                                    submit_error=str(exc)[:2000], submit_claimed_at=None, submit_claimed_by=""):
                log.warning("campaign %s rejected: %s", campaign.pk, exc)
                out["rejected"].append(campaign.pk)
                realtime.queue_changed(campaign.cluster.name, {campaign.pk})
            continue
        if found is not None:
            if campaign_adopt(campaign, found[0], found[1], job_name=campaign_job_name(campaign)):
                log.warning("campaign %s: adopted job %s left by a dead submitter", campaign.pk, found[0])
                out["adopted"].append(campaign.pk)
                realtime.queue_changed(campaign.cluster.name, {campaign.pk})
            continue
        released = _transition_campaign(campaign.pk, CampaignStatus.SUBMITTING, CampaignStatus.SUBMITTING,
                                        where={"submit_claimed_at": campaign.submit_claimed_at},
                                        submit_claimed_at=None, submit_claimed_by="")
        if released:
            log.warning("campaign %s: released the claim of a dead submitter (no job found); resubmitting",
                        campaign.pk)
            transaction.on_commit(lambda pk=campaign.pk: enqueue.send(enqueue.SUBMIT_CAMPAIGN, pk))
            out["released"].append(campaign.pk)
    return out
