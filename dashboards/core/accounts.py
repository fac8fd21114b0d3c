"""Writes about people: demo users per role, API tokens.

API tokens (``token_models.ApiToken``): one per user, sent as
``Authorization: Token <key>``, stored as a SHA-256 digest (the key is shown
once). A token acts as its user, so it sees and may do exactly what that
user's teams and role allow, and only while the user is active and has the
password the token was made under (a password change ends it).
"""
from __future__ import annotations

import secrets
from dataclasses import dataclass

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser, Group
from django.db import transaction

from dashboards.core import limits
from dashboards.core.errors import LaunchError
from dashboards.core.roles import membership_set
from dashboards.models import Team
from dashboards.team_models import Role
from dashboards.token_models import ApiToken, password_stamp, stamp_matches, token_digest

# user name -> (team project, role); every demo user is also in the team's group.
DEMO_USERS: dict[str, tuple[str, str]] = {
    "viewer": ("research", Role.VIEWER),
    "lead": ("research", Role.LEAD),
    "launcher": ("research", Role.LAUNCHER),
    "urgent": ("research", Role.URGENT),
    "eng-viewer": ("engineering", Role.VIEWER),
    # Both teams' demo agents call the stand-in model through the metering proxy: each lead reads a bill
    # with dollars in it (research's demo campaign, engineering's review agents).
    "eng-lead": ("engineering", Role.LEAD),
    # make demo launches each team's campaigns as that team's launcher (launcher, eng-launcher), as the
    # launch form would: a launcher who logs in finds them under "mine".
    "eng-launcher": ("engineering", Role.LAUNCHER),
}

#: The demo users' e-mail domain (RFC 2606: reserved, never delivered anywhere); ``make demo``'s mail is
#: written to files (settings: ``EMAIL_BACKEND`` without ``TCO_PRODUCTION``).
DEMO_EMAIL_DOMAIN = "example.org"


@transaction.atomic
def demo_users_ensure(*, password: str, reset_password: bool = True) -> dict[str, AbstractBaseUser]:
    """One user per role on ``research``, a viewer and a lead on ``engineering`` (see ``DEMO_USERS``).

    The teams must exist (``tco_bootstrap``). Idempotent: an existing user
    keeps its role row updated and, unless ``reset_password`` is False, gets
    ``password``. A user without an e-mail address gets ``<username>@`` :data:`DEMO_EMAIL_DOMAIN`
    (the leads receive the budget alerts: without one, every alert said "e-mail failed: no
    recipients"); an address already set is kept. Returns ``{username: user}``. Raises
    ``Team.DoesNotExist``.
    """
    User = get_user_model()
    users = {}
    for username, (project, role) in DEMO_USERS.items():
        team = Team.objects.get(project=project)
        user, created = User.objects.get_or_create(username=username)
        changed = not user.email
        if changed:
            user.email = f"{username}@{DEMO_EMAIL_DOMAIN}"
        if created or reset_password:
            user.set_password(password)
            changed = True
        if changed:
            user.save()
        membership_set(user=user, team=team, role=role)
        users[username] = user
    return users


@dataclass(frozen=True)
class IssuedToken:
    """A token just made: ``key`` is the only copy of the secret (the database keeps its digest)."""

    key: str
    token: ApiToken


def api_token_rotate(*, user: AbstractBaseUser) -> IssuedToken:
    """Replace ``user``'s API token with a new one; the old key stops working.

    Returns the new key (40 hex digits), to be shown once; only its SHA-256
    is stored (``token_models``).
    """
    key = secrets.token_hex(20)
    with transaction.atomic():
        ApiToken.objects.filter(user=user).delete()
        token = ApiToken.objects.create(user=user, digest=token_digest(key), prefix=key[:8],
                                        password_stamp=password_stamp(user.password))
    return IssuedToken(key=key, token=token)


def api_token_working(user: AbstractBaseUser) -> ApiToken | None:
    """``user``'s API token if it still works (made under the user's present password), else None."""
    token = ApiToken.objects.filter(user=user).first()
    if token is None or not stamp_matches(token.password_stamp, user.password):
        return None
    return token


def api_token_revoke(*, user: AbstractBaseUser) -> bool:
    """Delete ``user``'s API token; True when there was one."""
    deleted, _ = ApiToken.objects.filter(user=user).delete()
    return bool(deleted)


def api_token_user(key: str) -> AbstractBaseUser | None:
    """The active user whose token has this key, or None (a wrong, revoked or deactivated one, or one
    made before the user's password last changed)."""
    token = ApiToken.objects.select_related("user").filter(digest=token_digest(key)).first()
    if token is None or not token.user.is_active:
        return None
    if not stamp_matches(token.password_stamp, token.user.password):
        return None
    return token.user


def team_ensure(*, name: str, project: str) -> Team:
    """A team and its Django group (named like the team), created if missing."""
    if not limits.NAME_RE.match(project):
        raise LaunchError(f"project name {project!r} is not a valid Grid Engine name")
    group, _ = Group.objects.get_or_create(name=name)
    team, _ = Team.objects.get_or_create(project=project, defaults={"name": name, "group": group})
    return team
