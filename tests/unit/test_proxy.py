"""The metering proxy with the stand-in model, on loopback and a Unix socket in a temp dir.

Every server here is started by the test: the stand-in model API on
127.0.0.1, a "forbidden" server on 127.0.0.2 that counts what reaches it
(case BUG-20), and the proxy on a Unix socket. Nothing else is contacted.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import stat
import time
from decimal import Decimal
from pathlib import Path

import aiohttp
import pytest
import yaml
from yarl import URL

from demo.demo_model import StandInConfig, reply_text, start_stand_in
from execution.metering.caps import Caps, FileCampaignCounter
from execution.metering.credentials import CredentialResolver
from execution.metering.endpoints import (Endpoint, Limits, RegisteredEndpoint, Rule, endpoints_from_policy,
                                          registered_endpoints)
from execution.metering.prices import PriceTable
from execution.metering.proxy import MeteringProxy
from execution.metering.proxy_spec import ProxySpec
from execution.metering.proxy_thread import start_proxy
from execution.metering.sse import SSEDecoder
from execution.metering.usage_file import usage_file_lines
from tests.support import budget

KEY = "sk-stand-in-0123456789abcdef"
CASES = Path(__file__).resolve().parent.parent / "fixtures" / "cases"
PRICES = PriceTable.from_mapping({
    "stand-in-sonnet": {"input": "3", "output": "15", "cache_read": "0.3", "cache_write_5m": "3.75",
                        "cache_write_1h": "6"},
    "stand-in-gpt": {"input": "2", "output": "8", "cache_read": "0.5"},
})
BUCKETS = ("input_tokens", "cache_read_tokens", "cache_write_5m_tokens", "cache_write_1h_tokens", "output_tokens",
           "reasoning_tokens")


def run(coro):
    return asyncio.run(coro)


class Forbidden:
    """A server the policy does not list (BUG-20's forbidden_server): counts connections."""

    def __init__(self) -> None:
        self.connections = 0
        self.server: asyncio.AbstractServer | None = None
        self.port = 0

    async def start(self) -> "Forbidden":
        async def seen(reader, writer):
            self.connections += 1
            writer.close()

        self.server = await asyncio.start_server(seen, "127.0.0.2", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        self.server.close()
        await self.server.wait_closed()


class Stack:
    """Stand-in model + proxy + an agent-side client session on the proxy's socket."""

    def __init__(self, tmp: Path, port: int, model, proxy: MeteringProxy, session: aiohttp.ClientSession) -> None:
        self.tmp, self.port, self.model, self.proxy, self.session = tmp, port, model, proxy, session
        self.sock = proxy.socket_path

    def url(self, path: str) -> str:
        return "http://sandbox" + path

    async def served(self) -> dict:
        async with aiohttp.ClientSession() as direct:
            async with direct.get(f"http://127.0.0.1:{self.port}/_stand_in/served") as resp:
                return await resp.json()

    async def raw(self, request: bytes) -> bytes:
        reader, writer = await asyncio.open_unix_connection(self.sock)
        writer.write(request)
        await writer.drain()
        data = await asyncio.wait_for(reader.read(), 10)
        writer.close()
        return data


def endpoints(port: int) -> list[Endpoint]:
    return [
        Endpoint("model_api", "127.0.0.1", port, (Rule("POST", "/v1/messages"), Rule("POST", "/v1/messages/*")),
                 credential="anthropic"),
        Endpoint("openai_api", "127.0.0.1", port, (Rule("POST", "/v1/chat/completions"),), credential="openai"),
    ]


def registered(port: int) -> list[RegisteredEndpoint]:
    """The stand-in, registered by the site's admins (the only destinations that get a credential)."""
    return [RegisteredEndpoint("stand-in-anthropic", "anthropic", "http", "127.0.0.1", port, ("/v1/messages",),
                               "anthropic"),
            RegisteredEndpoint("stand-in-openai", "openai", "http", "127.0.0.1", port, ("/v1/chat",), "openai")]


@contextlib.asynccontextmanager
async def stack(tmp: Path, caps: Caps | None = None, prices: PriceTable | None = PRICES, credentials=None,
                sock_name: str = "proxy.sock", policy_endpoints=None, registrations=None, limits: Limits | None = None,
                **stand_in):
    key_file = tmp / "model.key"
    key_file.write_text(KEY + "\n")
    runner, model, port = await start_stand_in(StandInConfig(api_key=KEY, **stand_in))
    creds = credentials or {"anthropic": f"file:{key_file}", "openai": f"file:{key_file}"}
    proxy = MeteringProxy(ProxySpec(policy_endpoints(port) if policy_endpoints else endpoints(port), creds, caps,
                                    prices=prices, limits=limits,
                                    registered=registered(port) if registrations is None else registrations(port)))
    await proxy.start(tmp / sock_name)
    session = aiohttp.ClientSession(connector=aiohttp.UnixConnector(str(tmp / sock_name)))
    try:
        yield Stack(tmp, port, model, proxy, session)
    finally:
        await session.close()
        await proxy.stop()
        await runner.cleanup()


def message(text: str = "hello", model: str = "stand-in-sonnet", **extra) -> dict:
    return {"model": model, "max_tokens": 200, "messages": [{"role": "user", "content": text}], **extra}


def cached_message(ttl: str | None, model: str = "stand-in-sonnet", system: str = "S" * 4000, **extra) -> dict:
    control = {"type": "ephemeral", **({"ttl": ttl} if ttl else {})}
    return message(system=[{"type": "text", "text": system, "cache_control": control}], model=model, **extra)


def sse_events(data: bytes) -> list:
    decoder = SSEDecoder()
    return decoder.feed(data) + decoder.close()


def ledger_usage(entry: dict) -> dict:
    return {k: entry[k] for k in BUCKETS}


def record_usage(record: dict) -> dict:
    return {k: record["usage"][k] for k in BUCKETS}


# ---------------------------------------------------------------- credential


def test_the_proxy_adds_the_credential_the_agent_never_has(tmp_path):
    async def body():
        async with stack(tmp_path) as s:
            # The stand-in refuses a request without its key: a 200 through the proxy means the proxy added it.
            async with aiohttp.ClientSession() as direct:
                async with direct.post(f"http://127.0.0.1:{s.port}/v1/messages", json=message()) as resp:
                    assert resp.status == 401
            async with s.session.post(s.url("/v1/messages"), json=message(),
                                      headers={"x-api-key": "agent-guess", "authorization": "Bearer agent"}) as resp:
                assert resp.status == 200
                received = json.dumps(dict(resp.headers)) + await resp.text()
            served = await s.served()
            assert served["rejected"] == {"auth": 1}
            assert served["per_request"][0]["credential_headers"] == ["x-api-key"]  # the agent's were dropped
            assert KEY not in received
            assert KEY not in json.dumps(s.proxy.records) and KEY not in json.dumps(s.proxy.totals())
    run(body())


def test_credential_from_the_runner_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("TCO_TEST_MODEL_KEY", KEY)

    async def body():
        async with stack(tmp_path, credentials=CredentialResolver({"anthropic": "env:TCO_TEST_MODEL_KEY"})) as s:
            async with s.session.post(s.url("/v1/messages"), json=message()) as resp:
                assert resp.status == 200
    run(body())


def test_missing_credential_is_a_clear_503_and_nothing_is_sent(tmp_path):
    async def body():
        async with stack(tmp_path, credentials={"anthropic": f"file:{tmp_path}/absent.key"}) as s:
            async with s.session.post(s.url("/v1/messages"), json=message()) as resp:
                assert resp.status == 503
                assert resp.headers["x-tco-proxy-refused"] == "credential_unavailable"
            assert s.proxy.totals()["refused_by_reason"] == {"credential_unavailable": 1}
            assert (await s.served())["totals"]["requests"] == 0
    run(body())


# -------------------------------------------------------- BUG-20 proxy probes


def bug20_probe(probe_id: str) -> dict:
    return next(p for p in json.loads((CASES / "BUG-20_proxy_bypass" / "probes.json").read_text())["probes"]
                if p["id"] == probe_id)


def test_bug20_p1_allowed_request_is_forwarded_and_metered(tmp_path):
    assert "200" in bug20_probe("P1")["expect"]

    async def body():
        async with stack(tmp_path) as s:
            async with s.session.post(s.url("/v1/messages"), json=message()) as resp:
                assert resp.status == 200
                data = await resp.json()
            assert data["content"][0]["text"].startswith("[stand-in]")
            [record] = s.proxy.records
            [entry] = (await s.served())["per_request"]
            assert record["status"] == 200 and record["refused"] is None and record["complete"] is True
            assert record_usage(record) == ledger_usage(entry)
            assert record["usage"]["input_tokens"] > 0 and record["usage"]["output_tokens"] > 0
    run(body())


@pytest.mark.parametrize("probe_id", ["P2", "P8"])
def test_bug20_connect_is_refused_and_reaches_nothing(tmp_path, probe_id):
    assert "403" in bug20_probe(probe_id)["expect"]

    async def body():
        forbidden = await Forbidden().start()
        try:
            async with stack(tmp_path) as s:
                target = f"127.0.0.2:{forbidden.port}"
                answer = await s.raw(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
                assert answer.startswith(b"HTTP/1.1 403")
                assert b'"refused": "connect"' in answer
                # also CONNECT to the allowed model API: a tunnel cannot be metered
                allowed = f"127.0.0.1:{s.port}"
                answer = await s.raw(f"CONNECT {allowed} HTTP/1.1\r\nHost: {allowed}\r\n\r\n".encode())
                assert answer.startswith(b"HTTP/1.1 403")
                assert s.proxy.totals()["refused_by_reason"] == {"connect": 2}
                assert (await s.served())["totals"]["requests"] == 0
            assert forbidden.connections == 0
        finally:
            await forbidden.stop()
    run(body())


def test_bug20_p3_absolute_form_request_to_another_host_is_refused(tmp_path):
    assert "403" in bug20_probe("P3")["expect"]

    async def body():
        forbidden = await Forbidden().start()
        try:
            async with stack(tmp_path) as s:
                target = f"http://127.0.0.2:{forbidden.port}/v1/messages"
                payload = json.dumps(message()).encode()
                answer = await s.raw(f"POST {target} HTTP/1.1\r\nHost: 127.0.0.2:{forbidden.port}\r\n"
                                     f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n".encode() + payload)
                assert answer.startswith(b"HTTP/1.1 403")
                assert b"host_not_allowed" in answer
                # the same absolute form naming the allowed endpoint is forwarded
                target = f"http://127.0.0.1:{s.port}/v1/messages"
                answer = await s.raw(f"POST {target} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(payload)}\r\n"
                                     f"Connection: close\r\n\r\n".encode() + payload)
                assert answer.startswith(b"HTTP/1.1 200")
            assert forbidden.connections == 0
        finally:
            await forbidden.stop()
    run(body())


def test_bug20_p9_host_header_never_retargets_a_request(tmp_path):
    assert "Host header never re-targets" in bug20_probe("P9")["expect"]

    async def body():
        forbidden = await Forbidden().start()
        try:
            async with stack(tmp_path) as s:
                async with s.session.post(s.url("/v1/messages"), json=message(),
                                          headers={"Host": f"127.0.0.2:{forbidden.port}"}) as resp:
                    assert resp.status == 200
                assert (await s.served())["totals"]["requests"] == 1
            assert forbidden.connections == 0
        finally:
            await forbidden.stop()
    run(body())


@pytest.mark.parametrize("method,path,reason", [
    ("GET", "/v1/messages", "not_in_policy"),
    ("POST", "/v1/complete", "not_in_policy"),
    ("POST", "/_stand_in/reset", "not_in_policy"),
    ("POST", "/v1/../v1/messages", "bad_path"),
    ("POST", "/v1/%2e%2e/v1/messages", "bad_path"),
    ("POST", "/v1/messages%2F..", "bad_path"),
    ("POST", "//v1/messages", "bad_path"),
])
def test_paths_and_methods_outside_the_policy_are_refused_and_counted(tmp_path, method, path, reason):
    async def body():
        async with stack(tmp_path) as s:
            payload = json.dumps(message()).encode()
            answer = await s.raw(f"{method} {path} HTTP/1.1\r\nHost: sandbox\r\nContent-Length: {len(payload)}\r\n"
                                 f"Connection: close\r\n\r\n".encode() + payload)
            head, _, rest = answer.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 403")
            error = json.loads(rest)
            assert error["tco_proxy"]["refused"] == reason
            assert error["error"]["message"].startswith("tco metering proxy: ")
            totals = s.proxy.totals()
            assert (totals["refused"], totals["refused_by_reason"], totals["forwarded"]) == (1, {reason: 1}, 0)
            assert s.proxy.records[0]["refused"] == reason
            assert (await s.served())["totals"]["requests"] == 0
    run(body())


def test_websocket_upgrade_is_refused(tmp_path):
    async def body():
        async with stack(tmp_path) as s:
            answer = await s.raw(b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\n"
                                 b"Upgrade: websocket\r\nContent-Length: 0\r\n\r\n")
            assert answer.startswith(b"HTTP/1.1 403") and b"upgrade" in answer
    run(body())


def test_socket_is_private_to_the_runner_user(tmp_path):
    async def body():
        async with stack(tmp_path) as s:
            mode = os.stat(s.sock).st_mode
            assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600
    run(body())


# ------------------------------------------------------------- streaming


def test_streams_are_passed_through_as_they_arrive(tmp_path):
    async def body():
        async with stack(tmp_path, event_delay_ms=40) as s:
            started = time.monotonic()
            first_at = None
            data = b""
            async with s.session.post(s.url("/v1/messages"), json=message(stream=True)) as resp:
                assert resp.headers["content-type"].startswith("text/event-stream")
                async for chunk in resp.content.iter_any():
                    if first_at is None:
                        first_at = time.monotonic() - started
                    data += chunk
            total = time.monotonic() - started
            assert total > 0.5  # about 20 events, 40 ms apart
            assert first_at < total / 3, (first_at, total)
            events = sse_events(data)
            assert [e.event for e in events][0] == "message_start" and events[-1].event == "message_stop"
            text = "".join(json.loads(e.data)["delta"]["text"] for e in events if e.event == "content_block_delta")
            assert text == reply_text(message(), "echo")
            [record] = s.proxy.records
            [entry] = (await s.served())["per_request"]
            assert record["stream"] is True and record["complete"] is True and record["flags"] == []
            assert record_usage(record) == ledger_usage(entry)
    run(body())


def test_client_disconnect_closes_the_upstream_and_still_records(tmp_path):
    async def body():
        async with stack(tmp_path) as s:
            payload = json.dumps(message("tell me a long story", stream=True)).encode()
            reader, writer = await asyncio.open_unix_connection(s.sock)
            writer.write(b"POST /v1/messages HTTP/1.1\r\nHost: sandbox\r\nx-stand-in-event-delay-ms: 150\r\n"
                         + f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
            await writer.drain()
            received = b""
            while b"content_block_delta" not in received:
                received += await asyncio.wait_for(reader.read(4096), 5)
            writer.close()  # the agent goes away mid-stream
            disconnected_at = time.monotonic()
            for _ in range(100):
                if s.proxy.records:
                    break
                await asyncio.sleep(0.02)
            [record] = s.proxy.records
            assert record["client_disconnected"] is True and record["complete"] is False
            assert "incomplete" in record["flags"] and "output_estimated" in record["flags"]
            for _ in range(100):
                served = await s.served()
                if served["per_request"][0]["disconnected"]:
                    break
                await asyncio.sleep(0.02)
            [entry] = served["per_request"]
            assert entry["disconnected"] is True  # the upstream connection was closed: generation stopped
            full_stream_s = 0.150 * (len(reply_text(message(), "echo").split(" ")) + 6)
            assert entry["ended"] - entry["started"] < full_stream_s / 2
            assert time.monotonic() - disconnected_at < 2
            # the input side is exact (message_start); output is an estimate from the text received
            assert record["usage"]["input_tokens"] == entry["input_tokens"]
            assert 1 <= record["usage"]["output_tokens"] < entry["output_tokens"] + 5
            totals = s.proxy.totals()
            assert (totals["client_disconnected"], totals["incomplete"]) == (1, 1)
    run(body())


def test_token_counting_is_forwarded_but_not_billed(tmp_path):
    async def body():
        async with stack(tmp_path) as s:
            async with s.session.post(s.url("/v1/messages/count_tokens"), json=message("x" * 40)) as resp:
                assert resp.status == 200
                assert (await resp.json())["input_tokens"] == 10  # 40 bytes of prompt
            totals = s.proxy.totals()
            assert (totals["forwarded"], totals["total_tokens"], totals["flags"]) == (1, 0, {})
            assert s.proxy.records[0]["usage"] is None and s.proxy.records[0]["status"] == 200
    run(body())


def test_upstream_429_is_passed_back_unchanged_and_counted(tmp_path):
    async def body():
        async with stack(tmp_path) as s:
            async with aiohttp.ClientSession() as direct:
                async with direct.post(f"http://127.0.0.1:{s.port}/v1/messages", json=message(),
                                       headers={"x-api-key": KEY, "x-stand-in-status": "429"}) as resp:
                    direct_body = await resp.read()
            async with s.session.post(s.url("/v1/messages"), json=message(),
                                      headers={"x-stand-in-status": "429"}) as resp:
                assert resp.status == 429
                assert resp.headers["retry-after"] == "1"
                assert resp.headers["anthropic-ratelimit-requests-remaining"] == "0"
                assert await resp.read() == direct_body
            totals = s.proxy.totals()
            assert (totals["rate_limited"], totals["forwarded"], totals["total_tokens"]) == (1, 1, 0)
            assert s.proxy.records[0]["status"] == 429 and s.proxy.records[0]["usage"] is None
    run(body())


def test_unreachable_upstream_is_a_502_and_counted(tmp_path):
    async def body():
        closed = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = closed.sockets[0].getsockname()[1]
        closed.close()
        await closed.wait_closed()
        key = tmp_path / "k"
        key.write_text(KEY)
        proxy = MeteringProxy(ProxySpec([Endpoint("model_api", "127.0.0.1", port, (Rule("POST", "/v1/messages"),),
                                                  credential="anthropic")], {"anthropic": f"file:{key}"}, prices=PRICES))
        await proxy.start(tmp_path / "p.sock")
        try:
            async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(str(tmp_path / "p.sock"))) as session:
                async with session.post("http://sandbox/v1/messages", json=message()) as resp:
                    assert resp.status == 502
            assert proxy.totals()["upstream_errors"] == 1
            # connection refused: the request never reached the model, so nothing can have been billed
            assert proxy.records[0]["status"] == 502 and proxy.records[0]["usage"] is None
            assert "ClientConnectorError" in proxy.records[0]["error"]
        finally:
            await proxy.stop()
    run(body())


# ------------------------------------------------------------------ OpenAI


def test_openai_stream_gets_include_usage_and_the_agent_sees_no_extra_chunk(tmp_path):
    async def body():
        async with stack(tmp_path) as s:
            convo = [{"role": "system", "content": "P" * 2000}, {"role": "user", "content": "first"}]
            request = {"model": "stand-in-gpt", "messages": convo, "stream": True, "reasoning_effort": "low"}
            for _ in range(2):  # the second one finds the conversation prefix cached
                async with s.session.post(s.url("/v1/chat/completions"), json=request) as resp:
                    assert resp.status == 200
                    data = await resp.read()
                chunks = [json.loads(e.data) for e in sse_events(data) if e.data != "[DONE]"]
                assert chunks and all(c["choices"] for c in chunks)  # no empty-choices chunk the agent never asked for
                assert sse_events(data)[-1].data == "[DONE]"
            served = (await s.served())["per_request"]
            assert [e["include_usage"] for e in served] == [True, True]
            for record, entry in zip(s.proxy.records, served):
                assert record["include_usage_added"] is True and record["flags"] == []
                assert record_usage(record) == ledger_usage(entry)
            second = s.proxy.records[1]["usage"]
            assert second["cache_read_tokens"] == 500  # 2000 bytes of system prompt, cached
            assert second["input_tokens"] == served[1]["input_tokens"] == 2  # "first": uncached part only
            assert second["reasoning_tokens"] == 16 and second["output_tokens"] == served[1]["output_tokens"]
            # 2*2e-6 + 500*0.5e-6 + out*8e-6
            expected = Decimal(2) * 2 / 10**6 + Decimal(500) * Decimal("0.5") / 10**6 \
                + Decimal(second["output_tokens"]) * 8 / 10**6
            assert Decimal(s.proxy.records[1]["cost_usd"]) == expected
    run(body())


def test_openai_usage_chunk_passes_when_the_agent_asked_for_it(tmp_path):
    async def body():
        async with stack(tmp_path) as s:
            request = {"model": "stand-in-gpt", "messages": [{"role": "user", "content": "hi"}], "stream": True,
                       "stream_options": {"include_usage": True}}
            async with s.session.post(s.url("/v1/chat/completions"), json=request) as resp:
                data = await resp.read()
            chunks = [json.loads(e.data) for e in sse_events(data) if e.data != "[DONE]"]
            assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["prompt_tokens"] == 1
            assert s.proxy.records[0]["include_usage_added"] is False
    run(body())


# -------------------------------------------------------------------- caps


def test_task_token_cap_refuses_further_requests(tmp_path):
    async def body():
        async with stack(tmp_path, caps=Caps(task_tokens=10)) as s:
            async with s.session.post(s.url("/v1/messages"), json=message()) as resp:
                assert resp.status == 200
            async with s.session.post(s.url("/v1/messages"), json=message()) as resp:
                assert resp.status == 403
                assert resp.headers["x-tco-proxy-refused"] == "task_token_cap"
                assert "cap of 10 tokens" in (await resp.json())["error"]["message"]
            totals = s.proxy.totals()
            assert totals["refused_by_reason"] == {"task_token_cap": 1} and totals["total_tokens"] >= 10
            assert (await s.served())["totals"]["requests"] == 1
    run(body())


def test_parallel_requests_cannot_overshoot_a_token_cap_by_more_than_one_request(tmp_path):
    """An agent firing 20 requests at once: under a cap they are metered one at a time."""
    async def body():
        async with stack(tmp_path, caps=Caps(task_tokens=10)) as s:
            async def one():
                async with s.session.post(s.url("/v1/messages"), json=message()) as resp:
                    await resp.read()
                    return resp.status
            statuses = await asyncio.gather(*(one() for _ in range(20)))
            assert statuses.count(200) == 1 and statuses.count(403) == 19
            assert (await s.served())["totals"]["requests"] == 1
    run(body())


def test_task_cost_cap_and_unpriced_model_under_a_cost_cap(tmp_path):
    async def body():
        async with stack(tmp_path, caps=Caps(task_cost_usd=Decimal("0.0000001"))) as s:
            async with s.session.post(s.url("/v1/messages"), json=message(model="not-in-the-table")) as resp:
                assert resp.status == 403
                assert resp.headers["x-tco-proxy-refused"] == "unpriced_model_under_cost_cap"
            async with s.session.post(s.url("/v1/messages"), json=message()) as resp:
                assert resp.status == 200
            async with s.session.post(s.url("/v1/messages"), json=message()) as resp:
                assert resp.headers["x-tco-proxy-refused"] == "task_cost_cap"
            assert s.proxy.totals()["refused_by_reason"] == {"unpriced_model_under_cost_cap": 1, "task_cost_cap": 1}
            assert (await s.served())["totals"]["requests"] == 1
    run(body())


def test_campaign_cap_is_shared_through_the_counter_file(tmp_path):
    counter_path = tmp_path / "campaign-7.spent.json"

    async def body():
        caps = Caps(campaign_tokens=10, campaign_counter=FileCampaignCounter(counter_path))
        async with stack(tmp_path, caps=caps, sock_name="task1.sock") as first:
            async with first.session.post(first.url("/v1/messages"), json=message()) as resp:
                assert resp.status == 200
            spent = first.proxy.totals()["total_tokens"]
        other = tmp_path / "task2"
        other.mkdir()
        async with stack(other, caps=Caps(campaign_tokens=10, campaign_counter=FileCampaignCounter(counter_path))
                         ) as second:
            async with second.session.post(second.url("/v1/messages"), json=message()) as resp:
                assert resp.status == 403
                assert resp.headers["x-tco-proxy-refused"] == "campaign_token_cap"
            assert (await second.served())["totals"]["requests"] == 0
        return spent

    spent = run(body())
    data = json.loads(counter_path.read_text())
    assert data["tokens"] == spent > 10
    assert Decimal(data["cost_usd"]) > 0


def test_a_cost_cap_without_prices_is_a_configuration_error():
    with pytest.raises(ValueError):
        ProxySpec([], {}, Caps(task_cost_usd=Decimal(1)), prices=None)
    with pytest.raises(ValueError):
        ProxySpec([], {}, Caps(campaign_tokens=5), prices=None)


# ------------------------------------------- totals equal what the model served


def test_proxy_totals_equal_what_the_stand_in_served(tmp_path):
    async def body():
        async with stack(tmp_path) as s:
            requests = [
                ("/v1/messages", message()),
                ("/v1/messages", message(stream=True)),
                ("/v1/messages", cached_message(None)),            # writes 5m
                ("/v1/messages", cached_message(None, stream=True)),  # reads
                ("/v1/messages", cached_message("1h", model="stand-in-sonnet-20990101", system="T" * 4000,
                                                stream=True)),
                ("/v1/chat/completions", {"model": "stand-in-gpt", "messages": [{"role": "user", "content": "x"}]}),
            ]
            for path, request in requests:
                async with s.session.post(s.url(path), json=request) as resp:
                    assert resp.status == 200
                    await resp.read()
            served = await s.served()
            totals = s.proxy.totals()
            for key in BUCKETS:
                assert totals[key] == served["totals"][key], key
            assert totals["cache_write_5m_tokens"] == 1000 and totals["cache_write_1h_tokens"] == 1000
            assert totals["cache_read_tokens"] == 1000
            assert totals["forwarded"] == served["totals"]["requests"] == 6
            # the dated model id is in no price table: its tokens are shown apart, not priced at 0
            assert totals["unpriced_models"] == ["stand-in-sonnet-20990101"]
            assert totals["unpriced_tokens"] == served["per_request"][4]["input_tokens"] + 1000 \
                + served["per_request"][4]["output_tokens"]
            assert totals["flags"] == {"unpriced_model": 1}
    run(body())


# -------------------------------------------------- policy and threaded start


POLICY = """
version: 1
filesystem_policy: {{include_workdir: true, read_only: [/usr], read_write: [/sandbox]}}
network_policies:
  model_api:
    endpoints:
      - host: 127.0.0.1
        port: {port}
        protocol: rest
        enforcement: enforce
        credential_binding: {{provider: anthropic}}
        rules: [{{allow: {{method: POST, path: /v1/messages}}}}]
      - host: 127.0.0.1
        port: 9
        rules: [{{allow: {{method: GET, path: /}}}}]
"""


def test_endpoints_from_a_sandbox_policy():
    policy = yaml.safe_load(POLICY.format(port=8123))
    [endpoint] = endpoints_from_policy(policy)  # the endpoint without protocol: rest cannot be metered
    assert (endpoint.name, endpoint.host, endpoint.port, endpoint.credential) == (
        "model_api", "127.0.0.1", 8123, "anthropic")
    assert endpoint.upstream == "http://127.0.0.1:8123"  # loopback: the stand-in
    assert endpoint.allows("POST", "/v1/messages") and not endpoint.allows("GET", "/v1/messages")
    real = endpoints_from_policy({"network_policies": {"m": {"endpoints": [
        {"host": "api.anthropic.com", "port": 443, "protocol": "rest", "rules": []}]}}})
    assert real[0].upstream == "https://api.anthropic.com:443"
    gateway = endpoints_from_policy(policy, upstreams={"127.0.0.1:8123": "http://127.0.0.1:9999/prefix"})
    assert gateway[0].upstream == "http://127.0.0.1:9999/prefix"
    with pytest.raises(ValueError):
        endpoints_from_policy({"network_policies": {"m": {"endpoints": [
            {"host": "h", "port": 1, "protocol": "rest", "rules": [{"allow": {"method": "POST"}}]}]}}})


def test_rule_globs():
    rule = Rule("POST", "/v1/*/messages")
    assert rule.allows("post", "/v1/x/messages") and not rule.allows("POST", "/v1/x/y/messages")
    assert Rule("*", "/v1/**").allows("GET", "/v1/a/b") and not Rule("*", "/v1/**").allows("GET", "/v2/a")


def test_start_proxy_runs_in_a_thread_and_feeds_the_usage_file(tmp_path):
    key_file = tmp_path / "model.key"
    key_file.write_text(KEY)
    records_path = tmp_path / "requests.jsonl"

    async def body():
        runner, model, port = await start_stand_in(StandInConfig(api_key=KEY, script="review"))
        try:
            spec = ProxySpec(endpoints_from_policy(yaml.safe_load(POLICY.format(port=port))),
                             {"anthropic": f"file:{key_file}"}, prices=PRICES, registered=registered(port))
            handle = start_proxy(tmp_path / "proxy.sock", spec, record_path=records_path)
            async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(handle.socket_path)) as session:
                verdicts = []
                for output in ("loss went down, run finished", "loss diverged at step 40", "the run CRASHED"):
                    async with session.post("http://sandbox/v1/messages", json=message(output)) as resp:
                        verdicts.append((await resp.json())["content"][0]["text"])
            assert verdicts == ["verdict: ok", "verdict: bad", "verdict: bad"]
            assert handle.totals()["forwarded"] == 3
            return handle.stop(), handle
        finally:
            await runner.cleanup()

    totals, handle = run(body())
    assert not os.path.exists(handle.socket_path)
    lines = records_path.read_text().splitlines()
    assert len(lines) == 3 and all(json.loads(line)["status"] == 200 for line in lines)
    usage_file = tmp_path / "usage"
    usage_file.write_text("wallclock=3.0\n")
    from execution.metering.usage_file import append_usage_file
    append_usage_file(usage_file, totals)
    values = dict(line.split("=", 1) for line in usage_file.read_text().splitlines())
    assert values["tco_requests"] == "3"
    assert int(values["tco_input_tokens"]) == totals["input_tokens"] > 0
    assert int(values["tco_output_tokens"]) == totals["output_tokens"] == 9  # "verdict: ok" etc.: 3 tokens each
    assert Decimal(values["tco_cost_usd"]) == Decimal(totals["cost_usd"]) > 0
    assert usage_file_lines(totals)[0] == "tco_requests=3"


# ------------------------------------------- issue 11, finding 2: only registered endpoints get a credential


class Attacker:
    """A launcher's own server on a loopback port: records every byte it receives, answers 200."""

    def __init__(self) -> None:
        self.received = bytearray()
        self.requests = 0
        self.server: asyncio.AbstractServer | None = None
        self.port = 0

    async def start(self) -> "Attacker":
        async def seen(reader, writer):
            head = await reader.readuntil(b"\r\n\r\n")
            length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), 0)
            body = await reader.readexactly(length)
            self.received += head + body
            self.requests += 1
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n"
                         b"Connection: close\r\n\r\n{}")
            await writer.drain()
            writer.close()

        self.server = await asyncio.start_server(seen, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        self.server.close()
        await self.server.wait_closed()


def test_issue11_a_policy_endpoint_naming_a_credential_gets_none(tmp_path):
    """The attack: a policy endpoint on the launcher's own loopback port with
    ``credential_binding: {provider: demo-stand-in}`` (the name of the site's real credential),
    listed before the model's. It gets no Authorization header and no secret; the registered
    endpoint still gets its key."""
    async def body():
        attacker = await Attacker().start()
        try:
            def policy_endpoints(port):
                rules = (Rule("POST", "/v1/messages"),)
                return [Endpoint("launchers", "127.0.0.1", attacker.port, rules, credential="demo-stand-in"),
                        Endpoint("model_api", "127.0.0.1", port, rules, credential="anthropic")]

            def registrations(port):
                return [RegisteredEndpoint("stand-in", "anthropic", "http", "127.0.0.1", port, ("/",),
                                           "demo-stand-in")]

            key_file = tmp_path / "site.key"
            key_file.write_text(KEY)
            async with stack(tmp_path, policy_endpoints=policy_endpoints, registrations=registrations,
                             credentials={"demo-stand-in": f"file:{key_file}", "anthropic": f"file:{key_file}"}) as s:
                payload = json.dumps(message()).encode()
                target = f"http://127.0.0.1:{attacker.port}/v1/messages"
                answer = await s.raw(f"POST {target} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(payload)}\r\n"
                                     f"Authorization: Bearer agent\r\nConnection: close\r\n\r\n".encode() + payload)
                assert answer.startswith(b"HTTP/1.1 200")  # forwarded: the policy allows it ...
                # ... but not one credential header of ours (nor the agent's) reached it
                assert attacker.requests == 1
                head = bytes(attacker.received).split(b"\r\n\r\n", 1)[0].lower()
                assert b"authorization:" not in head and b"x-api-key:" not in head
                assert KEY.encode() not in attacker.received
                # Origin form: both endpoints allow the path equally; the registered model wins.
                async with s.session.post(s.url("/v1/messages"), json=message()) as resp:
                    assert resp.status == 200
                    assert (await resp.json())["content"][0]["text"].startswith("[stand-in]")
                assert attacker.requests == 1
                served = await s.served()
                assert served["totals"]["requests"] == 1 and served["rejected"] == {}
                assert [r["credential"] for r in s.proxy.records] == [None, "stand-in"]
        finally:
            await attacker.stop()
    run(body())


def test_the_most_specific_registration_gives_the_credential(tmp_path):
    wrong = tmp_path / "wrong.key"
    wrong.write_text("sk-not-the-stand-ins-key")
    right = tmp_path / "right.key"
    right.write_text(KEY)

    def registrations(port):  # the broad one first: "the first that matches" would pick it
        return [RegisteredEndpoint("gateway", "anthropic", "http", "127.0.0.1", port, ("/",), "broad"),
                RegisteredEndpoint("messages", "anthropic", "http", "127.0.0.1", port, ("/v1/messages",), "narrow"),
                RegisteredEndpoint("other-port", "anthropic", "http", "127.0.0.1", 1, ("/v1/messages/x",), "broad")]

    async def body():
        async with stack(tmp_path, registrations=registrations,
                         credentials={"broad": f"file:{wrong}", "narrow": f"file:{right}"}) as s:
            async with s.session.post(s.url("/v1/messages"), json=message()) as resp:
                assert resp.status == 200
            assert s.proxy.records[-1]["credential"] == "messages"
    run(body())


def test_registered_endpoints_match_scheme_host_port_and_whole_path_segments():
    [reg] = registered_endpoints([{"name": "m", "provider": "anthropic", "scheme": "https",
                                   "host": "API.example.com", "port": 443, "path_prefixes": ["/v1"],
                                   "credential_name": "prod"}])
    assert reg.match(URL("https://api.example.com/v1/messages")) == 3
    assert reg.match(URL("https://api.example.com:443/v1")) == 3
    for other in ("http://api.example.com:443/v1/messages", "https://api.example.com:8443/v1/messages",
                  "https://api.example.com/v10/messages", "https://evil.example.com/v1/messages"):
        assert reg.match(URL(other)) == -1, other
    for bad in ([{"name": "m", "scheme": "ftp", "host": "h", "port": 1, "credential_name": "c"}],
                [{"name": "m", "scheme": "https", "host": "h/x", "port": 1, "credential_name": "c"}],
                [{"name": "m", "scheme": "https", "host": "h", "port": 0, "credential_name": "c"}],
                [{"name": "m", "scheme": "https", "host": "h", "port": 1, "credential_name": ""}],
                [{"name": "m", "scheme": "https", "host": "h", "port": 1, "credential_name": "c",
                  "path_prefixes": ["/v1/../admin"]}], {"not": "a list"}):
        with pytest.raises(ValueError):
            registered_endpoints(bad)


def test_without_a_registration_no_credential_is_added(tmp_path):
    async def body():
        async with stack(tmp_path, registrations=lambda port: []) as s:
            async with s.session.post(s.url("/v1/messages"), json=message(),
                                      headers={"x-api-key": KEY}) as resp:
                assert resp.status == 401  # the stand-in refused it: no key, not even the agent's
            served = await s.served()
            assert served["rejected"] == {"auth": 1}
            assert served["per_request"] == [] or served["per_request"][0]["credential_headers"] == []
    run(body())


# ------------------------------------------------ issue 11, finding 5: connection, body and record limits


async def _outcome(reader: asyncio.StreamReader, proxy: MeteringProxy, held_bytes: int) -> str:
    """What became of a connection that sent part of a body: "held" (the proxy buffers it),
    or the start of the proxy's answer ("closed" if it just closed)."""
    while True:
        if proxy.buffered >= held_bytes:
            return "held"
        try:
            data = await asyncio.wait_for(reader.read(12), 0.05)
        except asyncio.TimeoutError:
            continue
        except ConnectionError:
            return "closed"
        return data.decode() if data else "closed"


def test_issue11_unfinished_bodies_on_many_connections_stay_within_the_limits(tmp_path):
    """The attack: 12 connections each holding 31 MiB of an unfinished body (the runner reached
    467 MiB). Past 8 connections they are closed; past 8 MiB held at once a body is refused."""
    limits = Limits(max_connections=8, max_buffered_bytes=8 << 20)
    part = 3 << 20

    async def body():
        async with stack(tmp_path, limits=limits) as s:
            conns = [await asyncio.open_unix_connection(s.sock) for _ in range(12)]
            deadline = time.monotonic() + 20
            while s.proxy.counts["connections_refused"] < 4 and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            assert s.proxy.counts["connections_refused"] == 4
            outcomes, held = [], 0
            for reader, writer in conns:
                try:
                    writer.write(b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                 b"Content-Length: %d\r\n\r\n" % (31 << 20) + b"x" * part)
                    await writer.drain()
                except ConnectionError:
                    outcomes.append("closed")
                    continue
                outcome = await _outcome(reader, s.proxy, held + part)
                held += part if outcome == "held" else 0
                outcomes.append(outcome)
            # 4 closed at once, 2 held (6 MiB), 6 refused (their 503 may be lost in the reset).
            assert outcomes.count("held") == 2 and len(outcomes) == 12, outcomes
            assert set(outcomes) <= {"held", "closed", "HTTP/1.1 503"}, outcomes
            assert s.proxy.totals()["refused_by_reason"] == {"proxy_busy": 6}
            assert s.proxy.counts["connections_refused"] == 4
            # Never more than the cap held at once (plus the one read that crossed it).
            assert s.proxy.buffered_high_water <= (8 << 20) + (1 << 20)
            for _, writer in conns:
                writer.close()
            assert (await s.served())["totals"]["requests"] == 0
    run(body())


def test_a_body_declared_over_the_limit_is_refused_before_it_is_read(tmp_path):
    async def body():
        async with stack(tmp_path, limits=Limits(max_body_bytes=1 << 20)) as s:
            answer = await s.raw(b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (31 << 20)
                                 + b"{" * 1000)
            assert answer.startswith(b"HTTP/1.1 413") and b"body_too_large" in answer
            assert s.proxy.buffered_high_water == 0
    run(body())


def test_an_oversized_header_is_refused(tmp_path):
    async def body():
        async with stack(tmp_path, limits=Limits(max_header_bytes=1024)) as s:
            answer = await s.raw(b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 4096
                                 + b"\r\nContent-Length: 0\r\n\r\n")
            assert answer[:9] in (b"HTTP/1.0 ", b"HTTP/1.1 ") and answer[9:10] == b"4"  # aiohttp's 400
            assert s.proxy.counts["requests"] == 0 and (await s.served())["totals"]["requests"] == 0
    run(body())


def test_issue11_twenty_thousand_refused_requests_stay_within_the_record_caps(tmp_path):
    """The attack: 20,000 refused requests made a 47 MB requests.jsonl, every record kept in memory."""
    records_path = tmp_path / "requests.jsonl"
    limits = Limits(record_file_bytes=256 << 10, records_in_memory=100)
    per_connection, connections = 1000, budget.cases(20, check=5)  # make check: 5,000, still over the caps

    async def body():
        runner, model, port = await start_stand_in(StandInConfig(api_key=KEY))
        try:
            spec = ProxySpec(endpoints_from_policy(yaml.safe_load(POLICY.format(port=port))), {}, limits=limits)
            handle = start_proxy(tmp_path / "proxy.sock", spec, record_path=records_path)

            async def burst():
                reader, writer = await asyncio.open_unix_connection(handle.socket_path)
                writer.write(b"GET /v1/messages HTTP/1.1\r\nHost: x\r\n\r\n" * per_connection)
                await writer.drain()
                seen = 0
                while seen < per_connection:
                    data = await reader.read(1 << 16)
                    assert data, "the proxy closed a keep-alive connection"
                    seen += data.count(b"HTTP/1.1 403")
                writer.close()

            await asyncio.gather(*(burst() for _ in range(connections)))
            totals = handle.stop()
            return totals, handle
        finally:
            await runner.cleanup()

    totals, handle = run(body())
    total = per_connection * connections
    lines = records_path.read_text().splitlines()
    assert records_path.stat().st_size <= limits.record_file_bytes
    assert all(json.loads(line)["refused"] == "not_in_policy" for line in lines)
    assert totals["refused"] == total and totals["records_dropped"] == total - len(lines) > 0
    assert len(handle.proxy.records) == limits.records_in_memory
