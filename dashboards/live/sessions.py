"""The users of many sockets' sessions at once: for each, what Channels' ``get_user`` returns, in a few queries.

A socket's user is resolved by its consumer's check (``dashboards.live.consumers``: the checks of sockets
that open at once run 64 at a time on the database thread). Channels' ``channels.auth.get_user`` reads one
session and one user per socket: two queries, about 0.6 ms of a web process's one database thread each
time, and a connect storm opens 1,000 sockets (issue 22). :func:`users_of` gives the same answer for a batch
in one query for the sessions and one per authentication backend for the users, step for step as
``get_user`` does:

1. the session's data, from the database session engine (``SESSION_ENGINE`` ``...sessions.backends.db``):
   the row of its key that has not expired (``expire_date`` after now), decoded by the session store
   itself; no row: no data;
2. the user's id (``SESSION_KEY``, converted by the user model's primary key field) and backend
   (``BACKEND_SESSION_KEY``); either missing: anonymous; a backend not in ``AUTHENTICATION_BACKENDS``:
   anonymous;
3. the user from that backend: for a backend whose ``get_user`` is ``ModelBackend``'s (the user by primary
   key, and ``user_can_authenticate``: an inactive user is none), all of the batch's users of that backend
   in one query; for any other backend (LDAP), its own ``get_user`` per session;
4. the session's hash (``HASH_SESSION_KEY``) against ``user.get_session_auth_hash()`` (a password change
   signs every session out): a missing or different hash flushes the session and the user is anonymous.

A session of another engine is resolved by ``get_user`` itself, one at a time. An exception of one socket's
resolution (a malformed user id in its session) is that socket's answer; a database error in a batch query
is every socket's of that batch (each is closed to reconnect, as for any failed check).
"""
from __future__ import annotations

from collections import defaultdict

from channels.auth import get_user
from django.conf import settings
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY, get_user_model, load_backend
from django.contrib.auth.backends import ModelBackend
from django.contrib.auth.models import AnonymousUser
from django.contrib.sessions.backends.db import SessionStore as DatabaseSessionStore
from django.utils import timezone
from django.utils.crypto import constant_time_compare


def users_of(scopes: list[dict]) -> list[object]:
    """For each ASGI scope of ``scopes`` (each with its ``session`` from Channels' ``SessionMiddleware``):
    the user Channels' ``get_user(scope)`` would return (a user, or ``AnonymousUser``), or the exception it
    would raise, in the same order. On the database thread. Raises only what a batch query raises."""
    out: list[object] = [None] * len(scopes)
    data: dict[int, dict] = {}
    stored: list[int] = []
    for i, scope in enumerate(scopes):
        if "session" not in scope:
            out[i] = ValueError("Cannot find session in scope. You should wrap your consumer in SessionMiddleware.")
        elif scope["session"].__class__ is DatabaseSessionStore:
            stored.append(i)
        else:
            try:
                out[i] = get_user.func(scope)
            except Exception as exc:  # noqa: BLE001 - that socket's answer
                out[i] = exc
    if stored:
        keys = {scope["session"].session_key for scope in (scopes[i] for i in stored)} - {None}
        rows = dict(DatabaseSessionStore.get_model_class().objects.filter(
            session_key__in=keys, expire_date__gt=timezone.now()).values_list("session_key", "session_data"))
        for i in stored:
            session = scopes[i]["session"]
            found = rows.get(session.session_key)
            data[i] = session.decode(found) if found is not None else {}
    by_backend: dict[str, dict[int, object]] = defaultdict(dict)
    wanted: dict[int, tuple[str, object]] = {}
    user_model = get_user_model()
    for i, session_data in data.items():
        try:
            user_id = user_model._meta.pk.to_python(session_data[SESSION_KEY])
            backend_path = session_data[BACKEND_SESSION_KEY]
        except KeyError:
            out[i] = AnonymousUser()
            continue
        except Exception as exc:  # noqa: BLE001 - a malformed id: get_user raises it for that socket
            out[i] = exc
            continue
        if backend_path not in settings.AUTHENTICATION_BACKENDS:
            out[i] = AnonymousUser()
            continue
        wanted[i] = (backend_path, user_id)
        by_backend[backend_path][user_id] = None
    for backend_path, ids in by_backend.items():
        backend = load_backend(backend_path)
        if getattr(type(backend), "get_user", None) is ModelBackend.get_user:
            found = {u.pk: u for u in user_model._default_manager.filter(pk__in=list(ids))}
            for user_id in ids:
                user = found.get(user_id)
                ids[user_id] = user if user is not None and backend.user_can_authenticate(user) else None
        else:
            for user_id in ids:
                try:
                    ids[user_id] = backend.get_user(user_id)
                except Exception as exc:  # noqa: BLE001 - get_user raises it for those sockets
                    ids[user_id] = exc
    hashes: dict[int, str] = {}
    for i, (backend_path, user_id) in wanted.items():
        user = by_backend[backend_path][user_id]
        if isinstance(user, Exception):
            out[i] = user
            continue
        if hasattr(user, "get_session_auth_hash"):
            session_hash = data[i].get(HASH_SESSION_KEY)
            if id(user) not in hashes:
                hashes[id(user)] = user.get_session_auth_hash()
            if not (session_hash and constant_time_compare(session_hash, hashes[id(user)])):
                scopes[i]["session"].flush()
                user = None
        out[i] = user or AnonymousUser()
    return out
