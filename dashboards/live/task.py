"""One task's page data: state, timeline, why it waits, accounting fields, metered requests, logs."""
from __future__ import annotations

import datetime as dt
from typing import Any

from django.db.models import Count, Sum
from django.utils import timezone

from dashboards.core.encoding import jsonable, money_text
from dashboards.core.health import task_note
from dashboards.core.sandbox_limits import limits_shown
from dashboards.core.scope import Who, task_for, tasks_visible_to
from dashboards.core.spool_files import read_spool_file, task_output_path, task_outputs
from dashboards.core.stages import iso as _iso
from dashboards.core.stages import task_stages, timeline
from dashboards.core.states import TOKEN_FIELDS
from dashboards.live.campaign import failure_dict, shown_state_code, tokens_of
from dashboards.models import AccountingRecord, ModelRequest, Task
from schedulers.base import SCHEDULER_STATES
from schedulers.durations import hours_minutes_text

REQUESTS_SHOWN = 200


# --------------------------------------------------------------------------- agent page



def _policy(task: Task) -> dict[str, Any]:
    record = task.runner_record or {}
    if isinstance(record.get("policy"), str) and record["policy"].strip():
        return {"text": record["policy"], "source": "runner record"}
    campaign = task.campaign
    if campaign is not None and campaign.policy.strip():
        return {"text": campaign.policy, "source": "campaign"}
    if campaign is not None and campaign.agent_definition.default_policy.strip():
        return {"text": campaign.agent_definition.default_policy,
                "source": f"agent definition {campaign.agent_definition}"}
    return {"text": "", "source": None}


def _limits(task: Task, record: dict | None) -> dict[str, Any]:
    """The sandbox limits the task ran with (its runner record), else those its campaign asked for
    within the site's (``core.sandbox_limits.limits_shown``)."""
    from dashboards.core.limits import sandbox_limits_of
    from dashboards.launch.spool import campaign_spec

    planned = sandbox_limits_of(campaign_spec(task.campaign).get("limits")) if task.campaign is not None else None
    return limits_shown(record, planned)


def _task_requests(task: Task) -> dict[str, Any]:
    qs = ModelRequest.objects.filter(task=task)
    totals = qs.aggregate(n=Count("id"), cost=Sum("cost_usd"), **{f: Sum(f) for f in (*TOKEN_FIELDS,
                                                                                          "reasoning_tokens")})
    rows = []
    for r in qs.order_by("seq")[:REQUESTS_SHOWN]:
        rows.append({
            "seq": r.seq, "at": _iso(r.at), "provider": r.provider, "method": r.method, "path": r.path,
            "status": r.status, "requested_model": r.requested_model, "model": r.model,
            **{f: getattr(r, f) for f in (*TOKEN_FIELDS, "reasoning_tokens")},
            "tokens": tokens_of(r), "cost_usd": money_text(r.cost_usd), "complete": r.complete,
            "latency_ms": r.latency_ms, "flags": list(r.flags or []),
        })
    return {
        "rows": rows,
        "count": totals["n"] or 0,
        "shown": len(rows),
        "totals": {**{f: totals[f] or 0 for f in (*TOKEN_FIELDS, "reasoning_tokens")},
                   "cost_usd": money_text(totals["cost"])},
    }


def task_detail(user: Who, task_id: int, *, with_scheduler: bool = True) -> dict[str, Any]:
    """Everything the agent page shows about one task, JSON-ready. Raises ``Task.DoesNotExist``.

    Shape::

        {"generated_at", "task": {id, task_id, job_number, task_number, name,
           owner, project, state, state_code, restarted, active, queue, host,
           slots, priority, submitted_at, started_at, ended_at, wallclock_s,
           cpu_s, maxvmem_bytes, failed_code, exit_status, verdict, flags,
           tokens: {bucket: n, total}, cost_usd,
           accounting_check: {status: "confirmed"|"differs", buckets, message} | None},
         "campaign": {id, name, team} | None,
         "timeline": [{stage, label, start, end, seconds, overhead}],
         "stages": {queue_wait, sandbox_start, agent_work, integration_overhead} (s),
         "policy": {text, source}, "requests": {rows, count, shown, totals},
         "limits": {source, rows: [{what, value}], stopped_by} (core.sandbox_limits.limits_shown),
         "stdout": read_spool_file, "stderr": read_spool_file,
         "outputs": {dir, files, more, error},
         "runner": {exit_status, signal, flags, error, hostname} | None,
         "accounting": [accounting record dicts],
         "scheduler": job_detail_cached | None   # while the task is in qstat
         "pending_reasons": [{text, raw}] | None}  # while pending, held or in error; tco's hold first
    """
    from dashboards.core.holds import RELEASE_HINT, tco_holds, with_tco_hold
    from dashboards.core.scheduler_cache import job_detail_cached, pending_position
    from schedulers.pending import explain_pending

    task = task_for(user, task_id)
    record = task.runner_record or None
    accounting = [
        jsonable({k: v for k, v in row.items() if k not in ("id", "cluster_id", "task_id")})
        for row in AccountingRecord.objects.filter(task=task).order_by("end_us").values()[:20]
    ]
    scheduler = None
    reasons = None
    in_qstat = task.active and task.state in SCHEDULER_STATES
    if with_scheduler and in_qstat:
        scheduler = job_detail_cached(task.cluster, task.job_number)
        if task.state in ("pending", "held", "error") and scheduler["detail"]:
            status = task.cluster.status or {}
            from dashboards.launch.reservations import reservation_context
            reasons = explain_pending(scheduler["detail"], status.get("quotas"), status.get("hosts"),
                                      status.get("global_capacity"), queues=status.get("queues"),
                                      **reservation_context(status, cluster=task.cluster, user=user))
            reasons += pending_position(task.cluster, task.job_number, task.project, user=user)
        if task.state == "held":
            # tco's own hold, once and first, in place of the scheduler's "held by user" (core.holds.with_tco_hold):
            # said even when qstat -j does not answer.
            hold = tco_holds(task.cluster, job_numbers=[task.job_number]).get(task.job_number)
            if hold is not None:
                reasons = with_tco_hold(reasons or [], hold, hint=RELEASE_HINT)
    tokens = {f: getattr(task, f) for f in (*TOKEN_FIELDS, "reasoning_tokens")}
    tokens["total"] = tokens_of(task)
    campaign = task.campaign
    return {
        "generated_at": _iso(timezone.now()),
        "task": {
            "id": task.pk, "task_id": task.task_id, "job_number": task.job_number,
            "task_number": task.task_number, "name": task.name, "owner": task.owner, "project": task.project,
            "state": task.state, "state_code": shown_state_code(task), "restarted": task.restarted,
            "runner_note": task_note(task),
            "active": task.active, "queue": task.queue, "host": task.host, "slots": task.slots,
            "priority": task.priority, "submitted_at": _iso(task.submitted_at),
            "started_at": _iso(task.started_at), "ended_at": _iso(task.ended_at),
            "wallclock_s": task.wallclock_s, "cpu_s": task.cpu_s, "maxvmem_bytes": task.maxvmem_bytes,
            "failed_code": task.failed_code, "exit_status": task.exit_status, "verdict": task.verdict,
            "flags": list(task.usage_flags or []), "tokens": tokens, "cost_usd": money_text(task.cost_usd),
            "accounting_check": task.accounting_check,
            "failure": failure_dict(task),
        },
        "campaign": ({"id": campaign.pk, "name": campaign.name, "team": campaign.team.name}
                     if campaign is not None else None),
        "timeline": timeline(task),
        "stages": task_stages(task),
        "policy": _policy(task),
        "limits": _limits(task, record),
        "requests": _task_requests(task),
        "stdout": read_spool_file(task_output_path(task, "stdout")),
        "stderr": read_spool_file(task_output_path(task, "stderr")),
        "outputs": task_outputs(task),
        "runner": ({k: record.get(k) for k in ("exit_status", "signal", "flags", "error", "hostname",
                                                 "stdout_truncated", "stderr_truncated")}
                   if isinstance(record, dict) else None),
        "accounting": accounting,
        "accounting_rows": [accounting_fields(row) for row in accounting],
        "scheduler": scheduler,
        "pending_reasons": reasons,
        "progress": task_progress(task),
        "neighbours": task_neighbours(user, task),
    }


#: Accounting record fields as people read them: field -> (label, unit kind).
ACCOUNTING_LABELS = {
    "job_number": ("job", ""), "task_number": ("array task", ""), "pe_taskid": ("parallel task", ""),
    "submitted_at": ("submitted (UTC)", "time"), "started_at": ("started (UTC)", "time"),
    "ended_at": ("ended (UTC)", "time"), "job_name": ("job name", ""), "owner": ("owner", ""),
    "group": ("group", ""), "project": ("project", ""), "department": ("department", ""),
    "account": ("account", ""), "queue": ("queue", ""), "hostname": ("host", ""), "slots": ("slots", ""),
    "wallclock_s": ("wall clock", "s"), "wallclock_exact_s": ("wall clock, exact", "s"),
    "cpu_s": ("CPU time", "s"), "maxvmem_bytes": ("peak virtual memory", "bytes"),
    "failed": ("failed code (0: none)", ""), "exit_status": ("exit status", ""), "category": ("requests (-l, -q, -P)", ""),
}
_HIDDEN_ACCOUNTING = {"submission_us", "start_us", "end_us", "usage"}


def _bytes_text(value: float) -> str:
    """Bytes in binary units: ``1.50 GiB (1610612736 bytes)``."""
    n = float(value)
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.2f} {unit} ({n:.0f} bytes)"
    return f"{n:.0f} bytes"


def accounting_fields(row: dict[str, Any]) -> list[list[str]]:
    """One accounting record (``AccountingRecord`` values, JSON-ready) as ``[[label, text]]``:
    plain names, seconds with ``s`` (and minutes or hours past a minute), memory in KiB/MiB/GiB,
    times in UTC without the zone letter; empty and internal fields left out."""
    out = []
    for key, value in row.items():
        if key in _HIDDEN_ACCOUNTING or value is None or value == "":
            continue
        label, kind = ACCOUNTING_LABELS.get(key, (key.replace("_", " "), ""))
        if kind == "s":
            seconds = float(value)
            text = f"{seconds:.3f} s" if seconds < 60 else f"{seconds:.0f} s ({hours_minutes_text(seconds)})"
        elif kind == "bytes":
            text = _bytes_text(value)
        elif kind == "time":
            text = str(value).replace("T", " ").replace("Z", "").split("+")[0]
        else:
            text = str(value)
        out.append([label, text])
    return out


def task_progress(task: Task, *, now: dt.datetime | None = None) -> dict[str, Any] | None:
    """While a task runs: ``{"started_at": ISO, "elapsed_s", "expected_s", "expected_from",
    "timeout_s", "pct"}`` (None otherwise). ``expected_s`` is the campaign's median run time
    (scheduler start to end, finished tasks) when at least one task ended, else the agent's
    timeout; ``pct`` is elapsed over expected, at most 99 while it still runs."""
    start = task.task_started_at or task.started_at
    if not task.active or task.state not in ("running", "starting", "suspended", "finishing") or start is None:
        return None
    now = now or timezone.now()
    elapsed = max((now - start).total_seconds(), 0.0)
    campaign = task.campaign
    timeout = campaign.agent_definition.timeout_s if campaign is not None else None
    expected, source = None, ""
    if campaign is not None:
        walls = sorted(Task.objects.filter(campaign=campaign, state="done", wallclock_s__isnull=False)
                       .values_list("wallclock_s", flat=True)[:1000])
        if walls:
            from dashboards.core.stages import quantile

            expected, source = quantile(walls, 0.5), f"median of {len(walls)} finished task(s)"
    if expected is None and timeout:
        expected, source = float(timeout), "the agent's timeout"
    pct = None if not expected else round(min(99.0, 100.0 * elapsed / expected), 1)
    return {"started_at": _iso(start), "elapsed_s": round(elapsed, 3), "expected_s": expected,
            "expected_from": source, "timeout_s": timeout, "pct": pct}


def task_neighbours(user: Who, task: Task) -> dict[str, Any]:
    """The previous and next task of the same campaign by task number, that ``user`` may see:
    ``{"previous": {id, task_id} | None, "next": {id, task_id} | None}`` (both None outside a campaign)."""
    out: dict[str, Any] = {"previous": None, "next": None}
    if task.campaign_id is None:
        return out
    siblings = tasks_visible_to(user).filter(campaign_id=task.campaign_id)
    before = siblings.filter(task_number__lt=task.task_number).order_by("-task_number", "-id").first()
    after = siblings.filter(task_number__gt=task.task_number).order_by("task_number", "id").first()
    for key, found in (("previous", before), ("next", after)):
        if found is not None:
            out[key] = {"id": found.pk, "task_id": found.task_id}
    return out


def task_logs(user: Who, task_id: int) -> dict[str, Any]:
    """The live tail of a task's stdout and stderr: ``{"stdout": read_spool_file, "stderr": ...,
    "active": bool, "generated_at"}``. Raises ``Task.DoesNotExist``."""
    task = task_for(user, task_id)
    return {"stdout": read_spool_file(task_output_path(task, "stdout")),
            "stderr": read_spool_file(task_output_path(task, "stderr")),
            "active": task.active, "generated_at": _iso(timezone.now())}
