"""The watch's users: watcher accounts of both teams, their login sessions, what each may see.

What a user may see is read from the memberships here, not from the selectors
the pages use (they are what is under test).
"""
from __future__ import annotations

from importlib import import_module
from typing import Iterable, Sequence

__all__ = ["WATCHER_PREFIX", "watcher_users", "session_for", "team_projects", "allowed_campaigns"]

WATCHER_PREFIX = "replay-watch-"


def watcher_users(count: int, projects: Sequence[str] = ("research", "engineering")) -> list:
    """``count`` users ``replay-watch-<project>-NN`` spread over ``projects`` in turn, each a viewer
    (even NN) or launcher (odd NN) of that one team, created or updated (no usable password: they
    log in through a session made here). Raises Team.DoesNotExist."""
    from django.contrib.auth import get_user_model

    from dashboards.models import Team
    from dashboards.team_models import Role
    from dashboards.core.roles import membership_set

    User = get_user_model()
    teams = [Team.objects.get(project=p) for p in projects]
    users = []
    for i in range(count):
        team = teams[i % len(teams)]
        n = i // len(teams) + 1
        user, created = User.objects.get_or_create(username=f"{WATCHER_PREFIX}{team.project}-{n:02d}")
        if created:
            user.set_unusable_password()
            user.save()
        membership_set(user=user, team=team, role=Role.VIEWER if n % 2 == 0 else Role.LAUNCHER)
        users.append(user)
    return users


def session_for(user) -> str:
    """A new login session for ``user`` in the configured session store; returns its key."""
    from django.conf import settings
    from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY

    store = import_module(settings.SESSION_ENGINE).SessionStore()
    store[SESSION_KEY] = str(user.pk)
    store[BACKEND_SESSION_KEY] = "django.contrib.auth.backends.ModelBackend"
    store[HASH_SESSION_KEY] = user.get_session_auth_hash()
    store.create()
    return store.session_key


def team_projects(user) -> set[str]:
    """The projects of the teams ``user`` has a membership of (from Membership)."""
    from dashboards.models import Membership

    return set(Membership.objects.filter(user=user).values_list("team__project", flat=True))


def allowed_campaigns(user, campaign_ids: Iterable[int]) -> set[int]:
    """Of ``campaign_ids``, those ``user`` may see: all for a superuser, else the campaigns whose team
    the user has a membership of (read from Membership, not from the selectors under test)."""
    from dashboards.models import Campaign, Membership

    ids = set(campaign_ids)
    if user.is_superuser:
        return ids
    teams = set(Membership.objects.filter(user=user).values_list("team_id", flat=True))
    return set(Campaign.objects.filter(pk__in=ids, team_id__in=teams).values_list("pk", flat=True))
