"""Every limit a launch is checked against, in one place.

The scheduler's absolute ``-p`` range (qsub(1): -1023..1024, above 0 only for
operators and managers) is the Grid Engine adapter's constant and is imported
from there; what a *role* may ask for within it is decided here, as are the
tasks per campaign, the model API seats per task, the name patterns and the
input and policy sizes. Forms, the launch service and the control actions
read these; nothing else defines a limit.
"""
from __future__ import annotations

import re

from django.contrib.auth.models import AbstractBaseUser

from dashboards.core.roles import user_can
from schedulers.base import PRIORITY_MAX, PRIORITY_MIN

#: Campaign and project names: what Grid Engine accepts in a job name and a project (sge_types(1)).
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
#: Model names as providers spell them (``claude-sonnet-4-5``, ``openai/gpt-4o``, ``x@2025``).
MODEL_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:/@-]{0,127}$")
#: Tasks per campaign: Grid Engine's default ``max_aj_tasks`` (sge_conf(5)).
MAX_TASKS_PER_CAMPAIGN = 75_000
#: Model API seats (the consumable) one task may request.
SEATS_PER_TASK_MAX = 16
#: qsub -p of an urgent agent (the maximum; the submit account is an operator).
URGENT_PRIORITY = PRIORITY_MAX
#: The highest -p a launcher without the urgent role may ask for (Grid Engine lets users only lower).
NORMAL_PRIORITY_MAX = 0
#: Job and advance-reservation numbers are 31-bit in Grid Engine.
MAX_JOB_NUMBER = 2**31 - 1
#: A JSONL input (text or upload), in bytes.
INPUT_MAX_BYTES = 16 * 1024 * 1024
#: A sandbox policy typed at launch, in bytes.
POLICY_MAX_BYTES = 64 * 1024
#: How deep a JSON input or parameter value may nest (arrays and objects), so parsing never recurses
#: into Python's stack limit.
INPUT_MAX_DEPTH = 64
#: Beyond this many task ranges a control action addresses the whole job (argv stays short).
MAX_RANGES = 200

#: The sandbox limits a launch may set per campaign (the runner spec's ``limits`` key -> the site's
#: setting in ``TCO_SANDBOX_LIMITS``, whose value is the site's maximum; docs/limits.md).
LAUNCH_SANDBOX_LIMITS = {"memory_bytes": "TCO_SANDBOX_MEMORY_BYTES", "work_bytes": "TCO_SANDBOX_WORK_BYTES"}
#: The least a launch may ask for, bytes: below these the relay's and agents' interpreters do not start.
LAUNCH_SANDBOX_MINIMA = {"memory_bytes": 64 << 20, "work_bytes": 1 << 20}

__all__ = ["NAME_RE", "MODEL_RE", "MAX_TASKS_PER_CAMPAIGN", "SEATS_PER_TASK_MAX", "PRIORITY_MIN", "PRIORITY_MAX",
           "URGENT_PRIORITY", "NORMAL_PRIORITY_MAX", "MAX_JOB_NUMBER", "INPUT_MAX_BYTES", "POLICY_MAX_BYTES",
           "INPUT_MAX_DEPTH", "MAX_RANGES", "LAUNCH_SANDBOX_LIMITS", "LAUNCH_SANDBOX_MINIMA", "priority_limit",
           "sandbox_maxima", "sandbox_ceiling", "sandbox_limits_of"]


def priority_limit(user: AbstractBaseUser, team) -> int:
    """The highest ``-p`` ``user`` may ask for on ``team``: ``URGENT_PRIORITY`` (1024) for urgent
    launchers, else ``NORMAL_PRIORITY_MAX`` (0). The lowest is always ``PRIORITY_MIN``."""
    return URGENT_PRIORITY if user_can(user, "urgent", team) else NORMAL_PRIORITY_MAX


def sandbox_maxima() -> dict[str, int]:
    """The site's sandbox limits per task, bytes, keyed as the runner spec's ``limits``: each of
    :data:`LAUNCH_SANDBOX_LIMITS` from ``settings.TCO_SANDBOX_LIMITS`` (the values the submit worker
    passes to every runner), else the runner's default (``execution.runner.config.LIMIT_DEFAULTS``).
    A launch may ask for less, never more."""
    from django.conf import settings

    from execution.runner.config import LIMIT_DEFAULTS

    site = getattr(settings, "TCO_SANDBOX_LIMITS", {}) or {}
    return {key: int(site.get(name) or LIMIT_DEFAULTS[name]) for key, name in LAUNCH_SANDBOX_LIMITS.items()}


def sandbox_ceiling(queue: str = "", agent: str = "") -> dict[str, dict[str, object]]:
    """The sandbox limits a launch of agent definition ``agent`` (its name) into ``queue`` may ask
    for, keyed as :data:`LAUNCH_SANDBOX_LIMITS`: ``{"max": bytes, "default": bytes, "by": str}``.

    ``max``: the smallest of the site's maximum (:func:`sandbox_maxima`), the queue's ``max`` in
    ``settings.TCO_QUEUE_SANDBOX_LIMITS`` and the agent's in ``settings.TCO_AGENT_SANDBOX_LIMITS``;
    ``by`` says whose it is ("the site's maximum", "the queue agent.q's ceiling", "the agent
    demo-agent's ceiling"). ``default``: what a launch that leaves the limit blank runs with, the
    smallest of the queue's and the agent's ``default`` where set, never above ``max``; else ``max``.
    A blank ``queue`` or ``agent`` has no entry of its own (the site's values)."""
    from django.conf import settings

    site = sandbox_maxima()
    tables = (("queue", queue, getattr(settings, "TCO_QUEUE_SANDBOX_LIMITS", {}) or {}),
              ("agent", agent, getattr(settings, "TCO_AGENT_SANDBOX_LIMITS", {}) or {}))
    out: dict[str, dict[str, object]] = {}
    for key in LAUNCH_SANDBOX_LIMITS:
        high, by, defaults = site[key], "the site's maximum", []
        for kind, name, table in tables:
            bounds = (table.get(name) or {}).get(key) or {} if name else {}
            if "max" in bounds and bounds["max"] < high:
                high, by = bounds["max"], f"the {kind} {name}'s ceiling"
            if "default" in bounds:
                defaults.append(bounds["default"])
        out[key] = {"max": high, "default": min([high, *defaults]), "by": by}
    return out


def sandbox_limits_of(asked: dict | None) -> dict[str, int]:
    """The limits a task of a campaign runs with, bytes: the site's maxima (:func:`sandbox_maxima`)
    lowered by what the campaign asked for (``asked``: the runner spec's ``limits``, may be None)."""
    values = sandbox_maxima()
    for key, value in (asked or {}).items():
        if key in values and isinstance(value, int) and value >= 1:
            values[key] = min(values[key], value)
    return values
