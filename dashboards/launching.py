"""Launching campaigns and urgent agents, campaign control, admin triage, the audit log.

Every function here decides *who* may do something (``roles.py``) and
writes an ``AuditEntry`` for every launch and control action, allowed or
refused: who, what (``action``, ``target``, ``params``), when, result.
Checks come first; on any refusal nothing is written but the audit entry,
and nothing reaches the scheduler.

Control actions (cancel, pause, resume, triage) run in the submit worker,
as the submit account (an SGE operator): the request writes an audit entry
with ``params["status"] == "queued"`` and queues ``worker.tasks.control_job``
with its id; the worker claims the entry, runs ``GridEngine.control`` and
records the result in the same entry (``ok``, ``result``, status ``done``
or ``failed``).
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
import re
from decimal import Decimal
from pathlib import Path
from typing import Any, Sequence

import yaml
from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.db.models import Count, Max, Min, Q
from django.utils import timezone

from schedulers.base import SchedulerCommandError, SchedulerUnavailable

from . import billing, clusters, enqueue, scheduler_cache, services
from .models import AgentDefinition, AuditEntry, Campaign, Cluster, Task, Team
from .roles import is_admin, teams_with, user_can
from .services import LaunchError

log = logging.getLogger(__name__)

#: qsub -p of an urgent agent (the maximum; the submit account is an operator).
URGENT_PRIORITY = 1024
#: The highest -p a launcher without the urgent role may ask for (Grid Engine lets users only lower).
NORMAL_PRIORITY_MAX = 0
CAMPAIGN_ACTIONS = {"cancel": "delete", "pause": "hold", "resume": "release"}
TRIAGE_ACTIONS = ("hold", "release", "delete", "priority", "clear_error")
#: Beyond this many task ranges a control action addresses the whole job (argv stays short).
MAX_RANGES = 200
POLICY_KEYS = frozenset({"version", "filesystem_policy", "landlock", "process", "network_policies"})
POLICY_MAX_BYTES = 64 * 1024
INPUT_MAX_BYTES = 16 * 1024 * 1024
TRIAGE_STATES = ("error", "pending", "held")


class ActionRefused(PermissionError):
    """The user may not do this; ``str(err)`` is shown to them."""


# --------------------------------------------------------------------------- audit

def audit(*, user: AbstractBaseUser | None, action: str, target: str = "", params: dict | None = None,
          ok: bool, result: str = "") -> AuditEntry:
    """Write one audit entry (``params`` must be JSON-ready; ``result`` is cut at 4,000 characters)."""
    return AuditEntry.objects.create(
        user=user if user is not None and getattr(user, "is_authenticated", False) else None,
        action=action[:32], target=target[:128], params=params or {}, ok=ok, result=result[:4000])


def audit_entries(user: AbstractBaseUser, *, action: str = "", limit: int = 200) -> list[AuditEntry]:
    """The newest audit entries (admins only). Raises ActionRefused."""
    if not user_can(user, "audit"):
        raise ActionRefused("only admins may read the audit log")
    entries = AuditEntry.objects.select_related("user").order_by("-at", "-id")
    if action:
        entries = entries.filter(action=action)
    return list(entries[:max(1, min(limit, 1000))])


def _refuse(user, action: str, target: str, params: dict, message: str) -> ActionRefused:
    audit(user=user, action=action, target=target, params={**params, "status": "refused"}, ok=False,
          result=f"refused: {message}")
    return ActionRefused(message)


# --------------------------------------------------------------------------- inputs

def inputs_root() -> Path:
    """Where "files in a directory" inputs must live (``TCO_INPUTS_ROOT``, default ``<state>/inputs``)."""
    return Path(getattr(settings, "TCO_INPUTS_ROOT", None) or Path(settings.STATE_DIR) / "inputs")


def inputs_from_directory(relative: str, *, limit: int = services.MAX_TASKS_PER_CAMPAIGN) -> list[dict[str, str]]:
    """One input ``{"file": absolute path}`` per regular file directly in ``<inputs root>/<relative>``.

    The path must stay inside the inputs root (no ``..``, no symlink out of
    it); files are taken in name order; hidden files are skipped. Raises
    LaunchError with the reason.
    """
    relative = (relative or "").strip()
    if not relative or "\0" in relative or any(ord(c) < 0x20 for c in relative):
        raise LaunchError("input directory: give a directory under the inputs root")
    root = inputs_root().resolve()
    candidate = (root / relative.lstrip("/")).resolve()
    if candidate != root and root not in candidate.parents:
        raise LaunchError(f"input directory {relative!r} is outside the inputs root {root}")
    if not candidate.is_dir():
        raise LaunchError(f"input directory {relative!r} does not exist under {root}")
    files = []
    for entry in sorted(candidate.iterdir()):
        if entry.name.startswith(".") or not entry.is_file():
            continue
        if root not in entry.resolve().parents:
            continue  # a symlink out of the inputs root is not an input
        files.append({"file": str(entry)})
        if len(files) > limit:
            raise LaunchError(f"input directory has more than {limit} files")
    if not files:
        raise LaunchError(f"input directory {relative!r} has no files")
    return files


def inputs_from_jsonl(text: str, *, limit: int = services.MAX_TASKS_PER_CAMPAIGN) -> list[dict[str, Any]]:
    """One input per non-empty line, each a JSON object. Raises LaunchError naming the line."""
    if len(text.encode("utf-8", "surrogatepass")) > INPUT_MAX_BYTES:
        raise LaunchError(f"JSONL input is larger than {INPUT_MAX_BYTES // (1024 * 1024)} MB")
    items = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except ValueError as exc:
            raise LaunchError(f"JSONL line {number} is not JSON: {exc}") from None
        if not isinstance(value, dict):
            raise LaunchError(f"JSONL line {number} is not a JSON object")
        items.append(value)
        if len(items) > limit:
            raise LaunchError(f"a campaign has at most {limit} tasks; the JSONL has more lines")
    if not items:
        raise LaunchError("the JSONL input has no lines")
    return items


_PARAM_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
_RANGE = re.compile(r"^(-?\d{1,12})\.\.(-?\d{1,12})$")


def _param_value(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def inputs_from_params(text: str, *, limit: int = services.MAX_TASKS_PER_CAMPAIGN) -> list[dict[str, Any]]:
    """A parameter list: one task per line of ``key=value`` pairs separated by spaces.

    Values are JSON where they parse (``3``, ``true``, ``"a b"``), else text.
    A line with one pair ``key=A..B`` (integers) stands for B-A+1 tasks with
    key = A..B. Raises LaunchError naming the line; a range larger than
    ``limit`` is refused before anything is built.
    """
    items: list[dict[str, Any]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line:
            continue
        pairs = line.split()
        row: dict[str, Any] = {}
        for pair in pairs:
            key, eq, value = pair.partition("=")
            if not eq or not _PARAM_KEY.match(key):
                raise LaunchError(f"parameter line {number}: {pair!r} is not key=value (key: letters, digits, _)")
            if key in row:
                raise LaunchError(f"parameter line {number}: {key} given twice")
            row[key] = value
        if len(row) == 1:
            (key, value), = row.items()
            match = _RANGE.match(value)
            if match:
                first, last = int(match.group(1)), int(match.group(2))
                if last < first:
                    raise LaunchError(f"parameter line {number}: range {value} runs backwards")
                if len(items) + (last - first + 1) > limit:
                    raise LaunchError(f"a campaign has at most {limit} tasks; line {number} asks for "
                                      f"{last - first + 1}")
                items.extend({key: n} for n in range(first, last + 1))
                continue
        items.append({k: _param_value(v) for k, v in row.items()})
        if len(items) > limit:
            raise LaunchError(f"a campaign has at most {limit} tasks")
    if not items:
        raise LaunchError("the parameter list is empty")
    return items


class _UniqueKeyLoader(yaml.SafeLoader):
    pass


def _no_duplicates(loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node, deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _no_duplicates)


def validate_policy(text: str) -> str:
    """Check a sandbox policy as the runner will (execution/sandbox/policy.py): OpenShell's schema,
    no unknown fields, no duplicate keys, nothing bubblewrap would have to enforce less strictly.

    Returns the text unchanged ("" for none). Raises LaunchError with every problem.
    """
    text = (text or "").strip()
    if not text:
        return ""
    if len(text.encode()) > POLICY_MAX_BYTES:
        raise LaunchError(f"sandbox policy is larger than {POLICY_MAX_BYTES // 1024} KB")
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise LaunchError(f"sandbox policy is not valid YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise LaunchError("sandbox policy must be a YAML mapping (version: 1, filesystem_policy: ...)")
    unknown = sorted(str(k) for k in data if k not in POLICY_KEYS)
    if unknown:
        raise LaunchError(f"sandbox policy: unknown field(s) {', '.join(unknown)}; "
                          f"known: {', '.join(sorted(POLICY_KEYS))}")
    if data.get("version") != 1:
        raise LaunchError("sandbox policy: version must be 1")
    # The runner's own validation, on the parsed mapping (never a path: a
    # one-line text is not read as a file name here).
    from execution.sandbox.policy import PolicyError, load_policy

    try:
        policy = load_policy(data)
    except PolicyError as exc:
        raise LaunchError("sandbox policy: " + "; ".join(exc.problems)) from None
    refused = policy.refusals()
    if refused:
        raise LaunchError("sandbox policy: bubblewrap cannot enforce " + "; ".join(str(f) for f in refused))
    return text


# --------------------------------------------------------------------------- launching

@dataclasses.dataclass
class LaunchOutcome:
    """A launch that was accepted: the campaign, the forecast shown, the budget verdict."""

    campaign: Campaign
    forecast: dict[str, Any]
    verdict: dict[str, Any]

    @property
    def held_for_budget(self) -> bool:
        return self.verdict["action"] == "hold"


def priority_limit(user: AbstractBaseUser, team: Team) -> int:
    """The highest ``-p`` ``user`` may ask for on ``team``: 1024 for urgent launchers, else 0."""
    return URGENT_PRIORITY if user_can(user, "urgent", team) else NORMAL_PRIORITY_MAX


def expected_cost(forecast: dict[str, Any], count: int, cost_cap_usd: Decimal | None) -> Decimal | None:
    """The cost a budget check uses: the forecast's median, else the cost cap x count, else None."""
    if forecast.get("cost_usd"):
        return forecast["cost_usd"]["p50"]
    if cost_cap_usd is not None:
        return cost_cap_usd * count
    return None


def launch_preview(*, user: AbstractBaseUser, team: Team, agent_definition: AgentDefinition, count: int,
                   model: str = "", cost_cap_usd: Decimal | None = None) -> dict[str, Any]:
    """What the launch form shows before submitting: ``{"forecast", "expected_usd", "verdict"}``."""
    model = model or agent_definition.default_model
    fc = billing.forecast(agent_definition=agent_definition, count=count, model=model)
    expected = expected_cost(fc, count, cost_cap_usd)
    return {"forecast": fc, "expected_usd": expected, "verdict": billing.budget_verdict(team, expected)}


def _check_predecessor(user: AbstractBaseUser, job_number: int | None, count: int) -> None:
    if job_number is None:
        return
    predecessor = Campaign.objects.filter(job_number=job_number, team__in=teams_with(user, "view")).order_by(
        "-launched_at").first()
    if predecessor is None:
        raise LaunchError(f"predecessor job {job_number}: not a campaign of a team you can see")
    if predecessor.task_count != count:
        raise LaunchError(f"predecessor job {job_number} has {predecessor.task_count} tasks; -hold_jid_ad needs "
                          f"the same number ({count})")


def campaign_launch_checked(
    *,
    user: AbstractBaseUser,
    team: Team,
    agent_definition: AgentDefinition,
    inputs: Sequence[dict[str, Any]],
    name: str,
    queue: str = "agent.q",
    seats_per_task: int = 1,
    concurrency_cap: int | None = None,
    priority: int = 0,
    model: str = "",
    policy: str = "",
    predecessor_job: int | None = None,
    token_cap: int | None = None,
    cost_cap_usd: Decimal | None = None,
    urgent: bool = False,
    retry_of: Campaign | None = None,
    action: str = "launch",
) -> LaunchOutcome:
    """Launch a campaign for ``user`` after checking role, limits and budget; audited either way.

    Refuses (``ActionRefused``) a user without the ``launch`` role on
    ``team``, a ``priority`` above the role's limit (0; 1024 for urgent
    launchers) or an urgent launch without the ``urgent`` role, and a launch
    a ``refuse`` budget forbids; a ``hold`` budget submits it on hold.
    Raises ``LaunchError`` for bad input. ``model`` and ``policy`` default to
    the agent definition's.
    """
    count = len(inputs)
    target = f"team:{team.project}"
    params = {"name": str(name)[:100], "team": team.project,
              "agent": f"{agent_definition.name} v{agent_definition.version}",
              "tasks": count, "queue": str(queue)[:64], "seats_per_task": seats_per_task,
              "concurrency_cap": concurrency_cap, "priority": priority, "model": str(model)[:128],
              "predecessor_job": predecessor_job, "token_cap": token_cap,
              "cost_cap_usd": str(cost_cap_usd) if cost_cap_usd is not None else None, "urgent": urgent,
              "retry_of": retry_of.pk if retry_of else None}
    if not user_can(user, "launch", team):
        raise _refuse(user, action, target, params, f"you may not launch campaigns for team {team.name}")
    if urgent and not user_can(user, "urgent", team):
        raise _refuse(user, action, target, params, f"only urgent launchers of {team.name} may launch urgent agents")
    limit = priority_limit(user, team)
    if isinstance(priority, bool) or not isinstance(priority, int) or not services.PRIORITY_MIN <= priority <= limit:
        raise _refuse(user, action, target, params,
                      f"priority must be from {services.PRIORITY_MIN} to {limit} for your role")
    try:
        _check_predecessor(user, predecessor_job, count)
        model = model or agent_definition.default_model
        policy = validate_policy(policy or agent_definition.default_policy)
        preview = launch_preview(user=user, team=team, agent_definition=agent_definition, count=count,
                                 model=model, cost_cap_usd=cost_cap_usd)
        verdict = preview["verdict"]
        params["expected_usd"] = str(preview["expected_usd"]) if preview["expected_usd"] is not None else None
        if verdict["action"] == "refuse":
            raise _refuse(user, action, target, params, f"over budget: {verdict['message']}")
        campaign = services.campaign_launch(
            user=user, team=team, agent_definition=agent_definition, inputs=inputs, name=name, queue=queue,
            seats_per_task=seats_per_task, concurrency_cap=concurrency_cap, priority=priority, urgent=urgent,
            model=model, policy=policy, predecessor_job=predecessor_job, token_cap=token_cap,
            cost_cap_usd=cost_cap_usd, submit_on_hold=verdict["action"] == "hold", retry_of=retry_of)
    except LaunchError as exc:
        audit(user=user, action=action, target=target, params={**params, "status": "refused"}, ok=False,
              result=f"refused: {exc}")
        raise
    result = f"campaign {campaign.pk} accepted ({count} tasks)"
    if verdict["action"] == "hold":
        result += f"; submitted on hold: {verdict['message']}"
    audit(user=user, action=action, target=f"campaign:{campaign.pk}", params={**params, "status": "done"}, ok=True,
          result=result)
    return LaunchOutcome(campaign=campaign, forecast=preview["forecast"], verdict=verdict)


def urgent_launch(*, user: AbstractBaseUser, team: Team, agent_definition: AgentDefinition, input: dict[str, Any],
                  name: str = "", queue: str = "agent.q", seats_per_task: int = 1, model: str = "") -> LaunchOutcome:
    """One urgent agent: submitted with ``-p 1024`` by the operator account, so it starts at the
    next free slot the scheduler's policy gives (``weight_priority``). Urgent launchers only."""
    if not isinstance(input, dict):
        raise LaunchError("the urgent agent's input must be a JSON object")
    name = (name or f"urgent-{agent_definition.name}").strip()
    return campaign_launch_checked(user=user, team=team, agent_definition=agent_definition, inputs=[input],
                                   name=name, queue=queue, seats_per_task=seats_per_task, priority=URGENT_PRIORITY,
                                   model=model, urgent=True, action="urgent_launch")


def urgent_agents(user: AbstractBaseUser, *, limit: int = 50) -> list[dict[str, Any]]:
    """Urgent agents the user may see, newest first: ``{"campaign", "task", "state", "waited_s",
    "waiting": bool}``; ``waited_s`` is the scheduler's submission to the start (so far, while pending)."""
    now = timezone.now()
    rows = []
    campaigns = (Campaign.objects.filter(urgent=True, team__in=teams_with(user, "view"))
                 .select_related("team", "agent_definition").order_by("-launched_at")[:limit])
    tasks = {t.campaign_id: t for t in Task.objects.filter(campaign__in=list(campaigns)).order_by("id")}
    for campaign in campaigns:
        task = tasks.get(campaign.pk)
        submitted = (task.submitted_at if task else None) or campaign.submitted_at
        started = (task.started_at if task else None)
        waited = None
        if submitted is not None:
            waited = ((started or now) - submitted).total_seconds()
        rows.append({"campaign": campaign, "task": task, "state": task.state if task else campaign.status,
                     "waited_s": max(0.0, waited) if waited is not None else None, "waiting": started is None})
    return rows


# --------------------------------------------------------------------------- campaign control

def _ranges(numbers: Sequence[int]) -> list[list[int]]:
    ranges: list[list[int]] = []
    for n in sorted(set(numbers)):
        if ranges and n == ranges[-1][1] + 1:
            ranges[-1][1] = n
        else:
            ranges.append([n, n])
    return ranges


def ranges_text(ranges: Sequence[Sequence[int]] | None) -> str:
    """``[[1, 3], [5, 5]]`` -> ``"1-3,5"``; None -> ``"all"``."""
    if ranges is None:
        return "all"
    return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in ranges)


def _queue_control(*, user, action: str, target: str, cluster: Cluster, control: str, job_number: int,
                   ranges: list[list[int]] | None, priority: int | None = None,
                   extra: dict | None = None) -> AuditEntry:
    """Write the queued audit entry and hand it to the submit worker after commit."""
    from schedulers.base import InvalidSubmission
    from schedulers.gridengine.commands import control_argv

    tasks = None if ranges is None else [n for a, b in ranges for n in range(a, b + 1)]
    try:
        argv = control_argv(control, job_number, tasks, priority)  # validates before anything is queued
    except InvalidSubmission as exc:
        raise _refuse(user, action, target, {"job_number": job_number}, str(exc)) from None
    params = {"status": "queued", "cluster": cluster.pk, "control": control, "job_number": job_number,
              "tasks": ranges, "priority": priority, "command": " ".join(argv[:4]) + (" ..." if len(argv) > 4 else ""),
              **(extra or {})}
    with transaction.atomic():
        entry = audit(user=user, action=action, target=target, params=params, ok=False,
                      result="queued for the submit worker")
        transaction.on_commit(lambda: enqueue.send(enqueue.CONTROL_JOB, entry.pk))
    return entry


def campaign_control(*, user: AbstractBaseUser, campaign: Campaign, action: str) -> AuditEntry:
    """Cancel (qdel the pending and running tasks), pause (qhold the pending ones) or resume
    (qrls the held ones) a campaign. Returns the queued audit entry.

    Raises ActionRefused (no ``control`` role on the campaign's team) and
    LaunchError (unknown action, nothing to act on).
    """
    target = f"campaign:{campaign.pk}"
    if action not in CAMPAIGN_ACTIONS:
        raise _refuse(user, f"campaign_{action}"[:32], target, {}, f"unknown action {action!r}")
    audit_action = f"campaign_{action}"
    if not user_can(user, "control", campaign.team):
        raise _refuse(user, audit_action, target, {}, f"you may not control campaigns of team {campaign.team.name}")
    if campaign.job_number is None or campaign.status != "submitted":
        message = f"campaign {campaign.pk} is {campaign.status}; there is nothing to {action}"
        audit(user=user, action=audit_action, target=target, params={"status": "refused"}, ok=False,
              result=f"refused: {message}")
        raise LaunchError(message)
    active = Task.objects.filter(campaign=campaign, active=True)
    if action == "cancel":
        ranges = None
        if not active.exclude(state="finishing").exists():
            raise _nothing(user, audit_action, target, "no pending or running tasks to cancel")
    else:
        wanted = ("pending",) if action == "pause" else ("held",)
        numbers = list(active.filter(state__in=wanted).values_list("task_number", flat=True))
        if not numbers:
            raise _nothing(user, audit_action, target,
                           "no pending tasks to pause" if action == "pause" else "no held tasks to resume")
        ranges = _ranges(numbers)
        if len(ranges) > MAX_RANGES:
            ranges = None  # running tasks put on hold keep running ("hr"); releasing the job is harmless
    return _queue_control(user=user, action=audit_action, target=target, cluster=campaign.cluster,
                          control=CAMPAIGN_ACTIONS[action], job_number=campaign.job_number, ranges=ranges,
                          extra={"campaign": campaign.pk})


def _nothing(user, action: str, target: str, message: str) -> LaunchError:
    audit(user=user, action=action, target=target, params={"status": "refused"}, ok=False, result=f"refused: {message}")
    return LaunchError(message)


def campaign_inputs(campaign: Campaign) -> list[dict[str, Any]]:
    """The campaign's inputs as written at launch (task N is item N-1). Raises LaunchError if unreadable."""
    path = Path(services.spool_layout().inputs_path(campaign.pk))
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise LaunchError(f"the inputs of campaign {campaign.pk} cannot be read: {exc.strerror}") from None
    return [json.loads(line) for line in lines if line.strip()]


def campaign_retry(*, user: AbstractBaseUser, campaign: Campaign) -> LaunchOutcome:
    """Launch the failed (and lost) tasks of ``campaign`` again, as a new campaign linked by ``retry_of``.

    Same team, agent, queue, seats, model, policy and caps; the concurrency
    cap is kept if it still fits. Raises ActionRefused, LaunchError.
    """
    target = f"campaign:{campaign.pk}"
    if not user_can(user, "control", campaign.team):
        raise _refuse(user, "campaign_retry", target, {}, f"you may not control campaigns of team {campaign.team.name}")
    failed = list(Task.objects.filter(campaign=campaign, state__in=("failed", "lost"))
                  .order_by("task_number").values_list("task_number", flat=True).distinct())
    if not failed:
        raise _nothing(user, "campaign_retry", target, f"campaign {campaign.pk} has no failed tasks")
    inputs = campaign_inputs(campaign)
    retry_inputs = [inputs[n - 1] for n in failed if 1 <= n <= len(inputs)]
    if len(retry_inputs) != len(failed):
        raise _nothing(user, "campaign_retry", target, "some failed tasks have no input line; cannot retry them")
    name = f"{campaign.name[:57]}-retry"
    cap = campaign.concurrency_cap if campaign.concurrency_cap and campaign.concurrency_cap <= len(failed) else None
    priority = min(campaign.priority, priority_limit(user, campaign.team))
    return campaign_launch_checked(
        user=user, team=campaign.team, agent_definition=campaign.agent_definition, inputs=retry_inputs, name=name,
        queue=campaign.queue, seats_per_task=campaign.seats_per_task, concurrency_cap=cap, priority=priority,
        model=campaign.model, policy=campaign.policy, token_cap=campaign.token_cap,
        cost_cap_usd=campaign.cost_cap_usd, urgent=campaign.urgent and priority > 0, retry_of=campaign,
        action="campaign_retry")


def campaign_finished_notify(*, campaign_id: int) -> bool:
    """E-mail the launcher that a campaign finished (counts, wall clock, cost) and check budgets.

    Called once per campaign, after the conditional update that marks it
    finished commits. Returns whether a mail was sent.
    """
    campaign = Campaign.objects.select_related("team", "launched_by").filter(pk=campaign_id).first()
    if campaign is None:
        return False
    billing.budget_check_alerts(teams=[campaign.team])
    summary = campaign_summary(campaign)
    email = campaign.launched_by.email
    if not email:
        return False
    states = ", ".join(f"{n} {s}" for s, n in summary["states"].items() if n)
    body = (f"Campaign {campaign.name} (#{campaign.pk}, job {campaign.job_number}) of team {campaign.team.name} "
            f"finished at {campaign.finished_at:%Y-%m-%d %H:%M:%S} UTC.\n\nTasks: {states}.\n"
            f"Wall clock: {summary['wallclock_s']:.0f} s. Cost: {billing._usd(summary['cost_usd'])}"
            f"{' (some tasks unpriced)' if summary['unpriced'] else ''}.\n")
    return billing.mail_safely(f"[tco] campaign {campaign.name} finished: {states}", body, [email])


def campaign_summary(campaign: Campaign) -> dict[str, Any]:
    """``{"states": {state: n}, "wallclock_s", "cost_usd" (Decimal), "unpriced": n, "failed": n}``."""
    states = dict(Task.objects.filter(campaign=campaign).values_list("state").annotate(n=Count("id")).order_by())
    cost = Decimal(0)
    unpriced = 0
    wall = 0.0
    for c, w, out in Task.objects.filter(campaign=campaign).values_list("cost_usd", "wallclock_s", "output_tokens"):
        if c is not None:
            cost += c
        elif out:
            unpriced += 1
        wall += w or 0.0
    return {"states": states, "wallclock_s": wall, "cost_usd": cost, "unpriced": unpriced,
            "failed": states.get("failed", 0) + states.get("lost", 0)}


def finished_notices(user: AbstractBaseUser, *, hours: float = 6.0) -> list[Campaign]:
    """Campaigns ``user`` launched that finished in the last ``hours`` (for the page notice)."""
    if not getattr(user, "is_authenticated", False):
        return []
    since = timezone.now() - dt.timedelta(hours=hours)
    return list(Campaign.objects.filter(launched_by=user, status="finished", finished_at__gte=since)
                .order_by("-finished_at")[:5])


# --------------------------------------------------------------------------- triage

def triage_overview(*, cluster: Cluster | None = None, scheduler=None, max_jobs: int = 50,
                    now: dt.datetime | None = None) -> dict[str, Any]:
    """Waiting jobs for admins: error-state jobs first, then by the longest wait.

    Each job: ``{"job_number", "name", "owner", "project", "campaign_id",
    "tasks": n waiting, "errors": n, "held": n, "ranges": {state: "1-3,5"},
    "submitted_at", "wait_s", "reasons": [{"text", "raw"}], "reason_error": str}``.
    Reasons come from ``qstat -j`` (``explain_pending``) with quotas, hosts and
    consumable capacities from the last cluster status. Returns ``{"jobs",
    "total_jobs", "total_tasks", "quotas", "generated_at"}``.
    """
    from schedulers.pending import explain_pending

    cluster = cluster or clusters.cluster_get_default()
    now = now or timezone.now()
    waiting = Task.objects.filter(cluster=cluster, active=True, state__in=TRIAGE_STATES)
    jobs = list(
        waiting.values("job_number")
        .annotate(n=Count("id"), errors=Count("id", filter=Q(state="error")), held=Count("id", filter=Q(state="held")),
                  submitted=Min("submitted_at"), name=Max("name"), owner=Max("owner"), project=Max("project"),
                  campaign_id=Max("campaign_id"))
        .order_by()
    )
    far_future = dt.datetime.max.replace(tzinfo=dt.timezone.utc)
    jobs.sort(key=lambda j: (0 if j["errors"] else 1, j["submitted"] or far_future, j["job_number"]))
    total_tasks = sum(j["n"] for j in jobs)
    shown = jobs[:max_jobs]
    numbers_by_job: dict[int, dict[str, list[int]]] = {}
    for job_number, task_number, state in waiting.filter(job_number__in=[j["job_number"] for j in shown]).values_list(
            "job_number", "task_number", "state"):
        numbers_by_job.setdefault(job_number, {}).setdefault(state, []).append(task_number)
    status = cluster.status or {}
    positions = scheduler_cache.pending_positions(cluster, {j["job_number"]: j["project"] for j in shown})
    out = []
    for job in shown:
        reasons: list[dict] = []
        reason_error = ""
        found = scheduler_cache.job_detail_cached(cluster, job["job_number"], scheduler=scheduler)
        try:
            if found["unknown_job"]:
                reason_error = "the scheduler no longer knows this job (it may have just started or ended)"
            elif found["detail"] is None:
                reason_error = f"reasons unavailable: {found['error']}"
            else:
                reasons = explain_pending(found["detail"], quota=status.get("quotas"), hosts=status.get("hosts"),
                                          capacities=status.get("global_capacity"))
                reasons += positions[job["job_number"]]
        except (ValueError, TypeError) as exc:
            reason_error = f"reasons unavailable: {exc}"
        submitted = job["submitted"]
        out.append({
            "job_number": job["job_number"], "name": job["name"], "owner": job["owner"], "project": job["project"],
            "campaign_id": job["campaign_id"], "tasks": job["n"], "errors": job["errors"], "held": job["held"],
            "ranges": {state: "not an array" if nums == [0] else f"tasks {ranges_text(_ranges(nums))}"
                       for state, nums in sorted(numbers_by_job.get(job["job_number"], {}).items())},
            "submitted_at": submitted,
            "wait_s": (now - submitted).total_seconds() if submitted else None,
            "reasons": reasons, "reason_error": reason_error,
        })
    return {"jobs": out, "total_jobs": len(jobs), "total_tasks": total_tasks, "quotas": status.get("quotas", []),
            "generated_at": now}


def parse_task_ranges(text: str, *, limit: int = services.MAX_TASKS_PER_CAMPAIGN) -> list[list[int]] | None:
    """``"1-3,5"`` -> ``[[1, 3], [5, 5]]``; empty -> None (the whole job). Raises LaunchError."""
    text = (text or "").strip()
    if not text:
        return None
    numbers: list[int] = []
    for part in text.split(","):
        part = part.strip()
        m = re.fullmatch(r"(\d{1,9})(?:-(\d{1,9}))?", part)
        if not m:
            raise LaunchError(f"tasks: {part!r} is not a task number or range like 1-5")
        first, last = int(m.group(1)), int(m.group(2) or m.group(1))
        if first < 1 or last < first:
            raise LaunchError(f"tasks: {part} is not a range of positive task numbers")
        if len(numbers) + last - first + 1 > limit:
            raise LaunchError(f"tasks: at most {limit} task numbers")
        numbers.extend(range(first, last + 1))
    return _ranges(numbers)


def triage_action(*, user: AbstractBaseUser, action: str, job_number: int, tasks: list[list[int]] | None = None,
                  priority: int | None = None, cluster: Cluster | None = None) -> AuditEntry:
    """An admin's hold, release, delete, priority change or error clearing on a waiting job.

    Admins only; the job must be one tco sees in the queue. Returns the
    queued audit entry. Raises ActionRefused, LaunchError.
    """
    target = f"job:{job_number}"
    audit_action = f"triage_{action}"[:32]
    params = {"job_number": job_number, "tasks": tasks, "priority": priority}
    if not user_can(user, "triage"):
        raise _refuse(user, audit_action, target, params, "only admins may triage jobs")
    if action not in TRIAGE_ACTIONS:
        raise _refuse(user, audit_action, target, params, f"unknown action {action!r}")
    cluster = cluster or clusters.cluster_get_default()
    if not Task.objects.filter(cluster=cluster, job_number=job_number, active=True).exists():
        raise _nothing(user, audit_action, target, f"job {job_number} is not in the queue")
    if action == "priority":
        if tasks is not None:
            raise _nothing(user, audit_action, target, "priority applies to the whole job; leave tasks empty")
        if priority is None or not services.PRIORITY_MIN <= priority <= services.PRIORITY_MAX:
            raise _nothing(user, audit_action, target,
                           f"priority: {services.PRIORITY_MIN} to {services.PRIORITY_MAX}")
    elif priority is not None:
        priority = None
    return _queue_control(user=user, action=audit_action, target=target, cluster=cluster, control=action,
                          job_number=job_number, ranges=tasks, priority=priority)


# --------------------------------------------------------------------------- execution (submit worker)

def control_execute(*, audit_id: int, scheduler=None) -> AuditEntry:
    """Run the control action a queued audit entry describes, and record its result there.

    Claimed with a conditional update (``result`` "queued…" -> "running"), so a
    duplicated delivery acts once. ``SchedulerUnavailable`` puts the entry
    back to queued and propagates, for the caller to retry; a refusal by the
    scheduler is recorded (``ok`` False, its message).
    """
    claimed = AuditEntry.objects.filter(pk=audit_id, result__startswith="queued").update(result="running")
    entry = AuditEntry.objects.select_related("user").get(pk=audit_id)
    if not claimed:
        return entry
    params = dict(entry.params)
    ranges = params.get("tasks")
    tasks = None if ranges is None else [n for a, b in ranges for n in range(a, b + 1)]
    try:
        cluster = Cluster.objects.get(pk=params["cluster"])
        scheduler = scheduler or clusters.scheduler_for(cluster)
        scheduler.control(params["control"], int(params["job_number"]), tasks, params.get("priority"))
    except SchedulerUnavailable:
        AuditEntry.objects.filter(pk=audit_id).update(result="queued (scheduler unavailable, retrying)")
        raise
    except SchedulerCommandError as exc:
        message = (exc.stderr or str(exc)).strip()
        params["status"] = "failed"
        AuditEntry.objects.filter(pk=audit_id).update(ok=False, result=f"failed: {message}"[:4000], params=params)
    except (ValueError, KeyError, Cluster.DoesNotExist) as exc:
        params["status"] = "failed"
        AuditEntry.objects.filter(pk=audit_id).update(ok=False, result=f"failed: {exc}"[:4000], params=params)
    else:
        params["status"] = "done"
        what = {"delete": "deleted", "hold": "held", "release": "released", "priority": "priority set",
                "clear_error": "error state cleared"}.get(params["control"], "done")
        AuditEntry.objects.filter(pk=audit_id).update(
            ok=True, result=f"{what}: job {params['job_number']} tasks {ranges_text(ranges)}", params=params)
    entry.refresh_from_db()
    return entry


def control_give_up(*, audit_id: int, message: str) -> None:
    """Record that a control action was never run (the scheduler stayed unreachable)."""
    entry = AuditEntry.objects.filter(pk=audit_id).first()
    if entry is None:
        return
    params = {**entry.params, "status": "failed"}
    AuditEntry.objects.filter(pk=audit_id, ok=False).update(result=f"failed: scheduler unavailable: {message}"[:4000],
                                                            params=params)


# --------------------------------------------------------------------------- agent definitions

def agent_definition_save(*, user: AbstractBaseUser, definition: AgentDefinition) -> AgentDefinition:
    """Save an agent definition from the registry form (admins only; audited). Raises ActionRefused."""
    target = f"agent:{definition.name}:v{definition.version}"
    params = {"name": definition.name, "version": definition.version, "command": definition.command,
              "input_kind": definition.input_kind, "default_model": definition.default_model}
    if not is_admin(user):
        raise _refuse(user, "agent_definition_save", target, params, "only admins may edit agent definitions")
    created = definition.pk is None
    definition.save()
    audit(user=user, action="agent_definition_save", target=target, params={**params, "status": "done"}, ok=True,
          result="created" if created else "updated")
    return definition
