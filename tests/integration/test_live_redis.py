"""The live store on the real Redis (docs/live.md; the unit tests use its in-memory twin): generations and
their oldest change taken atomically, registrations that end forget their snapshots, sequence numbers,
the shared lag histogram, and a web process's subscription: confirmed before its first read, and read
again after a reconnect (a record published while it was away is not lost)."""
from __future__ import annotations

import asyncio
import time

import pytest

from dashboards.core import live_bus, live_histogram
from dashboards.live import hub as live_hub

pytestmark = [pytest.mark.integration]


@pytest.fixture
def store(settings):
    settings.TCO_LIVE_BUS = "redis"
    bus = live_bus.bus()

    def clear() -> None:
        for key in bus.r.scan_iter(match=live_bus.PREFIX + "*"):
            bus.r.delete(key)

    clear()
    yield bus
    clear()


def test_a_sources_generation_and_oldest_change_are_taken_together(store):
    store.mark_changed(["queue", "campaign:7"], observed_at=100.5)
    store.mark_changed(["queue"], observed_at=101.5)
    assert store.gens() == {"queue": 2, "campaign:7": 1}
    assert set(store.pending()) == {"queue", "campaign:7"}
    gen, observed, committed = store.take("queue")
    assert (gen, observed) == (2, 100.5) and committed <= time.time()   # the oldest of the two
    assert store.take("queue")[1:] == (None, None)                       # taken: nothing pending
    store.mark_changed(["queue"])
    assert store.take("queue")[:2] == (3, None)                          # a change no poll found
    assert store.wait_wake(0.1) is True and store.wait_wake(0.1) is False   # the wake-ups, all taken at once


def test_a_registration_that_ends_forgets_the_views_snapshot_but_not_its_sequence(store):
    record, gen, watched = store.snapshot("campaign/7/1", "campaign:7")
    assert (record, gen, watched) == (None, 0, False)
    assert store.snapshot("campaign/7/1", "campaign:7")[2] is True          # registered by the first read
    (seq,) = store.next_seqs(["campaign/7/1"])
    store.publish([("campaign/7/1", 0, live_bus.Record(seq, 0, "e", None, b"{}").encode())])
    assert store.registered() == ["campaign/7/1"] and store.built(["campaign/7/1"]) == {"campaign/7/1": 0}
    assert store.registered(now=time.time() + live_bus.REGISTRATION_S + 1) == []
    assert store.snapshot("campaign/7/1", "campaign:7")[0] is None and store.built(["campaign/7/1"]) == {}
    assert store.next_seqs(["campaign/7/1"]) == [2]                        # a browser that showed 1 takes it


def test_the_lag_histogram_is_shared_and_cumulative(store):
    h = live_histogram.Histogram()
    for lag in (0.05, 0.3, 1.5, 70.0):
        h.observe("sent", lag)
    store.observe(h)
    h.observe("sent", 0.2)
    store.observe(h)
    sent = store.histograms()["sent"]
    assert sent["count"] == 5 and sent["sum"] == pytest.approx(72.05)
    buckets = dict(sent["buckets"])
    assert (buckets["0.1"], buckets["0.25"], buckets["0.5"], buckets["2.0"], buckets["60.0"], buckets["+Inf"]) == (
        1, 2, 3, 4, 4, 5)


def test_a_web_process_subscribes_before_it_reads_and_reads_again_after_a_reconnect(store):
    view, source = "campaign/9/1", "campaign:9"
    store.publish([(view, 1, live_bus.Record(1, 1, "e", None, b'{"n":1}').encode())])

    class Socket:
        def __init__(self):
            self.got = []

        async def send(self, text):
            self.got.append(text)

        async def close(self, code):
            self.got.append(code)

    async def until(condition, timeout=10.0):
        deadline = time.monotonic() + timeout
        while not condition():
            assert time.monotonic() < deadline, "timed out"
            await asyncio.sleep(0.02)

    async def scenario():
        hub = live_hub.Hub()
        sock = Socket()
        box = hub.outbox(sock.send, sock.close, "test")
        box.show([view])
        await hub.join(box, view, source)
        await until(lambda: len(sock.got) == 1)                  # the stored one, read after subscribing
        store.publish([(view, 2, live_bus.Record(2, 2, "e", None, b'{"n":2}').encode())])
        await until(lambda: len(sock.got) == 2)                  # then each published one
        # The subscription's connection is cut; a record is published while it is away.
        store.r.client_kill_filter(_type="pubsub")
        store.publish([(view, 3, live_bus.Record(3, 3, "e", None, b'{"n":3}').encode())])
        await until(lambda: len(sock.got) == 3, timeout=20)      # read again once reconnected
        store.publish([(view, 4, live_bus.Record(4, 4, "e", None, b'{"n":4}').encode())])
        await until(lambda: len(sock.got) == 4)
        box.stop()
        for task in hub._tasks:
            task.cancel()
        await hub.bus.close()
        return sock.got

    assert asyncio.run(scenario()) == ['{"n":1}', '{"n":2}', '{"n":3}', '{"n":4}']


def test_a_read_waiting_before_the_first_subscription_returns_its_confirmation(store):
    """The hub's reader starts before its first subscription. The port's ``get`` used to sleep its whole
    timeout while nothing was subscribed, so the first socket of a web process waited up to a second for
    its confirmation (and its first snapshot). Here the timeout is 30 s: the old port returns None after
    it; this one returns the confirmation of the subscription made while it waited."""
    async def scenario():
        bus = live_bus.bus().async_side()            # the web process's store on Redis (as the hub has it)
        port = bus.pubsub()
        reading = asyncio.ensure_future(port.get(timeout=30.0))
        await asyncio.sleep(0.05)
        await port.subscribe(live_bus.channel("campaign/5/1"))
        message = await reading
        await port.close()
        await bus.close()
        return message

    message = asyncio.run(scenario())
    assert message is not None and message["type"] == "subscribe"
    assert message["channel"] == live_bus.channel("campaign/5/1").encode()


def test_a_read_with_nothing_subscribed_any_more_waits_its_timeout_instead_of_spinning(store):
    """After its last view is dropped a web process's subscription has no channel; the hub's reader keeps
    calling ``get``. Each call must wait (up to its timeout, or until a new subscription), not return at
    once: a reader returning at once spun a web process at a full core (seen after a replay's run)."""
    async def scenario():
        bus = live_bus.bus().async_side()
        port = bus.pubsub()
        name = live_bus.channel("campaign/6/1")
        await port.subscribe(name)
        assert (await port.get(timeout=5.0))["type"] == "subscribe"
        await port.unsubscribe(name)
        assert (await port.get(timeout=5.0))["type"] == "unsubscribe"   # nothing subscribed from here on
        calls, started = 0, time.monotonic()
        while time.monotonic() - started < 0.6:
            assert await port.get(timeout=0.3) is None
            calls += 1
        # A new subscription wakes a waiting read at once (its confirmation is the next message).
        reading = asyncio.ensure_future(port.get(timeout=30.0))
        await asyncio.sleep(0.05)
        await port.subscribe(name)
        message = await reading
        await port.close()
        await bus.close()
        return calls, message

    calls, message = asyncio.run(scenario())
    assert calls <= 3                    # two or three waits of 0.3 s, not thousands of calls
    assert message["type"] == "subscribe"
