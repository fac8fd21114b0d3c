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

from execution.metering.prices import PriceTable  # noqa: E402
from execution.metering.endpoints import RegisteredEndpoint  # noqa: E402
from execution.metering.proxy import Endpoint, Rule, start_proxy  # noqa: E402

KEY = "sk-bench-stand-in"
DIRECT_MODEL = "stand-in-direct"
from execution.spool import TOKEN_BUCKETS as BUCKETS  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_proxy(socket_path: str, port: int, key_file: str, conn) -> None:
    """Child process: the proxy, until the parent asks for its totals."""
    prices = PriceTable.from_mapping({"stand-in-sonnet": {"input": "3", "output": "15", "cache_read": "0.3",
                                                          "cache_write_5m": "3.75", "cache_write_1h": "6"}})
    handle = start_proxy(socket_path, [Endpoint("model_api", "127.0.0.1", port, (Rule("POST", "/v1/messages"),),
                                                credential="anthropic")],
                         {"anthropic": f"file:{key_file}"}, prices=prices,
                         # Only a registered endpoint ever gets the credential (as the runner's proxy).
                         registered=[RegisteredEndpoint("stand-in", "anthropic", "http", "127.0.0.1", port,
                                                        ("/v1/messages",), "anthropic")])
    conn.send("ready")
    conn.recv()
    conn.send(handle.stop())


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


async def measure(port: int, socket_path: str, n: int, warmup: int) -> list[tuple[str, list[float], list[float]]]:
    body = {"model": "stand-in-sonnet", "max_tokens": 200, "messages": [{"role": "user", "content": "benchmark " * 50}]}
    results = []
    direct = aiohttp.ClientSession()
    proxied = aiohttp.ClientSession(connector=aiohttp.UnixConnector(socket_path))
    try:
        for mode, extra in (("json", {}), ("stream", {"stream": True})):
            request = {**body, **extra}
            direct_url, proxy_url = f"http://127.0.0.1:{port}/v1/messages", "http://sandbox/v1/messages"
            # The direct requests name another model (same token counts) so that the stand-in's
            # ledger tells them apart from the proxied ones.
            direct_request = {**request, "model": DIRECT_MODEL}
            await timed(direct, direct_url, direct_request, {"x-api-key": KEY}, warmup)
            await timed(proxied, proxy_url, request, {}, warmup)
            # Interleave blocks so drift (CPU frequency, other load) hits both sides alike.
            d_all, p_all = [], []
            block = max(1, n // 10)
            for _ in range(0, n, block):
                d_all += await timed(direct, direct_url, direct_request, {"x-api-key": KEY}, block)
                p_all += await timed(proxied, proxy_url, request, {}, block)
            results.append((mode, d_all, p_all))
    finally:
        await direct.close()
        await proxied.close()
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
    port = free_port()
    socket_path = os.path.join(tmp, "proxy.sock")
    stand_in = subprocess.Popen(
        [sys.executable, "-m", "demo.demo_model", "--port", str(port), "--api-key-file", key_file,
         "--latency-ms", str(args.latency_ms), "--event-delay-ms", str(args.event_delay_ms)],
        cwd=REPO, stdout=subprocess.DEVNULL)
    parent_conn, child_conn = multiprocessing.Pipe()
    proxy = multiprocessing.get_context("fork").Process(target=run_proxy,
                                                        args=(socket_path, port, key_file, child_conn))
    try:
        asyncio.run(wait_http(f"http://127.0.0.1:{port}/_stand_in/served"))
        proxy.start()
        if not parent_conn.poll(15) or parent_conn.recv() != "ready":
            raise RuntimeError("proxy did not start")
        results = asyncio.run(measure(port, socket_path, args.requests, args.warmup))
        parent_conn.send("stop")
        totals = parent_conn.recv()

        async def served() -> list[dict]:
            async with aiohttp.ClientSession() as s:
                async with s.get(f"http://127.0.0.1:{port}/_stand_in/served") as resp:
                    return (await resp.json())["per_request"]

        per_request = asyncio.run(served())
    finally:
        if proxy.is_alive():
            proxy.terminate()
        proxy.join(5)
        stand_in.terminate()
        stand_in.wait(10)

    print(f"metering proxy overhead: loopback, stand-in model latency {args.latency_ms:g} ms, "
          f"{args.requests} sequential requests per side and mode, keep-alive")
    print(f"{'mode':<7} {'direct med':>11} {'proxy med':>10} {'overhead':>10} {'ratio':>6} "
          f"{'direct p90':>11} {'proxy p90':>10}")
    for mode, direct, proxied in results:
        d, p = statistics.median(direct), statistics.median(proxied)
        print(f"{mode:<7} {d:>8.3f} ms {p:>7.3f} ms {p - d:>+7.3f} ms {p / d:>5.2f}x "
              f"{p90(direct):>8.3f} ms {p90(proxied):>7.3f} ms")
    through_proxy = [r for r in per_request if r["model"] != DIRECT_MODEL]
    model_side = {k: sum(r[k] for r in through_proxy) for k in BUCKETS}
    same = all(totals[k] == model_side[k] for k in BUCKETS) and totals["forwarded"] == len(through_proxy)
    print(f"proxy metered {totals['forwarded']} requests, {totals['total_tokens']} tokens, {totals['cost_usd']} USD; "
          f"the stand-in served {len(through_proxy)} requests through it with "
          f"{sum(model_side.values())} tokens: {'equal' if same else 'MISMATCH'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
