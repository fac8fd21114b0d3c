"""Benchmark: the metering proxy's overhead per request, beside a direct request.

    .venv/bin/python bench/bench_proxy.py [--requests 300] [--latency-ms 0] [--event-delay-ms 0]

Everything runs on this machine: the stand-in model API (demo/demo_model.py,
a subprocess on 127.0.0.1), the metering proxy (a child process on a Unix
socket in a temp dir, as the runner starts it) and the client (this process).
For JSON and for streaming requests it times N sequential requests on one
keep-alive connection, first direct to the stand-in (with its key), then
through the proxy (which adds the key, meters and prices), and prints the
median and p90 of each, the overhead in milliseconds and the ratio. With the
default latency 0 the stand-in answers at once, so the ratio is the worst
case; ``--latency-ms 50`` shows it beside a model that takes 50 ms.
At the end it checks that the proxy's token totals equal what the stand-in
says it served.

Export on and off (issue 25): two proxies run side by side, one without
tracing and one whose task exports a GenAI span per request
(execution/metering/otel.py: BatchSpanProcessor, OTLP/HTTP protobuf) to a
local OTLP receiver (a child process that decodes and counts the spans); the
requests are interleaved over direct, export off and export on, and the
overhead of each proxy is printed beside the other. At the end it checks that
the receiver got one span per request the exporting proxy metered.
"""
from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from execution.metering.endpoints import Endpoint, RegisteredEndpoint, Rule  # noqa: E402
from execution.metering.prices import PriceTable  # noqa: E402
from execution.metering.proxy_spec import ProxySpec  # noqa: E402
from execution.metering.proxy_thread import start_proxy  # noqa: E402

KEY = "sk-bench-stand-in"
DIRECT_MODEL = "stand-in-direct"
from execution.spool.contract import TOKEN_BUCKETS as BUCKETS  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_receiver(port: int, conn) -> None:
    """Child process: an OTLP/HTTP receiver on 127.0.0.1 that decodes each export and counts its spans
    (GET /count), until killed."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    count = [0]

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            request = ExportTraceServiceRequest()
            request.ParseFromString(self.rfile.read(int(self.headers["Content-Length"])))
            count[0] += sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_GET(self):  # noqa: N802
            body = str(count[0]).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    conn.send("ready")
    server.serve_forever()


def run_proxy(socket_path: str, port: int, key_file: str, conn, otlp_port: int | None = None) -> None:
    """Child process: the proxy, until the parent asks for its totals. With ``otlp_port``, each request
    record also becomes a span exported to that receiver (execution/metering/otel.py)."""
    prices = PriceTable.from_mapping({"stand-in-sonnet": {"input": "3", "output": "15", "cache_read": "0.3",
                                                          "cache_write_5m": "3.75", "cache_write_1h": "6"}})
    endpoint = Endpoint("model_api", "127.0.0.1", port, (Rule("POST", "/v1/messages"),), credential="anthropic")
    # Only a registered endpoint ever gets the credential (as the runner's proxy).
    registered = RegisteredEndpoint("stand-in", "anthropic", "http", "127.0.0.1", port, ("/v1/messages",), "anthropic")
    tracer = None
    if otlp_port is not None:
        from execution.metering.otel import TaskTracer
        from execution.metering.otel_spans import TraceParent

        tracer = TaskTracer({"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{otlp_port}",
                             "TRACEPARENT": TraceParent.new().text(), "TCO_OTEL_COST": "1"},
                            campaign_id="bench", task_number=1)
        tracer.start(None)
    handle = start_proxy(socket_path, ProxySpec([endpoint], {"anthropic": f"file:{key_file}"}, prices=prices,
                                                registered=[registered]),
                         record_sink=tracer.record_sink if tracer is not None else None)
    conn.send("ready")
    conn.recv()
    totals = handle.stop()
    if tracer is not None:
        totals["telemetry"] = tracer.finish({}, flush_s=10)
    conn.send(totals)


async def wait_http(url: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as session:
        while True:
            try:
                async with session.get(url) as resp:
                    if resp.status == 200:
                        return
            except aiohttp.ClientConnectionError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"stand-in did not answer on {url}")
            await asyncio.sleep(0.05)


async def timed(session: aiohttp.ClientSession, url: str, body: dict, headers: dict, n: int) -> list[float]:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        async with session.post(url, json=body, headers=headers) as resp:
            await resp.read()
            if resp.status != 200:
                raise RuntimeError(f"{url}: HTTP {resp.status}")
        times.append((time.perf_counter() - start) * 1000)
    return times


def p90(values: list[float]) -> float:
    return statistics.quantiles(values, n=10)[-1]


async def measure(port: int, sockets: list[str], n: int,
                  warmup: int) -> list[tuple[str, list[float], list[list[float]]]]:
    """Per mode (json, stream): the direct times and, for each proxy socket, its times (ms)."""
    body = {"model": "stand-in-sonnet", "max_tokens": 200, "messages": [{"role": "user", "content": "benchmark " * 50}]}
    results = []
    direct = aiohttp.ClientSession()
    proxied = [aiohttp.ClientSession(connector=aiohttp.UnixConnector(path)) for path in sockets]
    try:
        for mode, extra in (("json", {}), ("stream", {"stream": True})):
            request = {**body, **extra}
            direct_url, proxy_url = f"http://127.0.0.1:{port}/v1/messages", "http://sandbox/v1/messages"
            # The direct requests name another model (same token counts) so that the stand-in's
            # ledger tells them apart from the proxied ones.
            direct_request = {**request, "model": DIRECT_MODEL}
            await timed(direct, direct_url, direct_request, {"x-api-key": KEY}, warmup)
            for session in proxied:
                await timed(session, proxy_url, request, {}, warmup)
            # Interleave blocks so drift (CPU frequency, other load) hits every side alike.
            d_all: list[float] = []
            p_all: list[list[float]] = [[] for _ in proxied]
            block = max(1, n // 60)  # small blocks: the load of a shared machine drifts fast
            for _ in range(0, n, block):
                d_all += await timed(direct, direct_url, direct_request, {"x-api-key": KEY}, block)
                for times, session in zip(p_all, proxied):
                    times += await timed(session, proxy_url, request, {}, block)
            results.append((mode, d_all, p_all))
    finally:
        await direct.close()
        for session in proxied:
            await session.close()
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--latency-ms", type=float, default=0.0)
    parser.add_argument("--event-delay-ms", type=float, default=0.0)
    args = parser.parse_args()

    tmp = tempfile.mkdtemp(prefix="tco-bench-")
    key_file = os.path.join(tmp, "model.key")
    with open(key_file, "w") as fh:
        fh.write(KEY)
    port, otlp_port = free_port(), free_port()
    sockets = [os.path.join(tmp, "proxy-off.sock"), os.path.join(tmp, "proxy-on.sock")]
    stand_in = subprocess.Popen(
        [sys.executable, "-m", "demo.demo_model", "--port", str(port), "--api-key-file", key_file,
         "--latency-ms", str(args.latency_ms), "--event-delay-ms", str(args.event_delay_ms)],
        cwd=REPO, stdout=subprocess.DEVNULL)
    fork = multiprocessing.get_context("fork")
    receiver_conn, receiver_child = multiprocessing.Pipe()
    receiver = fork.Process(target=run_receiver, args=(otlp_port, receiver_child), daemon=True)
    conns, proxies = [], []
    for path, otlp in zip(sockets, (None, otlp_port)):  # export off, export on
        parent_conn, child_conn = multiprocessing.Pipe()
        conns.append(parent_conn)
        proxies.append(fork.Process(target=run_proxy, args=(path, port, key_file, child_conn, otlp)))
    try:
        asyncio.run(wait_http(f"http://127.0.0.1:{port}/_stand_in/served"))
        receiver.start()
        if not receiver_conn.poll(15) or receiver_conn.recv() != "ready":
            raise RuntimeError("OTLP receiver did not start")
        for proxy, conn in zip(proxies, conns):
            proxy.start()
            if not conn.poll(15) or conn.recv() != "ready":
                raise RuntimeError("proxy did not start")
        results = asyncio.run(measure(port, sockets, args.requests, args.warmup))
        totals = []
        for conn in conns:
            conn.send("stop")
            totals.append(conn.recv())

        async def served() -> list[dict]:
            async with aiohttp.ClientSession() as s:
                async with s.get(f"http://127.0.0.1:{port}/_stand_in/served") as resp:
                    return (await resp.json())["per_request"]

        async def received() -> int:
            async with aiohttp.ClientSession() as s:
                async with s.get(f"http://127.0.0.1:{otlp_port}/count") as resp:
                    return int(await resp.text())

        per_request = asyncio.run(served())
        spans = asyncio.run(received())
    finally:
        for proxy in proxies:
            if proxy.is_alive():
                proxy.terminate()
            proxy.join(5)
        if receiver.is_alive():
            receiver.terminate()
        stand_in.terminate()
        stand_in.wait(10)

    print(f"metering proxy overhead: loopback, stand-in model latency {args.latency_ms:g} ms, "
          f"{args.requests} sequential requests per side and mode, keep-alive; "
          "trace export off and on (OTLP/HTTP to a local receiver)")
    print(f"{'mode':<7} {'direct med':>11} {'off med':>10} {'on med':>10} {'overhead off':>13} {'overhead on':>12} "
          f"{'on - off':>10} {'direct p90':>11} {'off p90':>10} {'on p90':>10}")
    for mode, direct, (off, on) in results:
        d, p_off, p_on = statistics.median(direct), statistics.median(off), statistics.median(on)
        print(f"{mode:<7} {d:>8.3f} ms {p_off:>7.3f} ms {p_on:>7.3f} ms {p_off - d:>+10.3f} ms {p_on - d:>+9.3f} ms "
              f"{p_on - p_off:>+7.3f} ms {p90(direct):>8.3f} ms {p90(off):>7.3f} ms {p90(on):>7.3f} ms")
    through_proxy = [r for r in per_request if r["model"] != DIRECT_MODEL]
    model_side = {k: sum(r[k] for r in through_proxy) for k in BUCKETS}
    metered = {k: sum(t[k] for t in totals) for k in BUCKETS}
    forwarded = sum(t["forwarded"] for t in totals)
    same = metered == model_side and forwarded == len(through_proxy)
    print(f"the proxies metered {forwarded} requests, {sum(metered.values())} tokens, "
          f"{' + '.join(str(t['cost_usd']) for t in totals)} USD; the stand-in served {len(through_proxy)} requests "
          f"through them with {sum(model_side.values())} tokens: {'equal' if same else 'MISMATCH'}")
    telemetry = totals[1]["telemetry"]
    whole = spans == telemetry["spans"] == totals[1]["forwarded"] + 1
    print(f"export on: {totals[1]['forwarded']} requests, {telemetry['spans']} spans made, "
          f"{telemetry['spans_exported']} exported, {telemetry['spans_dropped']} dropped; the receiver decoded "
          f"{spans} spans: {'one per request and the agent span' if whole else 'MISMATCH'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
