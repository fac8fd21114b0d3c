"""WebSocket consumers: authenticate, check once who may see what, forward the live views' bytes.

A socket opens on a page: the consumer checks, once, with the same selectors as every page, what its
user may see (``authorize``: the audience scope for the queue page, the campaign or the task), and
follows the view(s) of that page for that audience (``snapshots.View``) through this process's
:mod:`~dashboards.live.hub`: the latest snapshot at once, then each new one as the producer
(``dashboards.live.publish``) publishes it. Nothing per socket reads the database or encodes JSON.

Every socket is also in its user's group and its session's group on the channel layer: a logout
closes it (4401), a deactivation, role, membership or group change closes it with
``realtime.RECHECK``, and the browser's reconnect is authorized afresh (4403 if it lost the right).
It is also closed with ``RECHECK`` before the channel layer's ``group_expiry`` would drop those
groups (:func:`renew_s`).

Messages from the browser only choose what to show: ``{"page": n}`` (queue and campaign pages),
``{"state", "sort", "dir", "q", "host"}`` (campaign page), and ``{"snapshot": true}``: the latest
snapshot of its view(s), sent unless the socket has it already (a client that saw a gap in ``seq``).
"""
from __future__ import annotations

import abc
import asyncio
import collections
import json
import logging
import time
import weakref

from channels.auth import AuthMiddleware
from channels.consumer import get_handler_name
from channels.exceptions import StopConsumer
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from channels.sessions import CookieMiddleware, SessionMiddleware

from dashboards.core import realtime
from dashboards.core import scope as core_scope
# publish: also the in-memory store's producer (one-process tests)
from dashboards.live import campaign, cluster, publish, snapshots  # noqa: F401
from dashboards.live import hub as live_hub
from dashboards.live import memberships as live_memberships
from dashboards.live import sessions as live_sessions
from schedulers import base

log = logging.getLogger(__name__)


def renew_s(layer) -> float:
    """Seconds after which a socket is closed with ``RECHECK``: a quarter of the layer's ``group_expiry``.

    ``group_expiry`` (seconds, default 86400: channels_redis ``RedisChannelLayer`` and channels'
    ``InMemoryChannelLayer``) is how long a group member lasts after its ``group_add``; a layer
    without it gets the default."""
    return max(0.1, float(getattr(layer, "group_expiry", 86400) or 86400) / 4)


def db(fn, *args):
    """``fn(*args)`` on the process's database thread (an awaitable)."""
    return database_sync_to_async(fn)(*args)


#: Sockets checked together (one call of :func:`_check_each`), at most.
CHECK_BATCH = 64
#: Batches checked in one trip to the database thread, at most: page GETs (sync views, on the same thread)
#: queued meanwhile run between two trips.
TRIP_BATCHES = 4


class CheckBatch:
    """The checks of sockets that open at once, in batches on the process's database thread (one per event
    loop: :func:`checks`). The first socket's check leaves at once; those that open while it runs go together
    in the next batch (:func:`_check_each`). A batch saves the hand-over to the thread and back per socket,
    which in a connect storm (1,000 sockets at once) cost about as much as the checks themselves, and it
    reads the users of all of its sockets' sessions and their audience scopes in a few queries, not three per
    socket (issue 22: py-spy, the database thread saturated). A trip to the thread checks the batches that
    are waiting when it gets there, up to :data:`TRIP_BATCHES`, and hands each batch's answers back to the
    event loop as soon as it has them: under a connect storm the loop is busy with the handshakes, and a
    trip per batch waited for it between two batches (issue 22, traced: the checks' wait, not their work,
    was then most of a socket's time). An exception is that socket's own (``SignedOut``, ``Refused``, a
    database error in its own check); a batch query that fails fails each socket of the batch, and a trip
    that fails each socket it had not answered."""

    def __init__(self) -> None:
        self.waiting: collections.deque[tuple["LiveConsumer", asyncio.Future]] = collections.deque()
        self.draining = False
        self.trips = 0
        self._task: asyncio.Future | None = None

    async def run(self, consumer: "LiveConsumer") -> list[snapshots.View]:
        """The views ``consumer`` may show, checked on the database thread with its batch (:func:`_check_each`);
        raises ``SignedOut``, ``Refused`` or what the check raised."""
        future = asyncio.get_running_loop().create_future()
        self.waiting.append((consumer, future))
        if not self.draining:
            self.draining = True
            self._task = asyncio.ensure_future(self._drain())
        return await future

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self.waiting:
                self.trips += 1
                in_hand: list = []
                try:
                    await db(self._trip, loop, in_hand)
                except BaseException as exc:  # noqa: BLE001 - the trip itself failed: its sockets are told
                    batch = in_hand or [self.waiting.popleft() for _ in range(min(CHECK_BATCH, len(self.waiting)))]
                    self._answer(batch, [(False, exc)] * len(batch))
        finally:
            self.draining = False

    def _trip(self, loop: asyncio.AbstractEventLoop, in_hand: list) -> None:
        """On the database thread: check the waiting sockets, :data:`CHECK_BATCH` at a time, up to
        :data:`TRIP_BATCHES` batches; each batch's answers go to the event loop when they are ready
        (``in_hand``: the batch being checked, told by :meth:`_drain` if the trip fails)."""
        for _ in range(TRIP_BATCHES):
            batch = []
            while self.waiting and len(batch) < CHECK_BATCH:
                batch.append(self.waiting.popleft())
            if not batch:
                return
            in_hand[:] = batch
            try:
                outcomes = _check_each([consumer for consumer, _ in batch])
            except Exception as exc:  # noqa: BLE001 - a batch query failed: each socket of the batch is told
                outcomes = [(False, exc)] * len(batch)
            in_hand.clear()
            loop.call_soon_threadsafe(self._answer, batch, outcomes)

    @staticmethod
    def _answer(batch: list, outcomes: list[tuple[bool, object]]) -> None:
        for (_, future), (ok, value) in zip(batch, outcomes):
            if not future.done():
                future.set_result(value) if ok else future.set_exception(value)


def _check_each(consumers: list["LiveConsumer"]) -> list[tuple[bool, object]]:
    """On the database thread, the checks of a batch of sockets: for each, ``(True, views)`` or ``(False,
    the exception)``, in order.

    1. Who each socket's user is: its session's (:func:`dashboards.live.sessions.users_of`, what Channels'
       ``get_user`` returns, for the whole batch in a query for the sessions and one for the users), unless
       a test put the user in the scope. No signed-in user: ``SignedOut`` (4401).
    2. Each user's audience scope (``core.scope.scopes_of``: the same as ``scope_of``, two queries for the
       batch).
    3. What the socket may show (:meth:`LiveConsumer.authorize`): the page's own check with that scope, the
       same selectors as every page; sockets of one batch that ask the same question of the same scope
       share its answer (:class:`Asked`).
    """
    out: list[tuple[bool, object] | None] = [None] * len(consumers)
    deferred = [i for i, c in enumerate(consumers) if c.scope.get(DEFERRED_USER)]
    for i, user in zip(deferred, live_sessions.users_of([consumers[i].scope for i in deferred])):
        if isinstance(user, Exception):
            out[i] = (False, user)
        else:
            consumers[i].scope["user"]._wrapped = user
            consumers[i].scope[DEFERRED_USER] = False
    users = []
    for i, consumer in enumerate(consumers):
        user = consumer.scope.get("user")
        if out[i] is None and (user is None or not user.is_authenticated):
            out[i] = (False, SignedOut())
        elif out[i] is None:
            users.append(user)
    audiences = core_scope.scopes_of(users)
    asked = Asked()
    for i, consumer in enumerate(consumers):
        if out[i] is not None:
            continue
        user = consumer.scope["user"]
        try:
            out[i] = (True, consumer.authorize(user, audiences[user.pk], asked))
        except Exception as exc:  # noqa: BLE001 - that socket's answer (4403, or closed to reconnect)
            out[i] = (False, exc)
    return out


class Asked:
    """The answers of one batch's checks (:func:`_check_each`): a question asked again in the same batch
    (the same campaign, the same audience scope) is answered once, at the same moment for every socket."""

    def __init__(self) -> None:
        self.answers: dict[tuple, object] = {}

    def once(self, question: tuple, answer):
        """``answer()`` the first time ``question`` (a hashable tuple) is asked in this batch; the same value
        after."""
        if question not in self.answers:
            self.answers[question] = answer()
        return self.answers[question]


_CHECKS: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, CheckBatch]" = weakref.WeakKeyDictionary()


def checks() -> CheckBatch:
    """This event loop's :class:`CheckBatch`."""
    loop = asyncio.get_running_loop()
    batch = _CHECKS.get(loop)
    if batch is None:
        batch = _CHECKS[loop] = CheckBatch()
    return batch


class Refused(Exception):
    """The user may not see what this socket would show."""


class SignedOut(Exception):
    """No signed-in user (or a session that no longer verifies)."""


#: The scope key :class:`DeferredAuthMiddleware` sets: the consumer resolves the user itself.
DEFERRED_USER = "tco.deferred_user"


class DeferredAuthMiddleware(AuthMiddleware):
    """Channels' ``AuthMiddleware`` whose user is resolved by the consumer, in the same database call as
    its check and with the checks of the sockets that open with it (:func:`_check_each`,
    ``dashboards.live.sessions.users_of``: what Channels' ``get_user`` returns): a socket's handshake costs
    at most one trip to the database thread, not two, and no query of its own for its session and user
    (500 browsers open 1,000 sockets at once at a run's start)."""

    async def resolve_scope(self, scope) -> None:
        scope[DEFERRED_USER] = True


def DeferredAuthMiddlewareStack(inner):
    """``AuthMiddlewareStack`` with :class:`DeferredAuthMiddleware` (tco_web/asgi.py)."""
    return CookieMiddleware(SessionMiddleware(DeferredAuthMiddleware(inner)))


def _page(value) -> int | None:
    try:
        page = int(value)
    except (TypeError, ValueError, OverflowError):   # OverflowError: {"page": 1e400} is JSON's infinity
        return None
    return page if page >= 1 else None


#: A user's choices of what their sockets show (another page, filter or sort: another view the producer
#: builds while it is registered, for a minute) in one web process: at most ``CHOICE_BURST`` at once, then
#: one every ``1 / CHOICE_PER_S`` seconds. One viewer's socket sending pages 2..201 made the one producer
#: build 200 views (a fresh attack: 63% of a core); a person paging or filtering stays far below.
CHOICE_BURST = 10
CHOICE_PER_S = 0.5
_CHOICES: dict[int, tuple[float, float]] = {}


def choice_allowed(user_id: int, now: float | None = None) -> bool:
    """Whether user ``user_id`` may change a socket's view now (a token bucket per user and process:
    :data:`CHOICE_BURST`, refilled at :data:`CHOICE_PER_S` a second); takes a token when it may."""
    now = time.monotonic() if now is None else now
    tokens, at = _CHOICES.get(user_id, (float(CHOICE_BURST), now))
    tokens = min(float(CHOICE_BURST), tokens + (now - at) * CHOICE_PER_S)
    if tokens < 1.0:
        _CHOICES[user_id] = (tokens, now)
        return False
    _CHOICES[user_id] = (tokens - 1.0, now)
    if len(_CHOICES) > 10_000:     # users who chose nothing for a while start again with a full bucket
        for uid in [u for u, (_, t) in _CHOICES.items() if now - t > CHOICE_BURST / CHOICE_PER_S]:
            del _CHOICES[uid]
    return True


class LiveConsumer(AsyncWebsocketConsumer, abc.ABC):
    """Base: checks the user once, then forwards the latest snapshot of its views and every new one.

    Subclasses define ``authorize(user, audience, asked) -> list[View]`` (on the database thread; raise
    ``Refused`` to refuse with 4403) and may define ``choose(content) -> list[View] | None`` (a browser's choice; None:
    no change).
    """

    async def connect(self) -> None:
        self.box = None
        self.shown: list[snapshots.View] = []
        self.groups_joined: list[str] = []
        self._recheck = None
        # The session's group is joined before the check reads the session: a logout between that read and
        # the join would otherwise never reach this socket, which would stay open, signed out, until its
        # renewal (a reviewer's finding, issue 23). Its close message waits in this socket's channel and is
        # handled once the handshake is done. The session key is the cookie's (no database call).
        session = self.scope.get("session")
        if not await self._join([realtime.session_group(session.session_key)]
                                if session is not None and session.session_key else []):
            return
        try:
            views = await checks().run(self)
        except SignedOut:
            await self.refuse(4401)
            return
        except Refused:
            await self.refuse(4403)
            return
        except Exception:  # noqa: BLE001 - never a 500 on the handshake: the browser reconnects (with backoff)
            log.warning("live socket %s: the check failed; closed to reconnect", self.scope.get("path", ""),
                        exc_info=True)
            await self.refuse(realtime.RECHECK)
            return
        user = self.scope["user"]
        # The user's group: a deactivation or a change of rights closes this socket (realtime.connect_signals;
        # the session's group, joined above, a logout).
        if not await self._join([realtime.user_group(user.pk)]):
            return
        await self.accept()
        # The groups above are joined once, and the channel layer drops a member group_expiry seconds
        # after its group_add (a day by default): a socket open longer would no longer be closed by a
        # logout. It is closed with RECHECK well before; the browser reconnects, authorized afresh.
        self._recheck = asyncio.ensure_future(self._recheck_after(renew_s(self.channel_layer)))
        self.box = live_hub.hub().outbox(self._send_text, self._close,
                                         f"{user.get_username()} {self.scope.get('path', '')}")
        try:
            await self.show(views)
        except Exception:  # noqa: BLE001 - the live store is away: the browser reconnects (with backoff)
            log.warning("live views unavailable for %s; closing it to reconnect", self.box.label, exc_info=True)
            await self.close(code=realtime.RECHECK)

    async def _join(self, groups: list[str]) -> bool:
        """Join ``groups`` on the channel layer (each kept in ``groups_joined``, left at the disconnect).
        False when the layer (Redis) is away: the socket is then refused with ``RECHECK`` (the browser
        reconnects with backoff), never a 500."""
        try:
            for group in groups:
                await live_memberships.memberships(self.channel_layer).add(group, self.channel_name)
                self.groups_joined.append(group)
        except Exception:  # noqa: BLE001 - the channel layer (Redis) away
            log.warning("live socket %s: could not join its groups; closed to reconnect",
                        self.scope.get("path", ""), exc_info=True)
            await self.refuse(realtime.RECHECK)
            return False
        return True

    async def dispatch(self, message: dict) -> None:
        """Channels' ``AsyncConsumer.dispatch`` without its ``aclose_old_connections()`` before every handler.

        Channels (4.2 and later) sends ``close_old_connections`` to the database thread before each message
        it dispatches (the connect, every browser message, every group message, the disconnect) and once
        more after a disconnect. That thread is the process's one thread for sync views and the sockets'
        checks, so a connect storm of 1,000 sockets queued 1,000 such trips beside the checks themselves
        (issue 22, py-spy). These consumers never touch the database on the event loop; their one database
        call per socket, the check, runs through ``database_sync_to_async``, which closes old connections
        before and after it. Raises ``ValueError`` for a message type without a handler, as Channels does."""
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        await handler(message)

    async def websocket_disconnect(self, message: dict) -> None:
        """Channels' ``websocket_disconnect`` without its trip to the database thread (:meth:`dispatch`)."""
        for group in self.groups:
            await self.channel_layer.group_discard(group, self.channel_name)
        await self.disconnect(message["code"])
        raise StopConsumer()

    async def _send_text(self, text: str) -> None:
        await self.send(text_data=text)

    async def _close(self, code: int) -> None:
        await self.close(code=code)

    async def show(self, views: list[snapshots.View]) -> None:
        """Follow ``views`` from now on (the latest snapshot of each is sent unless the socket has it)."""
        hub = live_hub.hub()
        keys = [v.key for v in views]
        old = [v.key for v in self.shown]
        self.shown = list(views)
        self.box.show(keys)
        for key in old:
            if key not in keys:
                hub.leave(self.box, key)
        for view in views:
            if view.key not in old:
                await hub.join(self.box, view.key, view.source, latest=self.send_latest(view))

    async def _recheck_after(self, delay: float) -> None:
        await asyncio.sleep(delay)
        await self.close(code=realtime.RECHECK)

    async def tco_close(self, message: dict) -> None:
        """The user's session ended or their rights changed: close (4401, or RECHECK to reconnect)."""
        await self.close(code=int(message.get("code") or realtime.RECHECK))

    async def refuse(self, code: int) -> None:
        # Accept, then close with the code: a handshake refused outright reaches the
        # browser as 1006, and the page could not tell "signed out" from "network".
        await self.accept()
        await self.close(code=code)

    def _stop_live(self) -> None:
        box, self.box = getattr(self, "box", None), None
        if box is not None:
            hub = live_hub.hub()
            for view in self.shown:
                hub.leave(box, view.key)
            box.stop()

    async def close(self, code=None, reason=None) -> None:
        # Nothing more is sent once the close is on its way, not even a second close (a logout's and the
        # renewal's, or a logout's after a refusal: ASGI servers reject a message after the close).
        self._stop_live()
        if getattr(self, "_close_sent", False):
            return
        self._close_sent = True
        await super().close(code=code, reason=reason)

    async def disconnect(self, code: int) -> None:
        self._stop_live()
        for group in getattr(self, "groups_joined", []):
            await live_memberships.memberships(self.channel_layer).discard(group, self.channel_name)
        if getattr(self, "_recheck", None):
            self._recheck.cancel()

    async def receive(self, text_data=None, bytes_data=None) -> None:
        try:
            content = json.loads(text_data or "")
        except (ValueError, RecursionError):  # not JSON, or nested past the decoder's stack: ignored, no traceback
            return
        if not isinstance(content, dict) or self.box is None:
            return
        if content.get("snapshot"):
            self.box.snapshot()
            return
        try:
            views = self.choose(content)
        except (TypeError, ValueError, OverflowError, AttributeError):
            return     # a value of the wrong type ({"q": [1]}): nothing changes
        if views is None or [v.key for v in views] == [v.key for v in self.shown]:
            return
        user = self.scope["user"]
        if not choice_allowed(user.pk):
            if not getattr(self, "_choices_refused", False):
                self._choices_refused = True
                log.warning("live socket %s %s: view choices faster than %g a second (burst %d); the rest "
                            "are ignored until the rate falls", user.get_username(), self.scope.get("path", ""),
                            CHOICE_PER_S, CHOICE_BURST)
            return
        await self.show(views)

    @abc.abstractmethod
    def authorize(self, user, audience: core_scope.Scope, asked: Asked) -> list[snapshots.View]:
        """The views this socket shows to signed-in ``user``, whose audience scope is ``audience``
        (``core.scope.scope_of(user)``); raise ``Refused`` when the user may not see them. On the database
        thread, once per socket (:func:`_check_each`); a query whose answer other sockets of the batch
        share goes through ``asked.once``."""

    def choose(self, content: dict) -> list[snapshots.View] | None:
        """The views after a browser's choice (page, filter); None when nothing changes."""
        return None

    def send_latest(self, view: snapshots.View) -> bool:
        """Whether the socket gets ``view``'s latest snapshot when it starts to follow it (else: only the
        later ones)."""
        return True


class QueueConsumer(LiveConsumer):
    """``/ws/queue/``: the live queue page of the user's audience scope, and its depth history."""

    def authorize(self, user, audience: core_scope.Scope, asked: Asked) -> list[snapshots.View]:
        self.audience = audience
        return [snapshots.queue_view(self.audience, 1), snapshots.depth_view(self.audience)]

    def choose(self, content: dict) -> list[snapshots.View] | None:
        page = _page(content.get("page"))
        if page is None:
            return None
        return [snapshots.queue_view(self.audience, page), snapshots.depth_view(self.audience)]

    def send_latest(self, view: snapshots.View) -> bool:
        # The depth history comes with the page; the socket forwards the samples taken after it
        # (one every TCO_DEPTH_SAMPLE_S: a reconnected page draws the next one whole).
        return view.kind != snapshots.DEPTH


class CampaignConsumer(LiveConsumer):
    """``/ws/campaigns/<id>/``: one campaign's page, for users who may view the campaign."""

    def authorize(self, user, audience: core_scope.Scope, asked: Asked) -> list[snapshots.View]:
        # The campaign by the user's audience scope (one lookup by primary key, shared by the batch's sockets
        # of that scope): the same answer as campaigns_visible_to(user), without building its subquery per
        # socket (a connect storm opens 500 of these at once; issue 22).
        campaign_id = self.scope["url_route"]["kwargs"]["campaign_id"]
        if not asked.once(("campaign", audience, campaign_id),
                          lambda: core_scope.campaigns_visible_to(audience).filter(pk=campaign_id).exists()):
            raise Refused
        return [snapshots.campaign_view(campaign_id)]

    def choose(self, content: dict) -> list[snapshots.View] | None:
        view = self.shown[0]
        page, state, host, sort, descending, q = (view.page, view.state, view.host, view.sort, view.descending,
                                                  view.q)
        if "state" in content:
            new = content["state"] if content["state"] in (*base.LIFECYCLE_STATES, "waiting") else None
            if new == "waiting":
                new = "held"
            if new != state:
                page = 1
            state = new
        if any(k in content for k in ("sort", "dir", "q")):
            table = campaign.task_table_choice(content.get("sort"), content.get("dir"), content.get("q"))
            if (table["sort"], table["descending"], table["q"]) != (sort, descending, q):
                page = 1
            sort, descending, q = table["sort"], table["descending"], table["q"]
        if "host" in content:
            new = cluster.host_filter(content["host"])
            if new != host:
                page = 1
            host = new
        if _page(content.get("page")) is not None:
            page = _page(content["page"])
        return [snapshots.campaign_view(view.id, page=page, state=state, sort=sort,
                                        direction="desc" if descending else None, q=q, host=host)]


class TaskConsumer(LiveConsumer):
    """``/ws/tasks/<id>/``: one agent's page (follows its campaign; a job tco did not launch: the queue)."""

    def authorize(self, user, audience: core_scope.Scope, asked: Asked) -> list[snapshots.View]:
        task_id = self.scope["url_route"]["kwargs"]["task_id"]
        found = asked.once(("task", audience, task_id), lambda: core_scope.tasks_visible_to(audience).filter(
            pk=task_id).values_list("pk", "campaign_id").first())
        if found is None:
            raise Refused
        return [snapshots.task_view(*found)]
