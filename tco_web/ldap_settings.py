"""LDAP logins (django-auth-ldap), configured from ``TCO_LDAP_*`` environment variables.

Imported at the end of ``tco_web/settings.py``. With ``TCO_LDAP_URI`` unset
it defines nothing and tco keeps local accounts only. With it set, users log
in with their directory account first and local accounts (the bootstrap
admin) second; an LDAP login never takes over a local account that has a
password. Group memberships become tco team roles at each login and are
checked again when a session's user is loaded (``TCO_LDAP_RECHECK_S``): a
locked or removed account loses access at its next request or WebSocket
connect (``tco_web.ldap_auth``).

Variables (secrets may be given as ``NAME_FILE``, see ``settings.env_str``):

``TCO_LDAP_URI``            ``ldap://host:389`` or ``ldaps://host:636``
``TCO_LDAP_START_TLS``      true to send StartTLS on an ``ldap://`` URI (default false)
``TCO_LDAP_CA_FILE``        CA bundle that signed the server's certificate (default: the system's)
``TCO_LDAP_BIND_DN``        service account that searches (empty: anonymous)
``TCO_LDAP_BIND_PASSWORD``  its password
``TCO_LDAP_USER_BASE``      where users are searched, e.g. ``ou=people,dc=example,dc=org`` (required)
``TCO_LDAP_USER_FILTER``    default ``(uid=%(user)s)``
``TCO_LDAP_GROUP_BASE``     where groups are searched (required)
``TCO_LDAP_GROUP_TYPE``     ``groupOfNames`` (default), ``groupOfUniqueNames`` or ``posixGroup``
``TCO_LDAP_GROUP_MAP``      JSON object: group DN -> ``"team:role"`` (role: viewer, lead,
                            launcher, urgent), e.g.
                            ``{"cn=research-leads,ou=groups,dc=example,dc=org": "research:lead"}``;
                            a user in several groups of one team gets the role of the first listed
``TCO_LDAP_ADMIN_GROUP``    members are tco admins (``is_staff``, ``is_superuser``)
``TCO_LDAP_REQUIRE_GROUP``  only its members may log in
``TCO_LDAP_DENY_GROUP``     its members may not log in (a "locked" group)
``TCO_LDAP_RECHECK_S``      seconds a good directory answer for a logged-in user is reused
                            (default 0: checked at every request and WebSocket connect)
"""
from __future__ import annotations

import importlib
import json

from django.core.exceptions import ImproperlyConfigured

from tco_web.env import env_bool, env_float, env_str

__all__: list[str] = []

LDAP_ROLES = ("viewer", "lead", "launcher", "urgent")  # dashboards.team_models.Role's values


def parse_group_map(raw: str) -> dict[str, tuple[str, str]]:
    """``TCO_LDAP_GROUP_MAP`` as {lower-case group DN: (team name, role)}, in the order given.

    Raises ImproperlyConfigured naming the variable for malformed JSON, a
    value not of the form ``team:role`` or an unknown role.
    """
    try:
        data = json.loads(raw or "{}")
    except ValueError as exc:
        raise ImproperlyConfigured(f"TCO_LDAP_GROUP_MAP is not JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ImproperlyConfigured("TCO_LDAP_GROUP_MAP must be a JSON object: group DN -> \"team:role\"")
    mapping = {}
    for dn, target in data.items():
        team, sep, role = str(target).partition(":")
        if not sep or not team or role not in LDAP_ROLES:
            raise ImproperlyConfigured(f"TCO_LDAP_GROUP_MAP[{dn!r}] = {target!r}: use \"team:role\" with role one of "
                                       f"{', '.join(LDAP_ROLES)}")
        mapping[dn.strip().lower()] = (team, role)
    return mapping


TCO_LDAP_URI = env_str("TCO_LDAP_URI") or ""
if TCO_LDAP_URI:
    import ldap
    from django_auth_ldap.config import GroupOfNamesType, GroupOfUniqueNamesType, LDAPSearch, PosixGroupType

    _base = importlib.import_module("tco_web.settings")  # the module importing this one, complete by now

    def _required(name: str) -> str:
        value = env_str(name)
        if not value:
            raise ImproperlyConfigured(f"{name} must be set when TCO_LDAP_URI is")
        return value

    _group_types = {"groupofnames": GroupOfNamesType, "groupofuniquenames": GroupOfUniqueNamesType,
                    "posixgroup": PosixGroupType}
    _group_type = (env_str("TCO_LDAP_GROUP_TYPE") or "groupOfNames").lower()
    if _group_type not in _group_types:
        raise ImproperlyConfigured(f"TCO_LDAP_GROUP_TYPE={_group_type!r}: use groupOfNames, groupOfUniqueNames "
                                   f"or posixGroup")
    _object_class = {"groupofnames": "groupOfNames", "groupofuniquenames": "groupOfUniqueNames",
                     "posixgroup": "posixGroup"}[_group_type]

    AUTH_LDAP_SERVER_URI = TCO_LDAP_URI
    AUTH_LDAP_START_TLS = env_bool("TCO_LDAP_START_TLS", False)
    AUTH_LDAP_BIND_DN = env_str("TCO_LDAP_BIND_DN") or ""
    AUTH_LDAP_BIND_PASSWORD = env_str("TCO_LDAP_BIND_PASSWORD") or ""
    AUTH_LDAP_USER_SEARCH = LDAPSearch(_required("TCO_LDAP_USER_BASE"), ldap.SCOPE_SUBTREE,
                                       env_str("TCO_LDAP_USER_FILTER") or "(uid=%(user)s)")
    AUTH_LDAP_GROUP_SEARCH = LDAPSearch(_required("TCO_LDAP_GROUP_BASE"), ldap.SCOPE_SUBTREE,
                                        f"(objectClass={_object_class})")
    AUTH_LDAP_GROUP_TYPE = _group_types[_group_type]()
    AUTH_LDAP_USER_ATTR_MAP = {"first_name": "givenName", "last_name": "sn", "email": "mail"}
    AUTH_LDAP_REQUIRE_GROUP = env_str("TCO_LDAP_REQUIRE_GROUP") or None
    AUTH_LDAP_DENY_GROUP = env_str("TCO_LDAP_DENY_GROUP") or None
    TCO_LDAP_ADMIN_GROUP = env_str("TCO_LDAP_ADMIN_GROUP") or None
    if TCO_LDAP_ADMIN_GROUP:
        AUTH_LDAP_USER_FLAGS_BY_GROUP = {"is_staff": TCO_LDAP_ADMIN_GROUP, "is_superuser": TCO_LDAP_ADMIN_GROUP}
    # Every login re-reads the user and groups; nothing is cached between requests.
    AUTH_LDAP_ALWAYS_UPDATE_USER = True
    AUTH_LDAP_CACHE_TIMEOUT = 0
    AUTH_LDAP_FIND_GROUP_PERMS = False
    _options: dict = {ldap.OPT_REFERRALS: 0, ldap.OPT_NETWORK_TIMEOUT: 10}
    _ca_file = env_str("TCO_LDAP_CA_FILE")
    if _ca_file:
        _options[ldap.OPT_X_TLS_CACERTFILE] = _ca_file
        _options[ldap.OPT_X_TLS_NEWCTX] = 0
    AUTH_LDAP_CONNECTION_OPTIONS = _options

    TCO_LDAP_GROUP_MAP = parse_group_map(env_str("TCO_LDAP_GROUP_MAP") or "{}")
    TCO_LDAP_RECHECK_S = env_float("TCO_LDAP_RECHECK_S", 0.0)

    AUTHENTICATION_BACKENDS = ["tco_web.ldap_auth.TcoLDAPBackend", "django.contrib.auth.backends.ModelBackend"]
    _middleware = list(_base.MIDDLEWARE)
    _middleware.insert(_middleware.index("django.contrib.auth.middleware.AuthenticationMiddleware") + 1,
                       "tco_web.ldap_auth.LDAPAccessMiddleware")
    MIDDLEWARE = _middleware

    __all__ = [name for name in list(globals()) if name.startswith(("AUTH_LDAP_", "TCO_LDAP_"))]
    __all__ += ["AUTHENTICATION_BACKENDS", "MIDDLEWARE"]
