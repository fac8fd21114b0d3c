"""The audit log: one writer for every launch, control, budget and registry action.

Every action a user asks for, allowed or refused, writes one ``AuditEntry``:
who, what (``action``, ``target``, ``params``), when, result. Refusals go
through :func:`refuse`, which writes the entry and returns the exception to
raise, so a refusal is never left unrecorded.
"""
from __future__ import annotations

import datetime as dt

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import Q, QuerySet

from dashboards.core.errors import ActionRefused
from dashboards.core.roles import is_admin, user_can
from dashboards.models import AuditEntry


def audit(*, user: AbstractBaseUser | None, action: str, target: str = "", params: dict | None = None,
          ok: bool, result: str = "") -> AuditEntry:
    """Write one audit entry. ``params`` must be JSON-ready; ``action`` is cut at 32 characters,
    ``target`` at 128, ``result`` at 4,000. An anonymous ``user`` is stored as none."""
    return AuditEntry.objects.create(
        user=user if user is not None and getattr(user, "is_authenticated", False) else None,
        action=action[:32], target=target[:128], params=params or {}, ok=ok, result=result[:4000])


def audit_entries(user: AbstractBaseUser, *, action: str = "", limit: int = 200) -> list[AuditEntry]:
    """The newest audit entries (admins only), at most ``limit`` (1..1000). Raises ActionRefused."""
    if not user_can(user, "audit"):
        raise ActionRefused("only admins may read the audit log")
    entries = AuditEntry.objects.select_related("user").order_by("-at", "-id")
    if action:
        entries = entries.filter(action=action)
    return list(entries[:max(1, min(limit, 1000))])


def refused(user, action: str, target: str, params: dict | None, message: str, *,
            error: type[Exception] = ActionRefused) -> Exception:
    """Audit a refusal (``params["status"] = "refused"``, result ``refused: <message>``) and return
    ``error(message)`` for the caller to raise: ActionRefused for a role or permission, the
    launch's ``LaunchError`` for input that cannot be acted on."""
    audit(user=user, action=action, target=target, params={**(params or {}), "status": "refused"}, ok=False,
          result=f"refused: {message}")
    return error(message)


# --------------------------------------------------------------------------- audit log (admins)

AUDIT_PER_PAGE = 50
#: Sort keys of the audit table: URL ``sort`` -> the ordering (newest first by default).
AUDIT_SORTS = {"at": ("at", "id"), "who": ("user__username", "at"), "action": ("action", "at"),
               "target": ("target", "at"), "ok": ("ok", "at")}
AUDIT_FILTERS = ("action", "who", "ok", "q", "since", "until")
_PARAM_LABELS = {"job_number": "job", "tasks": "tasks", "priority": "priority", "status": "status",
                 "cluster": "cluster", "campaign": "campaign", "control": "scheduler action", "command": "command",
                 "count": "tasks", "period": "period", "amount_usd": "amount (USD)", "path": "page"}


def audit_search(user: AbstractBaseUser, *, action: str = "", who: str = "", ok: str = "", q: str = "",
                 since: dt.date | None = None, until: dt.date | None = None, sort: str = "at",
                 descending: bool = True) -> QuerySet:
    """Audit entries an admin asked for: exact ``action``, ``who`` (user name), ``ok`` ("yes"/"no"),
    ``q`` (text in the target or result), days ``since``..``until`` (UTC, inclusive), ordered by
    ``sort`` (a key of :data:`AUDIT_SORTS`). Raises ``audit.ActionRefused`` for non-admins."""
    from dashboards.core.errors import ActionRefused
    from dashboards.models import AuditEntry

    if not is_admin(user):
        raise ActionRefused("only admins may read the audit log")
    entries = AuditEntry.objects.select_related("user")
    if action:
        entries = entries.filter(action=action)
    if who:
        entries = entries.filter(user__username=who)
    if ok in ("yes", "no"):
        entries = entries.filter(ok=ok == "yes")
    if q:
        entries = entries.filter(Q(target__icontains=q) | Q(result__icontains=q))
    if since:
        entries = entries.filter(at__gte=dt.datetime.combine(since, dt.time.min, tzinfo=dt.timezone.utc))
    if until:
        entries = entries.filter(at__lt=dt.datetime.combine(until + dt.timedelta(days=1), dt.time.min,
                                                            tzinfo=dt.timezone.utc))
    order = AUDIT_SORTS.get(sort, AUDIT_SORTS["at"])
    return entries.order_by(*(f"-{f}" if descending else f for f in order), "-id" if descending else "id")


def audit_params_text(params: dict) -> list[tuple[str, str]]:
    """An audit entry's parameters as ``[(label, text)]`` people read: task ranges as ``1-3,5``
    (``all`` for the whole job), lists joined, None as ``—``; known keys get plain names."""
    out = []
    for key, value in (params or {}).items():
        if key == "tasks" and (value is None or (isinstance(value, list) and all(
                isinstance(r, list) and len(r) == 2 for r in value))):
            from dashboards.core.ranges import ranges_text

            text = ranges_text(value)
        elif value is None or value == "":
            text = "—"
        elif isinstance(value, bool):
            text = "yes" if value else "no"
        elif isinstance(value, list):
            text = ", ".join(str(v) for v in value)
        elif isinstance(value, dict):
            text = ", ".join(f"{k}={v}" for k, v in value.items())
        else:
            text = str(value)
        out.append((_PARAM_LABELS.get(key, key.replace("_", " ")), text))
    return out


def audit_target_link(target: str) -> str:
    """The page of an audit target (``campaign:12``, ``job:812``, ``team:research``, ``agent:x:v1``),
    or "" when it has none."""
    from django.urls import NoReverseMatch, reverse

    kind, _, rest = (target or "").partition(":")
    try:
        if kind == "campaign" and rest.isdigit():
            return reverse("ops-campaign", args=[int(rest)])
        if kind == "job" and rest.isdigit():
            return reverse("ops-triage") + f"?q={rest}"
        if kind == "team" and rest:
            return reverse("ops-audit") + f"?q=team:{rest}"
        if kind == "agent":
            return reverse("ops-agents")
    except NoReverseMatch:
        return ""
    return ""
