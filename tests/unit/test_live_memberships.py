"""Sockets' channel-layer group joins and leaves, batched (dashboards/live/memberships.py): on channels_redis'
RedisChannelLayer, the same commands as the layer's own group_add/group_discard, in one round trip for the
requests that come at once; each request gets its own error."""
import asyncio
import time

import pytest
from channels_redis.core import RedisChannelLayer

from dashboards.live import memberships

from tests.support.channel_redis import FakeRedis


def layer_on(redis: FakeRedis) -> RedisChannelLayer:
    layer = RedisChannelLayer(hosts=["redis://127.0.0.1:9/0"], prefix="tco-test:asgi", group_expiry=3600)
    layer.connection = lambda index: redis
    return layer


def channel(n: int) -> str:
    return f"specific.abc!{n:04d}"


def test_a_batch_leaves_redis_as_the_layers_own_group_add_and_group_discard_would():
    """The same keys, members and expiry as channels_redis' group_add/group_discard, with scores of the
    moment of the trip (group_send drops members older than group_expiry by their score)."""
    plan = [("add", f"tco.user.{n % 7}", channel(n)) for n in range(40)]
    plan += [("add", f"tco.session.{n}", channel(n)) for n in range(40)]
    plan += [("discard", f"tco.user.{n % 7}", channel(n)) for n in range(0, 40, 3)]

    def run(redis: FakeRedis, call) -> None:
        async def main():
            await asyncio.gather(*(call(op, group, ch) for op, group, ch in plan[:80]))
            await asyncio.gather(*(call(op, group, ch) for op, group, ch in plan[80:]))
        asyncio.run(main())

    own, batched = FakeRedis(), FakeRedis()
    layer = layer_on(own)
    run(own, lambda op, group, ch: (layer.group_add if op == "add" else layer.group_discard)(group, ch))
    began = time.time()
    layer_b = layer_on(batched)
    run(batched, lambda op, group, ch: getattr(memberships.memberships(layer_b), op)(group, ch))
    ended = time.time()

    assert {k: set(v) for k, v in batched.sets.items()} == {k: set(v) for k, v in own.sets.items()}
    expected_users = {f"tco-test:asgi:group:tco.user.{u}".encode(): {channel(n) for n in range(40)
                                                                      if n % 7 == u and n % 3} for u in range(7)}
    assert {k: set(v) for k, v in batched.sets.items() if b"user" in k} == expected_users
    assert batched.ttl == own.ttl == {key: 3600 for key in own.sets}
    assert all(began <= score <= ended for members in batched.sets.values() for score in members.values())


def test_sockets_joining_at_once_go_in_a_few_round_trips_not_two_per_join():
    redis = FakeRedis()
    layer = layer_on(redis)

    async def storm():
        gang = memberships.memberships(layer)
        await asyncio.gather(*(gang.add(f"tco.session.{n}", channel(n)) for n in range(500)))
        await asyncio.gather(*(gang.add(f"tco.user.{n % 50}", channel(n)) for n in range(500)))
        return gang.trips

    trips = asyncio.run(storm())
    # Requests that come while a trip is on its way go together in the next (BATCH at most): a wave of 500
    # takes one trip or two.
    assert trips == redis.trips <= 4
    assert sum(len(members) for members in redis.sets.values()) == 1000
    # The layer's own calls: ZADD and EXPIRE, one round trip each, per join.
    alone = FakeRedis()
    own = layer_on(alone)

    async def own_storm():
        await asyncio.gather(*(own.group_add(f"tco.session.{n}", channel(n)) for n in range(500)))

    asyncio.run(own_storm())
    assert alone.trips == 1000


def test_a_failed_trip_fails_each_of_its_requests_and_a_commands_error_only_its_own():
    redis = FakeRedis()
    layer = layer_on(redis)
    bad_key = b"tco-test:asgi:group:tco.user.2"
    redis.wrong_type.add(bad_key)

    async def scenario():
        gang = memberships.memberships(layer)
        first = asyncio.ensure_future(gang.add("tco.user.1", channel(0)))
        rest = [asyncio.ensure_future(gang.add(f"tco.user.{n}", channel(n))) for n in (1, 2, 3)]
        await first
        outcomes = await asyncio.gather(*rest, return_exceptions=True)
        redis.down = ConnectionError("Redis away")
        away = await asyncio.gather(*(gang.add("tco.user.4", channel(n)) for n in range(3)), return_exceptions=True)
        redis.down = None
        again = await gang.add("tco.user.4", channel(9))
        return outcomes, away, again

    outcomes, away, again = asyncio.run(scenario())
    assert outcomes[0] is None and outcomes[2] is None
    assert isinstance(outcomes[1], RuntimeError) and str(outcomes[1]) == "WRONGTYPE"
    assert [type(e) for e in away] == [ConnectionError] * 3
    assert again is None
    assert set(redis.sets[b"tco-test:asgi:group:tco.user.4"]) == {channel(9)}
    assert set(redis.sets[b"tco-test:asgi:group:tco.user.3"]) == {channel(3)}


def test_a_layer_without_pipelines_gets_its_own_calls_at_most_layer_calls_at_once(monkeypatch):
    from channels.layers import InMemoryChannelLayer

    monkeypatch.setattr(memberships, "LAYER_CALLS", 3)
    layer = InMemoryChannelLayer()
    now, most = [0], [0]
    real_add = layer.group_add

    async def slow_add(group, ch):
        now[0] += 1
        most[0] = max(most[0], now[0])
        await asyncio.sleep(0.005)
        now[0] -= 1
        await real_add(group, ch)

    layer.group_add = slow_add

    async def storm():
        await asyncio.gather(*(memberships.memberships(layer).add("tco.user.1", channel(n)) for n in range(20)))
        return set(layer.groups["tco.user.1"])

    assert asyncio.run(storm()) == {channel(n) for n in range(20)}
    assert most[0] == 3


@pytest.mark.parametrize("name", ["bad group!", "x" * 200])
def test_an_invalid_group_name_is_refused_as_the_layer_refuses_it(name):
    layer = layer_on(FakeRedis())

    async def ask():
        await memberships.memberships(layer).add(name, channel(1))

    with pytest.raises((AssertionError, TypeError)):
        asyncio.run(ask())
