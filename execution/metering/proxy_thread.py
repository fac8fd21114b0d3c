"""The metering proxy in a thread of its own, for plain threaded code such as the runner.

:func:`start_proxy` runs a :class:`~execution.metering.proxy.MeteringProxy` in
a daemon thread with its own event loop and returns a :class:`ProxyHandle`;
:class:`JsonlRecordSink` appends its request records to a file as they come.
"""
from __future__ import annotations

import asyncio
import json
import os
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

from execution.metering.endpoints import Endpoint
from execution.metering.proxy import MeteringProxy
from execution.metering.proxy_spec import ProxySpec

__all__ = ["JsonlRecordSink", "ProxyHandle", "start_proxy"]


class JsonlRecordSink:
    """Append each record as one JSON line to ``path`` (flushed at once, so a
    runner that dies keeps what was metered up to then), while the file stays
    within ``max_bytes``; a record that would pass it is dropped (the call
    returns False) and counted in :attr:`dropped`."""

    def __init__(self, path: str | os.PathLike, max_bytes: int | None = None) -> None:
        # The submit account's alone (0600), like everything in the spool.
        self._fh = os.fdopen(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600), "a", encoding="utf-8")
        self._lock = threading.Lock()
        self.max_bytes = max_bytes
        self.size = self._fh.tell()
        self.dropped = 0

    def __call__(self, record: Mapping[str, Any]) -> bool:
        """Append ``record``; False if it was dropped (the file would pass ``max_bytes``)."""
        line = json.dumps(record, sort_keys=False) + "\n"
        data_size = len(line.encode("utf-8"))
        with self._lock:
            if self.max_bytes is not None and self.size + data_size > self.max_bytes:
                self.dropped += 1
                return False
            self._fh.write(line)
            self._fh.flush()
            self.size += data_size
        return True

    def close(self) -> None:
        """Close the file."""
        self._fh.close()


@dataclass
class ProxyHandle:
    """A proxy running in its own thread and event loop (see :func:`start_proxy`)."""

    proxy: MeteringProxy
    socket_path: str
    loop: asyncio.AbstractEventLoop
    thread: threading.Thread
    closers: list[Callable[[], None]] = field(default_factory=list, repr=False)
    _stopped: bool = field(default=False, repr=False)

    def totals(self) -> dict:
        """:meth:`MeteringProxy.totals`, read in the proxy's loop."""
        return self._call(self.proxy.totals)

    def records(self) -> list[dict]:
        """A copy of the request records so far."""
        return self._call(lambda: [dict(r) for r in self.proxy.records])

    def replace_endpoints(self, endpoints: Iterable[Endpoint], policy_version: int) -> None:
        """:meth:`MeteringProxy.replace_endpoints`, run in the proxy's loop; returns once new
        requests are routed by ``endpoints``."""
        endpoints = list(endpoints)
        self._call(lambda: self.proxy.replace_endpoints(endpoints, policy_version))

    def _call(self, fn: Callable[[], Any]) -> Any:
        if self._stopped:
            return fn()

        async def run() -> Any:
            return fn()

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(timeout=10)

    def stop(self, timeout: float = 15.0) -> dict:
        """Stop the proxy (requests in flight are cut and recorded), end the
        thread and return the final totals. Idempotent."""
        if not self._stopped:
            asyncio.run_coroutine_threadsafe(self.proxy.stop(), self.loop).result(timeout=timeout)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout)
            self._stopped = True
            for close in self.closers:
                close()
        return self.proxy.totals()


def start_proxy(socket_path: str | os.PathLike, spec: ProxySpec, *, record_sink: Callable[[dict], Any] | None = None,
                record_path: str | os.PathLike | None = None, socket_mode: int = 0o600,
                ready_timeout_s: float = 10.0) -> ProxyHandle:
    """Start a :class:`~execution.metering.proxy.MeteringProxy` enforcing ``spec`` on the Unix
    socket ``socket_path`` (permissions ``socket_mode``) in a daemon thread with its own event
    loop; returns once it listens. ``record_sink``: called with each request record in the
    proxy's loop; ``record_path``: append records as JSON lines there as well, up to
    ``spec.limits.record_file_bytes``. Raises the start error (OSError, ValueError) in the
    caller's thread, TimeoutError after ``ready_timeout_s`` seconds. Stop with
    :meth:`ProxyHandle.stop`."""
    sinks: list[Callable[[dict], Any]] = [s for s in (record_sink,) if s is not None]
    closers: list[Callable[[], None]] = []
    if record_path is not None:
        jsonl = JsonlRecordSink(record_path, spec.limits.record_file_bytes)
        sinks.append(jsonl)
        closers.append(jsonl.close)

    def sink(record: dict) -> bool:
        kept = True
        for each in sinks:
            kept = each(record) is not False and kept
        return kept

    proxy = MeteringProxy(spec, record_sink=sink if sinks else None)
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    failure: list[BaseException] = []

    def run() -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(proxy.start(socket_path, socket_mode))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread below
            failure.append(exc)
            ready.set()
            loop.close()
            return
        ready.set()
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    thread = threading.Thread(target=run, name="tco-metering-proxy", daemon=True)
    thread.start()
    if not ready.wait(ready_timeout_s):
        raise TimeoutError(f"metering proxy did not start within {ready_timeout_s} s")
    if failure:
        for close in closers:
            close()
        raise failure[0]
    return ProxyHandle(proxy=proxy, socket_path=os.fspath(socket_path), loop=loop, thread=thread, closers=closers)
