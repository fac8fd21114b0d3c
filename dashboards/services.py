"""Writes: launching and submitting campaigns, creating teams and clusters.

Views, tasks and commands parse input and call these. Each function takes
keyword arguments only and raises ``LaunchError`` (with a message for the
user) on bad input, before anything reaches the scheduler.
"""
from __future__ import annotations

import json
import logging
import os
import re
from decimal import Decimal
from pathlib import Path
from typing import Any, Sequence

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser, Group
from django.db import transaction
from django.utils import timezone

from schedulers.base import ArrayJobSpec, SchedulerCommandError, SchedulerUnavailable
from schedulers.gridengine import sanitize_name

from . import enqueue, realtime
from .models import AgentDefinition, Campaign, Cluster, Task, Team

log = logging.getLogger(__name__)

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
#: Model names as providers spell them (``claude-sonnet-4-5``, ``openai/gpt-4o``, ``x@2025``).
MODEL_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:/@-]{0,127}$")
MAX_TASKS_PER_CAMPAIGN = 75_000  # Grid Engine's default max_aj_tasks
PRIORITY_MIN, PRIORITY_MAX = -1023, 1024  # qsub -p; above 0 only for operators and managers


class LaunchError(ValueError):
    """A launch request that cannot be submitted; ``str(err)`` is shown to the user."""


def cluster_get_default() -> Cluster:
    """The cluster configured in settings (created on first use)."""
    cluster, _ = Cluster.objects.get_or_create(
        name=settings.TCO_CLUSTER_NAME,
        defaults={
            "sge_root": settings.SGE_ROOT,
            "sge_cell": settings.SGE_CELL,
            "accounting_path": settings.TCO_ACCOUNTING_FILE,
            "time_zone": settings.TCO_CLUSTER_TZ,
        },
    )
    return cluster


def team_ensure(*, name: str, project: str) -> Team:
    """A team and its Django group (named like the team), created if missing."""
    if not NAME_RE.match(project):
        raise LaunchError(f"project name {project!r} is not a valid Grid Engine name")
    group, _ = Group.objects.get_or_create(name=name)
    team, _ = Team.objects.get_or_create(project=project, defaults={"name": name, "group": group})
    return team


def spool_dir() -> Path:
    return Path(settings.TCO_SPOOL_DIR)


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


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
    policy, and the name of its credential in the runner's credentials file).
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

    cluster = cluster or cluster_get_default()
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
        base = spool_dir() / "campaigns" / str(campaign.pk)
        _write_atomic(base / "inputs.jsonl", ("\n".join(encoded) + "\n").encode())
        spec = {
            "version": 1,
            "campaign_id": campaign.pk,
            "agent": {"name": agent_definition.name, "version": agent_definition.version,
                      "command": agent_definition.command},
            "inputs_file": str(base / "inputs.jsonl"),
            "timeout_s": agent_definition.timeout_s,
        }
        # Options for the runner and its metering proxy (only those set, so a
        # plain launch writes the same spec as before).
        if model:
            spec["model"] = model
        if policy:
            spec["policy"] = policy
        if token_cap is not None:
            spec["token_cap"] = token_cap
        if cost_cap_usd is not None:
            spec["cost_cap_usd"] = str(cost_cap_usd)
        if model_endpoint:
            spec["model_endpoint"] = {k: str(v) for k, v in model_endpoint.items()
                                      if k in ("base_url", "credential_name") and v}
        _write_atomic(base / "spec.json", json.dumps(spec, indent=1).encode())
        prices_write()
        transaction.on_commit(lambda: enqueue.send(enqueue.SUBMIT_CAMPAIGN, campaign.pk))
    realtime.queue_changed(cluster.name, {campaign.pk})
    return campaign


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
    path = spool_dir() / "prices.json"
    _write_atomic(path, json.dumps(mapping, indent=1, default=str).encode())
    return path


def campaign_job_spec(campaign: Campaign) -> ArrayJobSpec:
    """The array job a campaign submits: tco's runner once per task, as the submit account."""
    base = spool_dir()
    logs = base / "logs" / str(campaign.pk)
    work = base / "work" / str(campaign.pk)
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
            # ... except the demo sweeps' outputs, which its review agents read (demo/sweep.py).
            "TCO_SANDBOX_SHARED": str(Path(settings.STATE_DIR) / "sweeps"),
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


def scheduler_for(cluster: Cluster):
    """The Grid Engine adapter for ``cluster``, with tco's allow-lists."""
    from schedulers.gridengine import GridEngine

    return GridEngine(
        queues=list(settings.TCO_QUEUES),
        projects=list(Team.objects.values_list("project", flat=True)),
        resources=list(settings.TCO_REQUESTABLE_RESOURCES),
        sge_root=cluster.sge_root,
        sge_cell=cluster.sge_cell,
        # -notify: a qdel first sends SIGTERM (execd_params NOTIFY_KILL=TERM,
        # scripts/dev-cluster), so the runner writes its record before SIGKILL.
        notify=settings.TCO_NOTIFY,
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
    scheduler = scheduler or scheduler_for(campaign.cluster)
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


def cluster_status_refresh(*, cluster: Cluster, scheduler=None) -> dict:
    """Store the cluster's queue slots, hosts, consumables and quotas; push a change.

    ``status`` becomes ``{"queues": [...], "hosts": [...], "quotas": [...],
    "global_capacity": {resource: number}, "share_tree": [...]}`` (shapes of
    the parsers in ``schedulers.qstat_xml`` and ``.sharetree``; on a
    share-tree failure ``share_tree_error`` instead). On ``SchedulerError`` the previous
    status stays and the error is returned.
    """
    from schedulers.base import SchedulerError

    scheduler = scheduler or scheduler_for(cluster)
    try:
        status = {
            "queues": scheduler.queue_summary(),
            "hosts": scheduler.hosts(),
            "quotas": scheduler.quotas(),
            "global_capacity": scheduler.global_capacity(),
        }
    except SchedulerError as exc:
        return {"error": str(exc)}
    # The share tree is optional (a cluster may use only functional tickets):
    # without it the rest of the status is still stored.
    share_tree = getattr(scheduler, "share_tree", None)
    if share_tree is not None:
        try:
            status["share_tree"] = share_tree()
        except SchedulerError as exc:
            status["share_tree_error"] = str(exc)[:500]
    if status != cluster.status:
        Cluster.objects.filter(pk=cluster.pk).update(status=status, status_at=timezone.now())
        realtime.queue_changed(cluster.name)
    else:
        Cluster.objects.filter(pk=cluster.pk).update(status_at=timezone.now())
    return {"queues": len(status["queues"]), "hosts": len(status["hosts"])}
