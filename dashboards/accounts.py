"""Writes about people: demo users per role, API tokens.

API tokens are DRF's (``rest_framework.authtoken``): one per user, sent as
``Authorization: Token <key>``. A token acts as its user, so it sees and may
do exactly what that user's teams and role allow.
"""
from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction

from .models import Role, Team
from .roles import membership_set

# user name -> (team project, role); every demo user is also in the team's group.
DEMO_USERS: dict[str, tuple[str, str]] = {
    "viewer": ("research", Role.VIEWER),
    "lead": ("research", Role.LEAD),
    "launcher": ("research", Role.LAUNCHER),
    "urgent": ("research", Role.URGENT),
    "eng-viewer": ("engineering", Role.VIEWER),
}


@transaction.atomic
def demo_users_ensure(*, password: str, reset_password: bool = True) -> dict[str, AbstractBaseUser]:
    """One user per role on ``research`` and a viewer on ``engineering`` (see ``DEMO_USERS``).

    The teams must exist (``tco_bootstrap``). Idempotent: an existing user
    keeps its role row updated and, unless ``reset_password`` is False, gets
    ``password``. Returns ``{username: user}``. Raises ``Team.DoesNotExist``.
    """
    User = get_user_model()
    users = {}
    for username, (project, role) in DEMO_USERS.items():
        team = Team.objects.get(project=project)
        user, created = User.objects.get_or_create(username=username)
        if created or reset_password:
            user.set_password(password)
            user.save()
        membership_set(user=user, team=team, role=role)
        users[username] = user
    return users


def api_token_rotate(*, user: AbstractBaseUser):
    """Replace ``user``'s API token with a new one and return it (the old key stops working)."""
    from rest_framework.authtoken.models import Token

    with transaction.atomic():
        Token.objects.filter(user=user).delete()
        return Token.objects.create(user=user)


def api_token_revoke(*, user: AbstractBaseUser) -> bool:
    """Delete ``user``'s API token; True when there was one."""
    from rest_framework.authtoken.models import Token

    deleted, _ = Token.objects.filter(user=user).delete()
    return bool(deleted)
