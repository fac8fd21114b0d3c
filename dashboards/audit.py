"""The audit log: one writer for every launch, control, budget and registry action.

Every action a user asks for, allowed or refused, writes one ``AuditEntry``:
who, what (``action``, ``target``, ``params``), when, result. Refusals go
through :func:`refuse`, which writes the entry and returns the exception to
raise, so a refusal is never left unrecorded.
"""
from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser

from .models import AuditEntry
from .roles import user_can


class ActionRefused(PermissionError):
    """The user may not do this; ``str(err)`` is shown to them."""


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
