"""Who sees what: every read of campaigns and tasks for a user starts from these.

An admin (staff) sees every team and every job on the cluster; anyone else
sees the campaigns of the teams they may ``view`` (``core.roles``) and nothing of
jobs tco did not launch. Queue-wide numbers (slots, seats, quotas) are the
cluster's and are shown to every signed-in user.
"""
from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import QuerySet

from dashboards.core.roles import is_admin, teams_with
from dashboards.models import Campaign, Task, Team

# --------------------------------------------------------------------------- scope

def teams_visible_to(user: AbstractBaseUser) -> QuerySet[Team]:
    """Teams whose campaigns ``user`` may see (roles.py, capability ``view``)."""
    return teams_with(user, "view")


def visible_team_ids(user: AbstractBaseUser) -> set[int] | None:
    """Ids of the teams ``user`` may view; None means every team (an admin)."""
    if is_admin(user):
        return None
    return set(teams_visible_to(user).values_list("pk", flat=True))


def campaigns_visible_to(user: AbstractBaseUser) -> QuerySet[Campaign]:
    if is_admin(user):
        return Campaign.objects.all()
    return Campaign.objects.filter(team__in=teams_visible_to(user))


def tasks_visible_to(user: AbstractBaseUser) -> QuerySet[Task]:
    """Tasks of campaigns the user may see; admins also see jobs tco did not launch."""
    if is_admin(user):
        return Task.objects.all()
    return Task.objects.filter(campaign__team__in=teams_visible_to(user))


def campaign_for(user: AbstractBaseUser, campaign_id: int) -> Campaign:
    """The campaign, if ``user`` may view it. Raises ``Campaign.DoesNotExist`` otherwise."""
    return campaigns_visible_to(user).select_related("team", "cluster", "agent_definition").get(pk=campaign_id)


def task_for(user: AbstractBaseUser, task_id: int) -> Task:
    """The task, if ``user`` may view it. Raises ``Task.DoesNotExist`` otherwise."""
    return tasks_visible_to(user).select_related("cluster", "campaign", "campaign__team",
                                                 "campaign__agent_definition").get(pk=task_id)


def scope_key(user: AbstractBaseUser) -> str:
    """A string equal for users who see exactly the same teams: ``admin`` or ``teams:1,4``."""
    ids = visible_team_ids(user)
    return "admin" if ids is None else "teams:" + ",".join(str(i) for i in sorted(ids))
