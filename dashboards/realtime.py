"""The one place that pushes events to browsers, after the transaction commits.

Events say *what changed* (a cluster's queue, a campaign); each consumer then
re-reads what its own user may see, so scoping is decided by the selectors,
never by what a broadcast happened to contain.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import uuid

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

log = logging.getLogger(__name__)

QUEUE_GROUP = "queue"
DEPTH_SAMPLED = "depth.sampled"


def campaign_group(campaign_id: int) -> str:
    """The Channels group of one campaign's page."""
    return f"campaign.{campaign_id}"


def broadcast(group: str, event: dict) -> None:
    """Send ``event`` (JSON-serialisable dict) to ``group`` once the current transaction commits.

    A failure to reach the channel layer (Redis down) is logged, never raised:
    the database is the truth and the next change pushes again. Each event
    gets an ``id``: consumers of users who see the same thing share one read
    per event (``selectors.shared_snapshot``).
    """
    event = {**event, "id": uuid.uuid4().hex}

    def push() -> None:
        layer = get_channel_layer()
        if layer is None:
            return
        try:
            async_to_sync(layer.group_send)(group, {"type": "tco.event", "event": event})
        except Exception:  # noqa: BLE001 - the push is best effort; pages also refresh on reconnect
            log.warning("could not push %s to %s", event.get("kind"), group, exc_info=True)

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


def queue_changed(cluster_name: str, campaign_ids: set[int] | frozenset[int] = frozenset()) -> None:
    """Tell queue pages (and the pages of the named campaigns) that something changed."""
    event = {"kind": "queue.changed", "cluster": cluster_name, "campaigns": sorted(campaign_ids)}
    broadcast(QUEUE_GROUP, event)
    for campaign_id in campaign_ids:
        broadcast(campaign_group(campaign_id), {"kind": "campaign.changed", "campaign": campaign_id})


def depth_sampled() -> None:
    """Tell queue pages that a new queue-depth sample is stored (they redraw the history chart)."""
    broadcast(QUEUE_GROUP, {"kind": DEPTH_SAMPLED})
