"""A running campaign's network policy narrowed and widened live (issue 17, item 4), execution side.

The metering proxy runs against the stand-in model on loopback (a real aiohttp
upstream started here); its endpoints are swapped while it runs. The runner's
re-check (execution/sandbox/live_network.py) and the spool's network policy
file (execution/spool/network.py) are checked with the policies written out here.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path

import aiohttp
import pytest

from demo.demo_model import StandInConfig, start_stand_in
from execution.metering.endpoints import Endpoint, RegisteredEndpoint, Rule
from execution.metering.proxy import MeteringProxy
from execution.metering.proxy_spec import ProxySpec
from execution.metering.proxy_thread import start_proxy
from execution.sandbox.live_network import network_problems, with_network
from execution.sandbox.policy.load import load_policy
from execution.sandbox.policy.model import PolicyError
from execution.spool.layout import SpoolLayout
from execution.spool.network import NetworkPolicyFile, NetworkPolicyFileError

KEY = "sk-stand-in-live-network"
MESSAGES = (Rule("POST", "/v1/messages"),)
CHAT = (Rule("POST", "/v1/chat/completions"),)


def body(stream: bool = False) -> dict:
    return {"model": "stand-in-sonnet", "max_tokens": 50, "messages": [{"role": "user", "content": "hi"}],
            "stream": stream}


@contextlib.asynccontextmanager
async def proxy_on_stand_in(tmp: Path, rules_of, **stand_in):
    """The stand-in model on 127.0.0.1, a proxy allowing ``rules_of(port)``, and an agent session."""
    (tmp / "key").write_text(KEY)
    runner, _model, port = await start_stand_in(StandInConfig(api_key=KEY, **stand_in))
    registered = [RegisteredEndpoint("stand-in", "anthropic", "http", "127.0.0.1", port, ("/v1/messages",),
                                     "anthropic"),
                  RegisteredEndpoint("stand-in-chat", "openai", "http", "127.0.0.1", port, ("/v1/chat",), "openai")]
    proxy = MeteringProxy(ProxySpec(rules_of(port), {"anthropic": f"file:{tmp / 'key'}",
                                                     "openai": f"file:{tmp / 'key'}"}, registered=registered))
    await proxy.start(tmp / "p.sock")
    session = aiohttp.ClientSession(connector=aiohttp.UnixConnector(str(tmp / "p.sock")))
    try:
        yield proxy, session, port
    finally:
        await session.close()
        await proxy.stop()
        await runner.cleanup()


def model_api(port: int, rules=MESSAGES + CHAT) -> list[Endpoint]:
    """The stand-in's Messages API (provider anthropic) and chat completions (openai), as far as
    ``rules`` allow them."""
    out = []
    if set(rules) & set(MESSAGES):
        out.append(Endpoint("model_api", "127.0.0.1", port, MESSAGES, credential="anthropic"))
    if set(rules) & set(CHAT):
        out.append(Endpoint("chat_api", "127.0.0.1", port, CHAT, credential="openai"))
    return out


async def status(session: aiohttp.ClientSession, path: str, stream: bool = False) -> int:
    async with session.post("http://sandbox" + path, json=body(stream)) as resp:
        await resp.read()
        return resp.status


def test_a_request_allowed_before_a_narrowing_is_refused_after_it(tmp_path):
    async def run():
        async with proxy_on_stand_in(tmp_path, model_api) as (proxy, session, port):
            assert await status(session, "/v1/chat/completions") == 200
            proxy.replace_endpoints(model_api(port, MESSAGES), 1)
            assert await status(session, "/v1/chat/completions") == 403
            assert await status(session, "/v1/messages") == 200
            versions = [(r["path"], r["policy_version"], r["refused"]) for r in proxy.records]
            assert versions == [("/v1/chat/completions", 0, None), ("/v1/chat/completions", 1, "not_in_policy"),
                                ("/v1/messages", 1, None)]
    asyncio.run(run())


def test_a_request_refused_before_a_widening_is_allowed_after_it(tmp_path):
    async def run():
        async with proxy_on_stand_in(tmp_path, lambda port: model_api(port, MESSAGES)) as (proxy, session, port):
            assert await status(session, "/v1/chat/completions") == 403
            proxy.replace_endpoints(model_api(port), 2)
            assert await status(session, "/v1/chat/completions") == 200
            assert proxy.records[-1]["credential"] == "stand-in-chat" and proxy.records[-1]["policy_version"] == 2
    asyncio.run(run())


def test_a_request_in_flight_is_not_cut_by_a_narrowing(tmp_path):
    async def run():
        async with proxy_on_stand_in(tmp_path, model_api, event_delay_ms=30) as (proxy, session, port):
            async with session.post("http://sandbox/v1/messages", json=body(stream=True)) as resp:
                assert resp.status == 200
                first = await resp.content.readline()
                proxy.replace_endpoints([], 1)  # no network at all from now on
                rest = await resp.content.read()
            assert first.startswith(b"event: message_start") and b"message_stop" in rest
            assert await status(session, "/v1/messages") == 403
            done, refused = proxy.records
            assert (done["complete"], done["policy_version"], done["refused"]) == (True, 0, None)
            assert (refused["policy_version"], refused["refused"]) == (1, "not_in_policy")
    asyncio.run(run())


def test_the_threaded_handle_swaps_the_rules(tmp_path):
    async def stand_in():
        return await start_stand_in(StandInConfig(api_key=KEY))

    loop = asyncio.new_event_loop()
    runner, _model, port = loop.run_until_complete(stand_in())
    import threading

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    handle = start_proxy(tmp_path / "h.sock", ProxySpec(model_api(port, MESSAGES), {}, policy_version=3))
    try:
        async def ask() -> int:
            async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(str(tmp_path / "h.sock"))) as s:
                return await status(s, "/v1/chat/completions")

        assert asyncio.run(ask()) == 403
        handle.replace_endpoints(model_api(port), 4)
        assert asyncio.run(ask()) != 403  # forwarded (no credential: the stand-in answers 401)
        assert [r["policy_version"] for r in handle.records()] == [3, 4]
    finally:
        handle.stop()
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


# ---------------------------------------------------------------- the runner's re-check

BASE = """
version: 1
filesystem_policy: {include_workdir: true, read_only: [/usr]}
network_policies:
  model_api:
    endpoints:
      - {host: api.example.com, port: 443, protocol: rest, credential_binding: {provider: anthropic},
         rules: [{allow: {method: POST, path: /v1/messages}}]}
    binaries: [{path: /usr/bin/python3}]
"""
CEILING = BASE.replace("/v1/messages", "/v1/**")


def network(paths: list[str], host: str = "api.example.com") -> dict:
    return {"model_api": {"endpoints": [{"host": host, "port": 443, "protocol": "rest",
                                         "credential_binding": {"provider": "anthropic"},
                                         "rules": [{"allow": {"method": "POST", "path": p}} for p in paths]}],
                          "binaries": [{"path": "/usr/bin/python3"}]}}


def test_a_change_keeps_the_rest_of_the_launch_policy():
    base = load_policy(BASE)
    changed = with_network(base, network(["/v1/messages", "/v1/messages/count_tokens"]))
    assert (changed.read_only, changed.include_workdir) == (base.read_only, base.include_workdir)
    [(_, endpoint)] = changed.endpoints()
    assert [r["allow"]["path"] for r in endpoint.rules] == ["/v1/messages", "/v1/messages/count_tokens"]
    assert list(with_network(base, {}).endpoints()) == []


def test_a_malformed_change_is_refused_by_the_validator():
    with pytest.raises(PolicyError, match="port"):
        with_network(load_policy(BASE), {"model_api": {"endpoints": [{"host": "api.example.com", "port": "x"}]}})
    with pytest.raises(PolicyError):
        with_network(load_policy(BASE), ["not", "a", "mapping"])


def test_a_change_within_the_ceiling_passes_and_a_wider_one_names_its_problems():
    ceilings = [("team a", load_policy(CEILING))]
    assert network_problems(with_network(load_policy(BASE), network(["/v1/models/x"])), ceilings) == []
    problems = network_problems(with_network(load_policy(BASE), network(["/v1/messages"], "evil.example.net")),
                                ceilings)
    assert problems and all(p.endswith("(ceiling: team a)") for p in problems)
    assert "evil.example.net" in problems[0]
    # A ceiling given as the spec carries it: only its network part.
    spec_ceiling = {"network_policies": load_policy(CEILING).data["network_policies"]}
    assert network_problems(with_network(load_policy(BASE), network(["/v2/other"])), [("spec", spec_ceiling)]) \
        == ["network_policies.model_api.endpoints[0] (port 443): rule POST /v2/other is not allowed by the "
            "ceiling (ceiling: spec)"]


# ---------------------------------------------------------------- the spool file

def test_the_network_policy_file_round_trips_and_refuses_a_bad_shape(tmp_path):
    path = SpoolLayout(tmp_path).network_policy_path(7)
    assert path == str(tmp_path / "campaigns" / "7" / "network.json")
    written = NetworkPolicyFile(campaign_id=7, policy_version=2, changed_at="2026-12-01T14:00:00Z",
                                changed_by="alice", network_policies=network(["/v1/messages"]))
    written.write(path)
    assert NetworkPolicyFile.read(path) == written
    assert json.loads(Path(path).read_text())["policy_version"] == 2
    good = written.to_json()
    for key, value, field in (("policy_version", 0, "policy_version"), ("policy_version", True, "policy_version"),
                              ("changed_at", "yesterday", "changed_at"), ("network_policies", [], "network_policies"),
                              ("version", 2, "version"), ("campaign_id", "../x", "campaign_id")):
        with pytest.raises(NetworkPolicyFileError, match=field):
            NetworkPolicyFile.from_json({**good, key: value})
    Path(path).write_text("{not json")
    with pytest.raises(NetworkPolicyFileError, match="not JSON"):
        NetworkPolicyFile.read(path)
