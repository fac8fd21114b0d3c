"""Writes: submitting campaigns (claims, adoption, the reconciler), creating teams and clusters.

Views, tasks and commands parse input and call these. Each function takes
keyword arguments only and raises ``LaunchError`` (with a message for the
user) on bad input, before anything reaches the scheduler.
"""
from __future__ import annotations

import datetime as dt
import json
import logging
import os
import re
import socket
from pathlib import Path
from typing import Sequence

from django.conf import settings
from django.contrib.auth.models import Group
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from execution.spool.contract import SpecError
from execution.spool.files import make_private_dirs, write_atomic
from execution.spool.layout import SpoolLayout
from execution.spool.spec import ModelEndpoint, RunnerSpec
from schedulers.base import ArrayJobSpec, SchedulerCommandError, SchedulerUnavailable
from schedulers.gridengine.native_spec import sanitize_name

from . import clusters, enqueue, limits, realtime
from .bulk import insert_like
from .models import CAMPAIGN_TRANSITIONS, Campaign, CampaignStatus, Cluster, Task, Team, transition

log = logging.getLogger(__name__)

class LaunchError(ValueError):
    """A launch request that cannot be submitted; ``str(err)`` is shown to the user."""


def team_ensure(*, name: str, project: str) -> Team:
    """A team and its Django group (named like the team), created if missing."""
    if not limits.NAME_RE.match(project):
        raise LaunchError(f"project name {project!r} is not a valid Grid Engine name")
    group, _ = Group.objects.get_or_create(name=name)
    team, _ = Team.objects.get_or_create(project=project, defaults={"name": name, "group": group})
    return team


def spool_dir() -> Path:
    return Path(settings.TCO_SPOOL_DIR)


def spool_layout() -> SpoolLayout:
    """The spool's paths (execution/spool.py) under ``TCO_SPOOL_DIR``."""
    return SpoolLayout(settings.TCO_SPOOL_DIR)


def campaign_spool_write(campaign: Campaign, encoded_inputs: Sequence[str], *,
                         model_endpoint: dict[str, str] | None = None, outputs: Sequence[str] = (),
                         model_endpoints: Sequence[ModelEndpoint] = (),
                         network_ceilings: Sequence[dict] = ()) -> RunnerSpec:
    """Write a launched campaign's inputs (one JSON text per task) and runner spec into the spool.

    The spec (execution/spool.py ``RunnerSpec``) takes the agent definition,
    model, policy and caps from ``campaign``; only the options that are set
    are written, so a plain launch writes a short spec. ``model_endpoints`` are
    the admin-registered endpoints the campaign may use (the only ones the
    runner's proxy gives a credential to); ``model_endpoint`` the chosen one; ``network_ceilings``
    the network part of each admin ceiling (``{"label", "network_policies"}``: the runner refuses
    a live network policy change wider than one, dashboards/netpolicy.py). Raises LaunchError
    when the spec would break the contract (nothing is written then), OSError.
    """
    layout = spool_layout()
    agent = campaign.agent_definition
    try:
        spec = RunnerSpec(
            campaign_id=campaign.pk, agent_name=agent.name, agent_version=agent.version, command=agent.command,
            outputs=list(outputs), inputs_file=layout.inputs_path(campaign.pk), timeout_s=agent.timeout_s,
            model=campaign.model or None, policy=campaign.policy or None, token_cap=campaign.token_cap,
            cost_cap_usd=campaign.cost_cap_usd,
            model_endpoint={k: str(v) for k, v in (model_endpoint or {}).items()
                            if k in ("base_url", "credential_name") and v} or None,
            model_endpoints=list(model_endpoints), network_ceilings=list(network_ceilings))
    except SpecError as exc:
        raise LaunchError(f"runner spec: {exc}") from None
    write_atomic(layout.inputs_path(campaign.pk), ("\n".join(encoded_inputs) + "\n").encode())
    try:  # a new campaign runs under its launch policy (version 0), never a leftover change
        os.unlink(layout.network_policy_path(campaign.pk))
    except FileNotFoundError:
        pass
    spec.write(layout.spec_path(campaign.pk))
    return spec


def prices_write() -> Path | None:
    """Write the price table (admin: Model prices, aliases) to ``<spool>/prices.json`` for the runners.

    The runners' metering proxies price each request from this file, in
    execution/metering/prices.py's format; it is rewritten at every launch so a
    campaign is priced as the table stood when it was launched. Returns the
    path, or None when no model has a price (costs are then unknown, never 0).
    """
    from .pricing_models import price_table

    table = price_table()
    mapping = table.to_mapping()
    if not mapping or not any(k != "aliases" for k in mapping):
        return None
    path = Path(spool_layout().prices_path)
    write_atomic(path, json.dumps(mapping, indent=1, default=str).encode())
    return path


def sandbox_state_paths() -> list[str]:
    """tco's state directory and its secrets elsewhere (``TCO_SECRET_PATHS``: ``/etc/tco``, the
    ``*_FILE`` secrets): hidden from every agent (the runner's ``TCO_SANDBOX_MASK``), except
    :func:`sandbox_shared_paths` inside the state directory."""
    paths = [str(settings.STATE_DIR)]
    for path in getattr(settings, "TCO_SECRET_PATHS", ()):
        if path not in paths:
            paths.append(path)
    return paths


def sandbox_shared_paths() -> list[str]:
    """Directories inside the state directory that a policy may list (``TCO_SANDBOX_SHARED``):
    ``<state>/sweeps``, the demo sweep's run outputs its review agents read (each team's under
    :func:`team_sweeps_dir`, the only part its policy ceiling lets it list)."""
    return [str(Path(settings.STATE_DIR) / "sweeps")]


def team_sweeps_dir(project: str) -> Path:
    """``<state>/sweeps/<project>``: where a team's demo sweeps write their runs, and all of the
    sweeps its demo policy ceiling lets its agents read (another team's stay out of reach).
    Raises ValueError for a project name that is not one path component."""
    if not project or "/" in project or project in (".", ".."):
        raise ValueError(f"project {project!r}: not a directory name")
    return Path(settings.STATE_DIR) / "sweeps" / project


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
            # a policy lists a directory above it (execution/runner.py).
            "TCO_SANDBOX_MASK": ":".join(sandbox_state_paths()),
            # ... except the demo sweeps' outputs, which its review agents read (demo/sweep.py).
            "TCO_SANDBOX_SHARED": ":".join(sandbox_shared_paths()),
            "PYTHONPATH": str(settings.BASE_DIR),
            "PYTHONDONTWRITEBYTECODE": "1",
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
    """The job name tco gives a campaign's array job: ``tco-c<id>-<name>`` (sanitised for Grid Engine)."""
    return sanitize_name(f"tco-c{campaign.pk}-{campaign.name}")


def find_campaign_job(campaign: Campaign, scheduler) -> tuple[int, list[int]] | None:
    """The array job a campaign already has at the scheduler, found by its job name
    (:func:`campaign_job_name`) among the jobs of the submit account (``TCO_SUBMIT_USER``):
    ``(job_number, task_numbers)`` or None.

    Looks in the scheduler's job list (``list_tasks``), then, for a job that
    already left it, in the tasks the polls recorded and in the accounting
    records, all since the campaign was launched. The name is predictable, so a
    job of any other owner is never the campaign's (another user could submit one,
    held, to have it adopted). Raises SchedulerUnavailable (the caller must not
    resubmit then).
    """
    name = campaign_job_name(campaign)
    owner = settings.TCO_SUBMIT_USER
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
        from .models import AccountingRecord

        for job_number, task_number in AccountingRecord.objects.filter(
                cluster=campaign.cluster, job_name=name, owner=owner, submitted_at__gte=campaign.launched_at
        ).values_list("job_number", "task_number"):
            found.setdefault(job_number, set()).add(task_number)
    if not found:
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
        # A poll may have seen the job before we knew its number: adopt those rows.
        Task.objects.filter(
            cluster=campaign.cluster, job_number=job_number, active=True, campaign__isnull=True
        ).update(campaign=campaign)
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
    ``rejected`` with the scheduler's message; ``SchedulerUnavailable``
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
    scheduler = scheduler or clusters.scheduler_for(campaign.cluster)
    try:
        spec = campaign_job_spec(campaign)
        existing = find_campaign_job(campaign, scheduler) if campaign.submit_attempts > 1 else None
        if existing is not None:
            log.warning("campaign %s: job %s already at the scheduler; adopted, not resubmitted", campaign_id,
                        existing[0])
            job_number, task_numbers = existing
        else:
            job_number, task_numbers = scheduler.submit_array(spec)
            if after_submit is not None:
                after_submit(job_number)
    except SchedulerUnavailable:
        _release_submission(campaign_id)
        raise
    except (SchedulerCommandError, ValueError) as exc:
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
    the job is adopted (job number, tasks, ``submitted``), else the claim is
    released and the submission queued again. An unclaimed ``submitting``
    campaign older than ``grace_s`` is queued again (its message may have been
    lost). Returns ``{"adopted": [ids], "released": [ids], "requeued": [ids]}``.
    Raises SchedulerUnavailable (nothing released: a job may exist).
    """
    now = now or timezone.now()
    grace_s = float(getattr(settings, "TCO_SUBMIT_CLAIM_GRACE_S", 900) if grace_s is None else grace_s)
    out: dict[str, list[int]] = {"adopted": [], "released": [], "requeued": []}
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
        found = find_campaign_job(campaign, scheduler or clusters.scheduler_for(campaign.cluster))
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
