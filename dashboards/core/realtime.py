"""The one place that tells the live views of a change, after the transaction commits.

A change says *what changed* (the queue, a campaign, the queue-depth history): it increments
the generation of those sources in the live store (``core.live_bus``) and wakes the producer
(``dashboards.live.publish``), which rebuilds each watched view of them once, per audience, and
publishes the finished bytes. Nothing here knows who watches; scoping is decided by the views'
keys (one per scope) and by the sockets' checks when they open.

Sockets also close when their user's rights change (:func:`connect_signals`, through the channel
layer's user and session groups).
"""
from __future__ import annotations

import asyncio
import hashlib
import logging
import threading

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

from dashboards.core import live_bus

log = logging.getLogger(__name__)


def user_group(user_id: int) -> str:
    """The Channels group of every socket of one user (closed when their rights change)."""
    return f"user.{user_id}"


def session_group(session_key: str) -> str:
    """The Channels group of the sockets of one login session (closed at its logout).

    Named by a SHA-256 prefix of the session key: the key itself, a bearer
    credential, never goes to Redis.
    """
    return "session." + hashlib.sha256(session_key.encode()).hexdigest()[:32]


# Close codes: the browser shows "signed out" for 4401 and stops; for
# RECHECK it reconnects, and the new connection is authorized afresh (an
# inactive user or an ended session is then anonymous: 4401; a lost role: 4403).
SIGNED_OUT = 4401
RECHECK = 4000


def _send_after_commit(group: str, message: dict, what: str) -> None:
    """Send ``message`` to ``group`` once the current transaction commits; failures are logged."""

    def push() -> None:
        layer = get_channel_layer()
        if layer is None:
            return
        try:
            async_to_sync(layer.group_send)(group, message)
        except Exception:  # noqa: BLE001 - the push is best effort; pages also refresh on reconnect
            log.warning("could not push %s to %s", what, group, exc_info=True)

    def send() -> None:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            push()
            return
        # Called from a thread that runs an event loop (an async caller that
        # used sync ORM code): async_to_sync refuses, so push from a helper thread.
        thread = threading.Thread(target=push, name="tco-broadcast")
        thread.start()
        thread.join(timeout=5)

    transaction.on_commit(send)


def sockets_close(group: str, code: int) -> None:
    """Close every socket in ``group`` (``user_group``/``session_group``) with ``code``, after commit."""
    _send_after_commit(group, {"type": "tco.close", "code": code}, f"close {code}")


def changed(sources: set[str] | frozenset[str], *, observed_at: float | None = None) -> None:
    """Tell the live store that ``sources`` changed, once the current transaction commits.

    A failure to reach it (Redis down) is logged, never raised: the database is the truth, and the
    producer rebuilds every view whose generation moved once it can.
    """

    def mark() -> None:
        try:
            live_bus.bus().mark_changed(sorted(sources), observed_at)
        except Exception:  # noqa: BLE001 - best effort, as above
            log.warning("could not mark %s changed", ", ".join(sorted(sources)), exc_info=True)

    transaction.on_commit(mark)


def queue_changed(cluster_name: str, campaign_ids: set[int] | frozenset[int] = frozenset(), *,
                  observed_at: float | None = None) -> None:
    """Tell queue pages (and the pages of the named campaigns and their tasks) that something changed.

    ``observed_at``: for a change a qstat poll found, when that poll's qstat call began (epoch
    seconds); the snapshots answering it carry it (``as_of``), and the lag metrics count from it.
    ``cluster_name`` names the cluster in the log only: every queue page shows every cluster.
    """
    changed({live_bus.QUEUE, *(live_bus.campaign_source(c) for c in campaign_ids)}, observed_at=observed_at)


def depth_sampled() -> None:
    """Tell queue pages that a new queue-depth sample is stored (they redraw the history chart)."""
    changed({live_bus.DEPTH})


# --- sockets end with the rights that opened them (issue 11, finding 8) -------------

_AUTH_FIELDS = ("is_active", "is_staff", "is_superuser", "password")


def _on_logged_out(sender, request, user, **kwargs) -> None:
    session_key = getattr(getattr(request, "session", None), "session_key", None)
    if session_key:
        sockets_close(session_group(session_key), SIGNED_OUT)


def _before_user_save(sender, instance, update_fields=None, **kwargs) -> None:
    if instance.pk is None or (update_fields is not None and not set(update_fields) & set(_AUTH_FIELDS)):
        instance._tco_auth_before = None
        return
    instance._tco_auth_before = sender.objects.filter(pk=instance.pk).values(*_AUTH_FIELDS).first()


def _after_user_save(sender, instance, created, **kwargs) -> None:
    before = getattr(instance, "_tco_auth_before", None)
    if before and any(before[f] != getattr(instance, f) for f in _AUTH_FIELDS):
        sockets_close(user_group(instance.pk), RECHECK)


def _on_user_delete(sender, instance, **kwargs) -> None:
    sockets_close(user_group(instance.pk), RECHECK)


def _on_membership_change(sender, instance, **kwargs) -> None:
    sockets_close(user_group(instance.user_id), RECHECK)


def _on_groups_change(sender, instance, action, reverse, model, pk_set, **kwargs) -> None:
    if action not in ("post_add", "post_remove", "post_clear"):
        return
    from django.contrib.auth import get_user_model

    if not reverse:  # user.groups.add(...): instance is the user
        user_ids = [instance.pk]
    elif pk_set:  # group.user_set.add(...): the users are pk_set
        user_ids = list(pk_set)
    else:  # group.user_set.clear(): every user of the group may have lost it
        user_ids = list(get_user_model().objects.values_list("pk", flat=True))
    for user_id in user_ids:
        sockets_close(user_group(user_id), RECHECK)


def connect_signals() -> None:
    """Close a user's sockets when their session ends or their rights change (``AppConfig.ready``).

    Logout closes that session's sockets with 4401; a change of the user's
    active flag, admin flags or password, of a ``Membership`` (role), of
    their groups (team viewer) or the user's deletion closes all their
    sockets with ``RECHECK``, so each reconnects and is authorized afresh.
    """
    from django.contrib.auth import get_user_model
    from django.contrib.auth.signals import user_logged_out
    from django.db.models.signals import m2m_changed, post_delete, post_save, pre_save

    from dashboards.models import Membership

    User = get_user_model()
    user_logged_out.connect(_on_logged_out, dispatch_uid="tco-ws-logout")
    pre_save.connect(_before_user_save, sender=User, dispatch_uid="tco-ws-user-pre")
    post_save.connect(_after_user_save, sender=User, dispatch_uid="tco-ws-user-post")
    post_delete.connect(_on_user_delete, sender=User, dispatch_uid="tco-ws-user-delete")
    post_save.connect(_on_membership_change, sender=Membership, dispatch_uid="tco-ws-membership-save")
    post_delete.connect(_on_membership_change, sender=Membership, dispatch_uid="tco-ws-membership-delete")
    m2m_changed.connect(_on_groups_change, sender=User.groups.through, dispatch_uid="tco-ws-groups")
