"""LDAP accounts as tco users: the backend, the group -> team role mapping, the per-request check.

Configured by ``tco_web/ldap_settings.py`` (``TCO_LDAP_*``). django-auth-ldap
(https://django-auth-ldap.readthedocs.io) binds as the user, reads the
user's groups and mirrors the attributes; on top of it:

* ``TcoLDAPBackend``: after each LDAP login the user's team memberships are
  made to match ``TCO_LDAP_GROUP_MAP`` (roles added, changed and removed);
  an LDAP login is refused for a local account that has a password (the
  bootstrap admin stays local and cannot be taken over from the directory).
* ``TcoLDAPBackend.get_user``: loading a session's user (each HTTP request,
  each WebSocket connect) re-reads the account in the directory (at most
  every ``TCO_LDAP_RECHECK_S`` seconds, remembered in the cache); an account
  removed from the directory, in ``TCO_LDAP_DENY_GROUP``, out of
  ``TCO_LDAP_REQUIRE_GROUP``, or a directory that does not answer (fail
  closed) is refused and marked inactive, so its other sessions and its API
  token stop too. The next successful LDAP login makes it active again.
* ``LDAPAccessMiddleware`` flushes such a refused session.
"""
from __future__ import annotations

import logging

from django.conf import settings
from django.contrib.auth import BACKEND_SESSION_KEY, SESSION_KEY, get_user_model, logout
from django.core.cache import cache
from django.db import transaction
from django_auth_ldap.backend import LDAPBackend

log = logging.getLogger(__name__)

BACKEND_PATH = "tco_web.ldap_auth.TcoLDAPBackend"


def team_roles_for(group_dns) -> dict[str, str]:
    """{team name: role} for a user in the groups ``group_dns`` (any case), by ``TCO_LDAP_GROUP_MAP``.

    A team reached through several groups gets the role of the group listed first.
    """
    groups = {dn.lower() for dn in group_dns}
    roles: dict[str, str] = {}
    for dn, (team, role) in getattr(settings, "TCO_LDAP_GROUP_MAP", {}).items():
        if dn in groups and team not in roles:
            roles[team] = role
    return roles


@transaction.atomic
def memberships_sync(user, group_dns) -> dict[str, str]:
    """Make ``user``'s team roles exactly ``team_roles_for(group_dns)``; returns that {team: role}.

    Teams named in the map but missing from the database are skipped with a
    warning. Roles on teams the groups no longer give are removed, with the
    team's Django group.
    """
    from dashboards.models import Membership, Team
    from dashboards.core.roles import membership_set

    wanted = team_roles_for(group_dns)
    teams = {team.name: team for team in Team.objects.filter(name__in=wanted).select_related("group")}
    for name in sorted(set(wanted) - set(teams)):
        log.warning("TCO_LDAP_GROUP_MAP names team %r, which does not exist", name)
    for name, team in teams.items():
        membership_set(user=user, team=team, role=wanted[name])
    for stale in Membership.objects.filter(user=user).exclude(team__in=teams.values()).select_related("team"):
        user.groups.remove(stale.team.group)
        stale.delete()
    user.groups.remove(*[t.group for t in Team.objects.exclude(pk__in=[t.pk for t in teams.values()])
                         .select_related("group")])
    return {name: wanted[name] for name in teams}


class TcoLDAPBackend(LDAPBackend):
    """django-auth-ldap's backend with tco's team roles, no take-over of local accounts, and a
    directory check each time a session's user is loaded (HTTP requests and WebSocket connects)."""

    def get_or_build_user(self, username, ldap_user):
        user, built = super().get_or_build_user(username, ldap_user)
        if not built and user.has_usable_password():
            # A local account (the bootstrap admin): never logged in, or changed, from the directory.
            raise ldap_user.AuthenticationFailed(f"{username} is a local account")
        return user, built

    def authenticate_ldap_user(self, ldap_user, password):
        user = super().authenticate_ldap_user(ldap_user, password)
        if user is not None:
            if not user.is_active:
                user.is_active = True  # the directory just let them in: unlocked again
                user.save(update_fields=["is_active"])
            memberships_sync(user, ldap_user.group_dns)
            if _recheck_s() > 0:
                cache.set(_checked_key(user.pk), True, _recheck_s())
        return user

    def get_user(self, user_id):
        """The session's user, or None once the directory no longer lets them in (then marked inactive).

        Django's AuthenticationMiddleware and Channels' AuthMiddleware both
        load a session's user through here, so a locked or removed account
        is refused at its next request and its next WebSocket connect.
        """
        user = super().get_user(user_id)
        if user is None or not user.is_active:
            return None
        recheck = _recheck_s()
        if recheck > 0 and cache.get(_checked_key(user.pk)):
            return user
        if not ldap_account_allowed(user.get_username()):
            log.warning("LDAP account %s is locked or gone: access ended", user.get_username())
            get_user_model().objects.filter(pk=user.pk).update(is_active=False)
            return None
        if recheck > 0:
            cache.set(_checked_key(user.pk), True, recheck)
        return user


def _recheck_s() -> float:
    return float(getattr(settings, "TCO_LDAP_RECHECK_S", 0.0))


def _checked_key(user_id) -> str:
    return f"ldap-checked:{user_id}"


def ldap_account_allowed(username: str) -> bool:
    """Whether ``username`` may still use tco by the directory; on yes, their team roles are re-read.

    No: not found, in the deny group, not in the required group, or the
    directory did not answer.
    """
    user = TcoLDAPBackend().populate_user(username)
    if user is None:
        return False
    groups = {dn.lower() for dn in user.ldap_user.group_dns}
    deny = getattr(settings, "AUTH_LDAP_DENY_GROUP", None)
    require = getattr(settings, "AUTH_LDAP_REQUIRE_GROUP", None)
    if (deny and deny.lower() in groups) or (require and require.lower() not in groups):
        return False
    memberships_sync(user, groups)
    return True


class LDAPAccessMiddleware:
    """Ends (flushes) a session whose LDAP user the backend no longer loads (after AuthenticationMiddleware).

    The refusal itself is ``TcoLDAPBackend.get_user``; this removes the
    session too, so unlocking the account later does not revive it.
    """

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        user = getattr(request, "user", None)
        session = request.session
        if (user is not None and not user.is_authenticated and session.get(BACKEND_SESSION_KEY) == BACKEND_PATH
                and session.get(SESSION_KEY)):
            logout(request)
        return self.get_response(request)
