"""Who may do what: roles per team (``Membership``) and the admin flag.

Capabilities by role (an admin, ``is_staff``, has every capability on every team):

| capability | viewer | lead | launcher | urgent |
|---|---|---|---|---|
| ``view`` (queue, campaigns, agents) | yes | yes | yes | yes |
| ``bill`` (bills, exports, budgets) | | yes | | |
| ``launch`` (campaigns), ``control`` (cancel, pause, resume, retry) | | | yes | yes |
| ``urgent`` (urgent agents, ``-p`` above 0) | | | | yes |

``triage`` (hold, release, delete, priority, clear error on any job) and
``audit`` are admin-only. Membership of a team's Django group without a
``Membership`` row counts as ``viewer``.
"""
from __future__ import annotations

from typing import Iterable

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.db.models import Q, QuerySet

from dashboards.models import Membership, Team
from dashboards.team_models import Role

CAPABILITIES: dict[str, frozenset[str]] = {
    "view": frozenset({Role.VIEWER, Role.LEAD, Role.LAUNCHER, Role.URGENT}),
    "bill": frozenset({Role.LEAD}),
    "launch": frozenset({Role.LAUNCHER, Role.URGENT}),
    "control": frozenset({Role.LAUNCHER, Role.URGENT}),
    "urgent": frozenset({Role.URGENT}),
    "triage": frozenset(),
    "audit": frozenset(),
}


def is_admin(user: AbstractBaseUser) -> bool:
    return bool(user.is_authenticated and user.is_active and (user.is_staff or user.is_superuser))


def teams_with(user: AbstractBaseUser, capability: str) -> QuerySet[Team]:
    """Teams on which ``user`` has ``capability``. Raises KeyError for an unknown capability."""
    roles = CAPABILITIES[capability]
    if not user.is_authenticated or not user.is_active:
        return Team.objects.none()
    if is_admin(user):
        return Team.objects.all()
    # Two indexed subqueries (IN), not joins: the join of memberships OR the group's users with DISTINCT
    # took 36-56 ms on SQLite with 500 users (every scoped read and every socket's check starts here).
    by_role = Q(pk__in=Membership.objects.filter(user=user, role__in=roles).values("team_id"))
    if capability == "view":
        by_role |= Q(group_id__in=get_user_model().groups.through.objects.filter(user=user).values("group_id"))
    return Team.objects.filter(by_role)


def team_ids_with(users: Iterable[AbstractBaseUser], capability: str) -> dict[int, set[int] | None]:
    """For each of ``users`` (by primary key): the ids of the teams :func:`teams_with` gives for ``capability``,
    or None for an admin (every team). Two queries whatever the number of users (one without ``view``'s
    groups), where :func:`teams_with` takes one per user: the checks of a storm of sockets, 64 at a time
    (``dashboards.live.consumers``). Raises KeyError for an unknown capability."""
    roles = CAPABILITIES[capability]
    out: dict[int, set[int] | None] = {}
    members: list[int] = []
    for user in users:
        if not user.is_authenticated or not user.is_active:
            out[user.pk] = set()
        elif is_admin(user):
            out[user.pk] = None
        else:
            out[user.pk] = set()
            members.append(user.pk)
    if not members:
        return out
    for user_id, team_id in Membership.objects.filter(user_id__in=members, role__in=roles).values_list(
            "user_id", "team_id"):
        out[user_id].add(team_id)
    if capability == "view":
        through = get_user_model().groups.through
        for user_id, team_id in through.objects.filter(user_id__in=members, group__team__isnull=False).values_list(
                "user_id", "group__team"):
            out[user_id].add(team_id)
    return out


def user_can(user: AbstractBaseUser, capability: str, team: Team | None = None) -> bool:
    """Whether ``user`` has ``capability`` on ``team`` (or on any team when ``team`` is None)."""
    if is_admin(user):
        return True
    if capability in ("triage", "audit"):
        return False
    teams = teams_with(user, capability)
    return teams.filter(pk=team.pk).exists() if team is not None else teams.exists()


def capabilities_of(user: AbstractBaseUser) -> frozenset[str]:
    """The capabilities (keys of :data:`CAPABILITIES`) ``user`` has on at least one team: ``c in
    capabilities_of(user)`` is ``user_can(user, c)``. One query (the user's roles), a second only for a
    user with no role, whose team group may still give ``view``; none for an admin (every capability)
    or an anonymous or inactive user (none). Where :func:`user_can` takes one query per capability
    (the page navigation asks of five)."""
    if not user.is_authenticated or not user.is_active:
        return frozenset()
    if is_admin(user):
        return frozenset(CAPABILITIES)
    roles = set(Membership.objects.filter(user=user).values_list("role", flat=True).distinct())
    if not roles & CAPABILITIES["view"] and Team.objects.filter(group__user=user).exists():
        roles.add(Role.VIEWER)
    return frozenset(name for name, allowed in CAPABILITIES.items() if roles & allowed)


def request_can(request, capability: str) -> bool:
    """Whether the request's user has ``capability`` on any team (:func:`user_can` without a team),
    from :func:`capabilities_of` read once per request and kept on it (the view's own check and the
    page's navigation then share one query). The roles are those of the request's start: a view that
    changes the user's memberships and then asks again asks :func:`user_can`. Raises KeyError for an
    unknown capability."""
    if capability not in CAPABILITIES:
        raise KeyError(capability)
    user = request.user
    kept = getattr(request, "_tco_capabilities", None)
    if kept is None or kept[0] is not user:
        kept = (user, capabilities_of(user))
        request._tco_capabilities = kept
    return capability in kept[1]


def membership_set(*, user: AbstractBaseUser, team: Team, role: str) -> Membership:
    """Give ``user`` ``role`` on ``team`` and put them in the team's Django group."""
    if role not in Role.values:
        raise ValueError(f"unknown role {role!r}; use one of {', '.join(Role.values)}")
    membership, _ = Membership.objects.update_or_create(user=user, team=team, defaults={"role": role})
    user.groups.add(team.group)
    return membership
