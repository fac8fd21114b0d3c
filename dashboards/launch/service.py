"""The launch service: the one way a campaign is launched (form, urgent page, retry, demo commands).

A caller fills a :class:`LaunchRequest` and calls :func:`launch`. It checks,
in order, and on the first refusal writes an audit entry and submits nothing:

1. role: ``launch`` on the team (``urgent`` for an urgent launch);
2. limits (``dashboards.core.limits``): name, queue, tasks, seats (at least 1 where
   ``TCO_SEAT_RESOURCE`` meters the model API), caps, the
   priority range of the user's role, predecessor job, outputs;
3. the sandbox policy, with the runner's own validator
   (``execution.sandbox.policy.load_policy``), then against the admins'
   ceilings (``PolicyCeiling``, ``execution.sandbox.ceiling``) and the
   registered model endpoints (``ModelEndpoint``): only those ever get a
   credential;
4. the team's budget (``refuse``, or ``hold``: submitted on hold).

Then, in one transaction, it records the campaign, writes its inputs and
runner spec to the spool, writes the audit entry, and queues the submission
(``worker.tasks.submit_campaign``, after commit).
"""
from __future__ import annotations

import dataclasses
import json
import posixpath
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.utils import timezone

from dashboards.billing import budgets, costs
from dashboards.core import clusters as core_clusters
from dashboards.core import enqueue, failures, limits, realtime
from dashboards.core.audit import audit, refused
from dashboards.core.errors import ActionRefused, LaunchError, Refused
from dashboards.core.roles import teams_with, user_can
from dashboards.launch import forecast as launch_forecast
from dashboards.launch import inputs
from dashboards.launch import reservations as launch_reservations
from dashboards.launch import spool as launch_spool
from dashboards.launch.forecast_record import forecast_record
from dashboards.launch.policy import ceilings_for, check_policy
from dashboards.launch.predecessor import check_predecessor
from dashboards.launch.request import MAX_OUTPUTS, LaunchRequest
from dashboards.launch.spool import campaign_inputs
from dashboards.models import AgentDefinition, Campaign, Cluster, Task, Team
from execution.spool import spec as spool_spec
from execution.spool.contract import SpecError

#: The runner spec version this launch writes (execution/runner/ reads it).




@dataclasses.dataclass
class LaunchOutcome:
    """A launch that was accepted: the campaign, the forecast shown, the budget verdict."""

    campaign: Campaign
    forecast: dict[str, Any]
    verdict: dict[str, Any]

    @property
    def held_for_budget(self) -> bool:
        return self.verdict["action"] == "hold"


# --------------------------------------------------------------------------- checks

def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_limits(req: LaunchRequest) -> None:
    """The request's values against ``dashboards.core.limits`` (not the role's priority limit).
    Raises LaunchError naming the field."""
    name = str(req.name).strip()
    if not limits.NAME_RE.match(name):
        raise LaunchError("campaign name: 1-64 letters, digits, '_', '.', '-' (no spaces or colons)")
    if req.queue not in settings.TCO_QUEUES:
        raise LaunchError(f"queue {req.queue!r} is not one of {', '.join(settings.TCO_QUEUES)}")
    count = len(req.inputs)
    if not 1 <= count <= limits.MAX_TASKS_PER_CAMPAIGN:
        raise LaunchError(f"a campaign has 1 to {limits.MAX_TASKS_PER_CAMPAIGN} tasks, not {count}")
    if not all(isinstance(item, dict) for item in req.inputs):
        raise LaunchError("every input must be a JSON object")
    if not _is_int(req.seats_per_task) or not 0 <= req.seats_per_task <= limits.SEATS_PER_TASK_MAX:
        raise LaunchError(f"seats per task: 0 to {limits.SEATS_PER_TASK_MAX}")
    seat = settings.TCO_SEAT_RESOURCE
    if seat and req.seats_per_task < 1:
        # A job without the consumable in its hard resource list holds no seat, yet its agent calls
        # the model: zero seats would bypass the site's model API limit (fresh-clone attack, finding 1).
        raise LaunchError(f"seats per task: at least 1 (every agent calls the model API, which this site "
                          f"meters with the {seat} consumable)")
    if req.concurrency_cap is not None and (not _is_int(req.concurrency_cap)
                                            or not 1 <= req.concurrency_cap <= count):
        raise LaunchError(f"concurrency cap: 1 to {count}")
    if not _is_int(req.priority) or not limits.PRIORITY_MIN <= req.priority <= limits.PRIORITY_MAX:
        raise LaunchError(f"priority: an integer from {limits.PRIORITY_MIN} to {limits.PRIORITY_MAX}")
    for label, value in (("predecessor job", req.predecessor_job), ("advance reservation", req.advance_reservation)):
        if value is not None and (not _is_int(value) or not 1 <= value <= limits.MAX_JOB_NUMBER):
            raise LaunchError(f"{label}: a positive job or reservation number")
    if req.token_cap is not None and (not _is_int(req.token_cap) or req.token_cap < 1):
        raise LaunchError("token cap: a positive number of tokens per task")
    if req.cost_cap_usd is not None and (not isinstance(req.cost_cap_usd, Decimal) or not req.cost_cap_usd.is_finite()
                                         or req.cost_cap_usd <= 0):
        raise LaunchError("cost cap: a positive amount of USD per task")
    if req.model and not limits.MODEL_RE.match(req.model):
        raise LaunchError("model: 1-128 letters, digits and '.', '_', '-', '/', ':', '@'")
    if not isinstance(req.rerunnable, bool):
        raise LaunchError("rerunnable: true or false")
    check_sandbox_limits(req)
    outputs = list(req.outputs or ())
    if len(outputs) > MAX_OUTPUTS:
        raise LaunchError(f"outputs: at most {MAX_OUTPUTS}")
    for item in outputs:
        if (not isinstance(item, str) or not item or len(item) > 255 or item.startswith("/")
                or any(c in item for c in "\0\n\r") or ".." in posixpath.normpath(item).split("/")):
            raise LaunchError(f"outputs: {str(item)[:60]!r} is not a relative path in the work directory")


def check_sandbox_limits(req: LaunchRequest) -> None:
    """The request's sandbox limits (``memory_bytes``, ``work_bytes``) against the ceiling of its
    queue and agent (``limits.sandbox_ceiling``: the site's maximum, lowered by an admin's per-queue
    and per-agent ceilings) and ``limits.LAUNCH_SANDBOX_MINIMA``. Raises LaunchError naming the
    limit, its range in MiB and whose ceiling it is."""
    ceiling = limits.sandbox_ceiling(str(req.queue), req.agent_definition.name)
    for key, label in (("memory_bytes", "memory limit per task"), ("work_bytes", "disk limit per task")):
        value = getattr(req, key)
        if value is None:
            continue
        low, high = limits.LAUNCH_SANDBOX_MINIMA[key], ceiling[key]["max"]
        if not _is_int(value) or not low <= value <= high:
            shown = f"{value >> 20} MiB" if _is_int(value) and value >= 1 << 20 else f"{value!r} bytes"
            raise LaunchError(f"{label}: {low >> 20} to {high >> 20} MiB for {req.agent_definition.name} on "
                              f"{req.queue} ({ceiling[key]['by']}), not {shown}")


def sandbox_limits_to_run(req: LaunchRequest) -> dict[str, int]:
    """The runner spec's ``limits`` for ``req``: what it asked for, and for a limit left blank the
    default of its queue and agent (``limits.sandbox_ceiling``) where that is below the site's
    maximum (the runner takes the site's value for a limit the spec does not name). Bytes."""
    ceiling = limits.sandbox_ceiling(str(req.queue), req.agent_definition.name)
    site = limits.sandbox_maxima()
    chosen = req.sandbox_limits()
    for key, bounds in ceiling.items():
        if key not in chosen and bounds["default"] < site[key]:
            chosen[key] = bounds["default"]
    return chosen


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
    fc = costs.forecast(agent_definition=agent_definition, count=count, model=model)
    expected = expected_cost(fc, count, cost_cap_usd)
    return {"forecast": fc, "expected_usd": expected, "verdict": budgets.budget_verdict(team, expected)}


# --------------------------------------------------------------------------- the service

def launch(*, user: AbstractBaseUser, request: LaunchRequest) -> LaunchOutcome:
    """Launch ``request`` for ``user``: check role, limits, policy and budget, then record the
    campaign, audit it and queue its submission (module doc).

    Raises ActionRefused (role, the role's priority limit, budget) and LaunchError (input);
    both are audited and nothing is recorded or submitted. A ``hold`` budget verdict submits
    the campaign on hold (``Campaign.submit_on_hold``).
    """
    req = request
    action = req.action
    params = req.audit_params()
    try:
        model, policy, endpoints, chosen, preview = _checked(user, req, params)
    except Refused as exc:  # audited once, whichever check refused
        raise refused(user, action, f"team:{req.team.project}", params, str(exc), error=type(exc)) from None
    verdict = preview["verdict"]
    # The forecast the campaign keeps, from the poll's figures (a launch never waits for qstat).
    preview = launch_forecast.complete_preview(user=user, request=req, preview=preview, ask_scheduler=False)
    try:
        with transaction.atomic():
            campaign = _record(user=user, req=req, model=model, policy=policy, endpoints=endpoints, chosen=chosen,
                               hold=verdict["action"] == "hold", forecast=forecast_record(preview))
            _accepted(user, action, campaign, params, verdict)
    except OSError as exc:  # the spool (full, unwritable): nothing recorded, nothing submitted
        raise refused(user, action, f"team:{req.team.project}", params,
                      f"the campaign's files could not be written to the spool: {exc.strerror or exc}; nothing "
                      "was recorded or submitted (ask an admin to free space in the spool)", error=LaunchError) from None
    realtime.queue_changed(campaign.cluster.name, {campaign.pk})
    return LaunchOutcome(campaign=campaign, forecast=preview["forecast"], verdict=verdict)


def _accepted(user: AbstractBaseUser, action: str, campaign: Campaign, params: dict[str, Any],
              verdict: dict[str, Any]) -> None:
    """The audit entry of an accepted launch (inside its transaction)."""
    result = f"campaign {campaign.pk} accepted ({campaign.task_count} tasks)"
    if verdict["action"] == "hold":
        result += f"; submitted on hold: {verdict['message']}"
    audit(user=user, action=action, target=f"campaign:{campaign.pk}", params={**params, "status": "done"},
          ok=True, result=result)


def launch_refusal(*, user: AbstractBaseUser, request: LaunchRequest, preview: dict[str, Any] | None = None) -> str:
    """What Launch would refuse ``request`` with, said before it (the launch page's forecast): the
    launch's own checks (:func:`_checked`: role, limits, inputs, predecessor, reservation, the whole
    sandbox and network policy check, budget), run without an audit entry or any other side effect;
    "" when Launch would accept it. A request without a name (a forecast needs none) is checked as if
    it had one. ``preview``: :func:`launch_preview`'s answer for this request when the caller has it
    (the budget check then reads its expected cost instead of forecasting again)."""
    req = request if str(request.name).strip() else dataclasses.replace(request, name="forecast")
    try:
        _checked(user, req, req.audit_params(), preview)
    except Refused as exc:
        return str(exc)
    return ""


def _checked(user: AbstractBaseUser, req: LaunchRequest, params: dict[str, Any],
             preview: dict[str, Any] | None = None):
    """Every check of a launch, in the module doc's order, without side effects but ``params``
    (the audit entry's, given the expected cost): ``(model, policy, endpoints, chosen endpoint,
    preview)``; ``preview``: :func:`launch_preview`'s answer for ``req`` if already computed. Raises ``ActionRefused`` (role, the role's priority limit, budget) or
    ``LaunchError`` (limits, inputs, predecessor, reservation, policy); the caller audits it."""
    if not user_can(user, "launch", req.team):
        raise ActionRefused(f"you may not launch campaigns for team {req.team.name}")
    if req.urgent and not user_can(user, "urgent", req.team):
        raise ActionRefused(f"only urgent launchers of {req.team.name} may launch urgent agents")
    limit = limits.priority_limit(user, req.team)
    if not _is_int(req.priority) or not limits.PRIORITY_MIN <= req.priority <= limit:
        raise ActionRefused(f"priority must be from {limits.PRIORITY_MIN} to {limit} for your role")
    check_limits(req)
    inputs.check_inputs(req.agent_definition.name, list(req.inputs))
    check_predecessor(user, req.predecessor_job, len(req.inputs), req.cluster or core_clusters.cluster_get_default())
    launch_reservations.check_launch_into(user=user, team=req.team, ar_id=req.advance_reservation, cluster=req.cluster)
    model = req.model or req.agent_definition.default_model
    policy, endpoints, chosen = check_policy(req.policy or req.agent_definition.default_policy, req.team,
                                             req.agent_definition, model_endpoint=req.model_endpoint)
    if preview is None:
        preview = launch_preview(user=user, team=req.team, agent_definition=req.agent_definition,
                                 count=len(req.inputs), model=model, cost_cap_usd=req.cost_cap_usd)
    params["expected_usd"] = str(preview["expected_usd"]) if preview["expected_usd"] is not None else None
    if preview["verdict"]["action"] == "refuse":
        raise ActionRefused(f"over budget: {preview['verdict']['message']}")
    return model, policy, endpoints, chosen, preview


def _record(*, user, req: LaunchRequest, model: str, policy: str, endpoints, chosen, hold: bool,
            forecast: dict[str, Any] | None = None) -> Campaign:
    """Create the campaign (keeping ``forecast``, ``forecast_record``'s), write its inputs and runner
    spec, queue the submission after commit."""
    cluster = req.cluster or core_clusters.cluster_get_default()
    campaign = Campaign.objects.create(
        name=str(req.name).strip(), cluster=cluster, team=req.team, agent_definition=req.agent_definition,
        launched_by=user, queue=req.queue, task_count=len(req.inputs), seats_per_task=req.seats_per_task,
        concurrency_cap=req.concurrency_cap, priority=req.priority, urgent=req.urgent, model=model, policy=policy,
        predecessor_job=req.predecessor_job, advance_reservation=req.advance_reservation, token_cap=req.token_cap,
        cost_cap_usd=req.cost_cap_usd, submit_on_hold=hold, rerunnable=req.rerunnable, retry_of=req.retry_of,
        launched_at=timezone.now(), forecast=forecast)
    encoded = [json.dumps(item, separators=(",", ":"), sort_keys=True) for item in req.inputs]
    try:
        registered = [spool_spec.ModelEndpoint.from_json(e.spec_entry()) for e in endpoints]
    except SpecError as exc:
        raise LaunchError(f"registered model endpoint: {exc}") from None
    # The ceilings' network parts go with the spec: a runner re-checks a live network policy change.
    network_ceilings = [{"label": label, "network_policies": json.loads(json.dumps(
        ceiling.data.get("network_policies") or {}, default=str))}
        for label, ceiling in ceilings_for(req.team, req.agent_definition)]
    launch_spool.campaign_spool_write(
        campaign, encoded, outputs=list(req.outputs or ()), model_endpoints=registered,
        network_ceilings=network_ceilings, limits=sandbox_limits_to_run(req),
        model_endpoint=({"base_url": chosen.base_url, "credential_name": chosen.credential_name}
                        if chosen is not None else None))
    launch_spool.prices_write()
    transaction.on_commit(lambda: enqueue.send(enqueue.SUBMIT_CAMPAIGN, campaign.pk))
    return campaign


# --------------------------------------------------------------------------- callers' shapes

def urgent_launch(*, user: AbstractBaseUser, team: Team, agent_definition: AgentDefinition, input: dict[str, Any],
                  name: str = "", queue: str = "agent.q", seats_per_task: int = 1, model: str = "",
                  cluster: Cluster | None = None) -> LaunchOutcome:
    """One urgent agent: submitted with ``-p limits.URGENT_PRIORITY`` by the operator account, so it
    starts at the next free slot the scheduler's policy gives. Urgent launchers only."""
    if not isinstance(input, dict):
        raise LaunchError("the urgent agent's input must be a JSON object")
    name = (name or f"urgent-{agent_definition.name}").strip()
    return launch(user=user, request=LaunchRequest(
        team=team, agent_definition=agent_definition, inputs=[input], name=name, queue=queue,
        seats_per_task=seats_per_task, priority=limits.URGENT_PRIORITY, model=model, urgent=True,
        action="urgent_launch", cluster=cluster))




def campaign_retry(*, user: AbstractBaseUser, campaign: Campaign,
                   infrastructure_only: bool = False) -> LaunchOutcome:
    """Launch the failed (and lost) tasks of ``campaign`` again, as a new campaign linked by ``retry_of``;
    with ``infrastructure_only``, only those the infrastructure failed (``core.failures``: an execution
    host lost, the shepherd failed; not the agent's own failures).

    Same team, agent, queue, seats, model, policy, endpoint, outputs and caps;
    the concurrency cap is kept if it still fits, the priority lowered to the
    user's limit. Raises ActionRefused, LaunchError.
    """
    target = f"campaign:{campaign.pk}"
    params = {"infrastructure_only": True} if infrastructure_only else {}
    if not user_can(user, "control", campaign.team):
        raise refused(user, "campaign_retry", target, params,
                      f"you may not control campaigns of team {campaign.team.name}")
    chosen = Task.objects.filter(campaign=campaign, state__in=("failed", "lost"))
    if infrastructure_only:
        chosen = chosen.filter(failures.infrastructure_filter())
    failed = list(chosen.order_by("task_number").values_list("task_number", flat=True).distinct())
    if not failed:
        raise refused(user, "campaign_retry", target, params,
                      f"campaign {campaign.pk} has no tasks failed by the infrastructure" if infrastructure_only
                      else f"campaign {campaign.pk} has no failed tasks", error=LaunchError)
    inputs = campaign_inputs(campaign)
    retry_inputs = [inputs[n - 1] for n in failed if 1 <= n <= len(inputs)]
    if len(retry_inputs) != len(failed):
        raise refused(user, "campaign_retry", target, {}, "some failed tasks have no input line; cannot retry them",
                      error=LaunchError)
    spec = launch_spool.campaign_spec(campaign)
    chosen = spec.get("model_endpoint") or {}
    endpoint_name = next((e["name"] for e in spec.get("model_endpoints") or []
                          if chosen and f"{e['scheme']}://{e['host']}:{e['port']}" == chosen.get("base_url")), "")
    cap = campaign.concurrency_cap if campaign.concurrency_cap and campaign.concurrency_cap <= len(failed) else None
    priority = min(campaign.priority, limits.priority_limit(user, campaign.team))
    return launch(user=user, request=LaunchRequest(
        team=campaign.team, agent_definition=campaign.agent_definition, inputs=retry_inputs,
        name=f"{campaign.name[:57]}-retry", queue=campaign.queue, seats_per_task=campaign.seats_per_task,
        concurrency_cap=cap, priority=priority, model=campaign.model, policy=campaign.policy,
        model_endpoint=endpoint_name, advance_reservation=campaign.advance_reservation,
        token_cap=campaign.token_cap, cost_cap_usd=campaign.cost_cap_usd,
        outputs=(spec.get("agent") or {}).get("outputs") or (), urgent=campaign.urgent and priority > 0,
        retry_of=campaign, cluster=campaign.cluster, rerunnable=campaign.rerunnable, action="campaign_retry",
        **_retry_limits(spec, campaign)))


def _retry_limits(spec: dict[str, Any], campaign: Campaign) -> dict[str, int]:
    """The sandbox limits a campaign's spec asked for, as ``LaunchRequest`` fields, each lowered to
    today's ceiling of its queue and agent (``limits.sandbox_ceiling``: a retry is never refused
    because an admin lowered a limit)."""
    ceiling = limits.sandbox_ceiling(campaign.queue, campaign.agent_definition.name)
    asked = spec.get("limits") or {}
    return {key: min(asked[key], ceiling[key]["max"]) for key in limits.LAUNCH_SANDBOX_LIMITS
            if _is_int(asked.get(key)) and asked[key] >= 1}


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
