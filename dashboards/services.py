"""Writes: launching and submitting campaigns, creating teams and clusters.

Views, tasks and commands parse input and call these. Each function takes
keyword arguments only and raises ``LaunchError`` (with a message for the
user) on bad input, before anything reaches the scheduler.
"""
from __future__ import annotations

import json
import logging
import re
from decimal import Decimal
from pathlib import Path
from typing import Any, Sequence

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser, Group
from django.db import transaction
from django.utils import timezone

from execution.spool import RunnerSpec, SpecError, SpoolLayout, write_atomic
from schedulers.base import PRIORITY_MAX, PRIORITY_MIN, ArrayJobSpec, SchedulerCommandError, SchedulerUnavailable
from schedulers.gridengine.native_spec import sanitize_name

from . import clusters, enqueue, realtime
from .models import AgentDefinition, Campaign, Cluster, Task, Team

log = logging.getLogger(__name__)

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
#: Model names as providers spell them (``claude-sonnet-4-5``, ``openai/gpt-4o``, ``x@2025``).
MODEL_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:/@-]{0,127}$")
MAX_TASKS_PER_CAMPAIGN = 75_000  # Grid Engine's default max_aj_tasks


class LaunchError(ValueError):
    """A launch request that cannot be submitted; ``str(err)`` is shown to the user."""


def team_ensure(*, name: str, project: str) -> Team:
    """A team and its Django group (named like the team), created if missing."""
    if not NAME_RE.match(project):
        raise LaunchError(f"project name {project!r} is not a valid Grid Engine name")
    group, _ = Group.objects.get_or_create(name=name)
    team, _ = Team.objects.get_or_create(project=project, defaults={"name": name, "group": group})
    return team


def spool_dir() -> Path:
    return Path(settings.TCO_SPOOL_DIR)


def spool_layout() -> SpoolLayout:
    """The spool's paths (execution/spool.py) under ``TCO_SPOOL_DIR``."""
    return SpoolLayout(settings.TCO_SPOOL_DIR)


def campaign_launch(
    *,
    user: AbstractBaseUser,
    team: Team,
    agent_definition: AgentDefinition,
    inputs: Sequence[dict[str, Any]],
    name: str,
    queue: str = "agent.q",
    seats_per_task: int = 1,
    concurrency_cap: int | None = None,
    cluster: Cluster | None = None,
    priority: int = 0,
    urgent: bool = False,
    model: str = "",
    policy: str = "",
    predecessor_job: int | None = None,
    advance_reservation: int | None = None,
    token_cap: int | None = None,
    cost_cap_usd: Decimal | None = None,
    submit_on_hold: bool = False,
    retry_of: Campaign | None = None,
    model_endpoint: dict[str, str] | None = None,
    outputs: Sequence[str] = (),
) -> Campaign:
    """Record a campaign and its runner spec, then queue its submission.

    ``inputs`` holds one JSON object per task (task N gets ``inputs[N-1]``).
    Raises ``LaunchError`` for a name, queue, count or cap out of bounds; then
    nothing is written and nothing is submitted. The submission itself runs in
    a worker (``worker.tasks.submit_campaign``) after this transaction commits.

    Launch options (all optional, checked here for range only; who may use
    them is decided by ``dashboards.launching``): ``priority`` is qsub's
    ``-p`` (-1023..1024), ``predecessor_job`` becomes ``-hold_jid_ad``,
    ``advance_reservation`` ``-ar``, ``submit_on_hold`` a user hold (``-h``);
    ``model``, ``policy``, ``token_cap`` (tokens per task) and
    ``cost_cap_usd`` (USD per task, Decimal) go into the runner spec, and so
    does ``model_endpoint`` (``{"base_url", "credential_name"}``: where the
    metering proxy sends the agent's requests, which must be an endpoint of the
    policy, and the name of its credential in the runner's credentials file),
    and ``outputs`` (files of the work directory, relative paths or globs, that
    the runner copies for the pages).
    """
    name = name.strip()
    if not NAME_RE.match(name):
        raise LaunchError("campaign name: 1-64 letters, digits, '_', '.', '-' (no spaces or colons)")
    if queue not in settings.TCO_QUEUES:
        raise LaunchError(f"queue {queue!r} is not one of {', '.join(settings.TCO_QUEUES)}")
    count = len(inputs)
    if not 1 <= count <= MAX_TASKS_PER_CAMPAIGN:
        raise LaunchError(f"a campaign has 1 to {MAX_TASKS_PER_CAMPAIGN} tasks, not {count}")
    if not 0 <= seats_per_task <= 16:
        raise LaunchError("seats per task: 0 to 16")
    if concurrency_cap is not None and not 1 <= concurrency_cap <= count:
        raise LaunchError(f"concurrency cap: 1 to {count}")
    if isinstance(priority, bool) or not isinstance(priority, int) or not PRIORITY_MIN <= priority <= PRIORITY_MAX:
        raise LaunchError(f"priority: an integer from {PRIORITY_MIN} to {PRIORITY_MAX}")
    for label, value in (("predecessor job", predecessor_job), ("advance reservation", advance_reservation)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 2**31 - 1):
            raise LaunchError(f"{label}: a positive job or reservation number")
    if token_cap is not None and (isinstance(token_cap, bool) or not isinstance(token_cap, int) or token_cap < 1):
        raise LaunchError("token cap: a positive number of tokens per task")
    if cost_cap_usd is not None and (not isinstance(cost_cap_usd, Decimal) or not cost_cap_usd.is_finite()
                                     or cost_cap_usd <= 0):
        raise LaunchError("cost cap: a positive amount of USD per task")
    if model and not MODEL_RE.match(model):
        raise LaunchError("model: 1-128 letters, digits and '.', '_', '-', '/', ':', '@'")
    encoded = [json.dumps(item, separators=(",", ":"), sort_keys=True) for item in inputs]

    cluster = cluster or clusters.cluster_get_default()
    with transaction.atomic():
        campaign = Campaign.objects.create(
            name=name,
            cluster=cluster,
            team=team,
            agent_definition=agent_definition,
            launched_by=user,
            queue=queue,
            task_count=count,
            seats_per_task=seats_per_task,
            concurrency_cap=concurrency_cap,
            priority=priority,
            urgent=urgent,
            model=model,
            policy=policy,
            predecessor_job=predecessor_job,
            advance_reservation=advance_reservation,
            token_cap=token_cap,
            cost_cap_usd=cost_cap_usd,
            submit_on_hold=submit_on_hold,
            retry_of=retry_of,
            launched_at=timezone.now(),
        )
        campaign_spool_write(campaign, encoded, model_endpoint=model_endpoint, outputs=outputs)
        prices_write()
        transaction.on_commit(lambda: enqueue.send(enqueue.SUBMIT_CAMPAIGN, campaign.pk))
    realtime.queue_changed(cluster.name, {campaign.pk})
    return campaign


def campaign_spool_write(campaign: Campaign, encoded_inputs: Sequence[str], *,
                         model_endpoint: dict[str, str] | None = None, outputs: Sequence[str] = ()) -> RunnerSpec:
    """Write a launched campaign's inputs (one JSON text per task) and runner spec into the spool.

    The spec (execution/spool.py ``RunnerSpec``) takes the agent definition,
    model, policy and caps from ``campaign``; only the options that are set
    are written, so a plain launch writes a short spec. Raises LaunchError
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
                            if k in ("base_url", "credential_name") and v} or None)
    except SpecError as exc:
        raise LaunchError(f"runner spec: {exc}") from None
    write_atomic(layout.inputs_path(campaign.pk), ("\n".join(encoded_inputs) + "\n").encode())
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


def campaign_job_spec(campaign: Campaign) -> ArrayJobSpec:
    """The array job a campaign submits: tco's runner once per task, as the submit account."""
    base = spool_dir()
    layout = spool_layout()
    logs = Path(layout.logs_dir(campaign.pk))
    work = Path(layout.work_dir(campaign.pk))
    logs.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    resources: dict[str, str | int] = {}
    if campaign.seats_per_task:
        resources[settings.TCO_SEAT_RESOURCE] = campaign.seats_per_task
    return ArrayJobSpec(
        name=sanitize_name(f"tco-c{campaign.pk}-{campaign.name}"),
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
            "TCO_SANDBOX_MASK": str(settings.STATE_DIR),
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
    )


def campaign_submit(*, campaign_id: int, scheduler=None) -> Campaign:
    """Submit a campaign as one array job and create its tasks (pending).

    Claimed with a conditional update, so a duplicated delivery submits
    nothing twice. A refusal by the scheduler marks the campaign ``rejected``
    with the scheduler's message; ``SchedulerUnavailable`` releases the claim
    and propagates, for the caller to retry.
    """
    claimed = Campaign.objects.filter(pk=campaign_id, status="submitting", job_number__isnull=True).update(
        status="submitted"
    )
    campaign = Campaign.objects.select_related("team", "cluster", "launched_by").get(pk=campaign_id)
    if not claimed:
        return campaign
    scheduler = scheduler or clusters.scheduler_for(campaign.cluster)
    try:
        spec = campaign_job_spec(campaign)
        job_number, task_numbers = scheduler.submit_array(spec)
    except SchedulerUnavailable:
        Campaign.objects.filter(pk=campaign_id).update(status="submitting")
        raise
    except (SchedulerCommandError, ValueError) as exc:
        message = getattr(exc, "stderr", "") or str(exc)
        Campaign.objects.filter(pk=campaign_id).update(status="rejected", submit_error=message[:2000])
        log.warning("campaign %s rejected: %s", campaign_id, message)
        realtime.queue_changed(campaign.cluster.name, {campaign_id})
        campaign.refresh_from_db()
        return campaign
    now = timezone.now()
    with transaction.atomic():
        Campaign.objects.filter(pk=campaign_id).update(job_number=job_number, submitted_at=now)
        Task.objects.bulk_create(
            [
                Task(
                    cluster=campaign.cluster,
                    campaign=campaign,
                    job_number=job_number,
                    task_number=n,
                    is_array=True,
                    name=spec.name,
                    owner=settings.TCO_SUBMIT_USER,
                    project=campaign.team.project,
                    state="pending",
                    state_code="qw",
                    submitted_at=now,
                    first_seen_at=now,
                )
                for n in task_numbers
            ],
            batch_size=2000,
            ignore_conflicts=True,
        )
        # A poll may have seen the job before we knew its number: adopt those rows.
        Task.objects.filter(
            cluster=campaign.cluster, job_number=job_number, active=True, campaign__isnull=True
        ).update(campaign=campaign)
    realtime.queue_changed(campaign.cluster.name, {campaign_id})
    campaign.refresh_from_db()
    return campaign
