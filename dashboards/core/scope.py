"""Who sees what: every read of campaigns and tasks for a user starts from these.

An admin (staff) sees every team and every job on the cluster; anyone else
sees the campaigns of the teams they may ``view`` (``core.roles``) and nothing of
jobs tco did not launch. Queue-wide numbers (slots, seats, quotas) are the
cluster's and are shown to every signed-in user.
"""
from __future__ import annotations

import dataclasses
from typing import Iterable

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import QuerySet

from dashboards.core.roles import is_admin, team_ids_with, teams_with
from dashboards.models import Campaign, Task, Team

# --------------------------------------------------------------------------- scope

@dataclasses.dataclass(frozen=True)
class Scope:
    """What a set of users sees, without a user: every team (``team_ids`` None, an admin) or exactly
    the teams ``team_ids``. The live views are built once per scope (``dashboards.live.publish``)
    and sent to the sockets of every user of that scope (:func:`scope_of`). Each reader below takes
    a user or a Scope and reads the same rows for a user and for ``scope_of(user)``."""

    team_ids: frozenset[int] | None

    @property
    def admin(self) -> bool:
        return self.team_ids is None

    @property
    def key(self) -> str:
        """``admin`` or ``teams:1,4`` (:func:`scope_key`)."""
        return "admin" if self.team_ids is None else "teams:" + ",".join(str(i) for i in sorted(self.team_ids))

    @classmethod
    def from_key(cls, key: str) -> "Scope":
        """The scope named by :attr:`key`. Raises ValueError for anything else."""
        if key == "admin":
            return cls(None)
        if not key.startswith("teams:"):
            raise ValueError(f"not a scope key: {key!r}")
        ids = key[len("teams:"):]
        return cls(frozenset(int(i) for i in ids.split(",")) if ids else frozenset())


#: Every team and every job (what an admin sees); the live views of a campaign or a task, which are the
#: same for every user allowed to open them, are built with it.
EVERYTHING = Scope(None)

Who = AbstractBaseUser | Scope


def scope_of(user: AbstractBaseUser) -> Scope:
    """The scope of ``user``: every team for an admin, else the teams they may view (one query)."""
    return Scope(None if (ids := visible_team_ids(user)) is None else frozenset(ids))


def scopes_of(users: Iterable[AbstractBaseUser]) -> dict[int, Scope]:
    """:func:`scope_of` of each of ``users``, by primary key, in at most two queries for all of them
    (``roles.team_ids_with``): the audience of each socket of a connect storm, checked 64 at a time
    (``dashboards.live.consumers``)."""
    return {pk: Scope(None if ids is None else frozenset(ids)) for pk, ids in team_ids_with(users, "view").items()}


def teams_visible_to(user: Who) -> QuerySet[Team]:
    """Teams whose campaigns ``user`` may see (roles.py, capability ``view``)."""
    if isinstance(user, Scope):
        return Team.objects.all() if user.admin else Team.objects.filter(pk__in=user.team_ids)
    return teams_with(user, "view")


def visible_team_ids(user: Who) -> set[int] | None:
    """Ids of the teams ``user`` may view; None means every team (an admin)."""
    if isinstance(user, Scope):
        return None if user.admin else set(user.team_ids)
    if is_admin(user):
        return None
    return set(teams_visible_to(user).values_list("pk", flat=True))


def campaigns_visible_to(user: Who) -> QuerySet[Campaign]:
    if isinstance(user, Scope):
        return Campaign.objects.all() if user.admin else Campaign.objects.filter(team_id__in=user.team_ids)
    if is_admin(user):
        return Campaign.objects.all()
    return Campaign.objects.filter(team__in=teams_visible_to(user))


def tasks_visible_to(user: Who) -> QuerySet[Task]:
    """Tasks of campaigns the user may see; admins also see jobs tco did not launch."""
    if isinstance(user, Scope):
        return Task.objects.all() if user.admin else Task.objects.filter(campaign__team_id__in=user.team_ids)
    if is_admin(user):
        return Task.objects.all()
    return Task.objects.filter(campaign__team__in=teams_visible_to(user))


def campaign_for(user: Who, campaign_id: int) -> Campaign:
    """The campaign, if ``user`` may view it. Raises ``Campaign.DoesNotExist`` otherwise."""
    return campaigns_visible_to(user).select_related("team", "cluster", "agent_definition").get(pk=campaign_id)


def task_for(user: Who, task_id: int) -> Task:
    """The task, if ``user`` may view it. Raises ``Task.DoesNotExist`` otherwise."""
    return tasks_visible_to(user).select_related("cluster", "campaign", "campaign__team",
                                                 "campaign__agent_definition").get(pk=task_id)


def scope_key(user: AbstractBaseUser) -> str:
    """A string equal for users who see exactly the same teams: ``admin`` or ``teams:1,4``."""
    return scope_of(user).key
