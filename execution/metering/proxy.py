"""The metering egress proxy: the sandbox's only way to a model, and the bill.

The runner starts it outside the sandbox on a Unix socket that is bound into
the sandbox (DESIGN.md, "Token metering and cost"); a relay inside passes the
agent's loopback connections to it. It is an aiohttp server (low-level
``web.Server``: every request reaches one handler, CONNECT included) and an
aiohttp client to the real model API.

What it does with each request:

1. Decides from the request line alone (the ``Host`` header never targets a
   request). Refused with 403 and a JSON body, counted by reason:
   ``connect`` (CONNECT: a TLS tunnel cannot be metered), ``upgrade``
   (WebSocket and other upgrades), ``host_not_allowed`` (an absolute-form
   target naming a host:port no policy endpoint has), ``bad_path`` (dot
   segments, ``//``, encoded ``/`` or ``\\``, a target that is not a path),
   ``not_in_policy`` (no endpoint rule allows this method and path), the caps
   (``task_token_cap``, ``task_cost_cap``, ``campaign_token_cap``,
   ``campaign_cost_cap``, ``unpriced_model_under_cost_cap``,
   ``campaign_counter_unreadable``), and, with other statuses,
   ``body_too_large`` (413), ``proxy_busy`` (503: the bodies being read
   together would pass :attr:`~execution.metering.endpoints.Limits.max_buffered_bytes`) and
   ``credential_unavailable`` (503). An origin-form request goes to the
   endpoint whose allowing rule is the most specific (an exact path before a
   glob, then the longer literal prefix, then an exact method; on a tie, an
   endpoint whose destination is registered, then policy order); an
   absolute-form one only to an endpoint with that host and port
   (execution/metering/routing.py).
2. Forwards it to the endpoint's upstream base URL: client credential headers
   (``authorization``, ``x-api-key``, ``api-key``, ``x-goog-api-key``,
   ``cookie``, ``proxy-authorization``) and hop-by-hop headers are dropped.
   A credential is added only when the request's destination (scheme, host,
   port and path prefix of the upstream URL) is a model endpoint the site's
   admins registered (:class:`~execution.metering.endpoints.RegisteredEndpoint`; the most specific one
   that matches) and the policy endpoint asks for one (``credential_binding``):
   then exactly the credential that registration names (``x-api-key`` for
   provider ``anthropic``, ``Authorization: Bearer`` otherwise), resolved here
   from a file or the runner's environment, never from the agent's side. A
   policy's ``credential_binding`` never chooses a credential: an endpoint that
   is not registered gets none (issue 11, finding 2). Redirects
   are passed back, not followed. For an OpenAI chat completions stream the
   proxy sets ``stream_options.include_usage``; if the agent had not asked for
   it, the extra usage chunk (empty ``choices``) is removed from what the
   agent receives, so a client that indexes ``choices[0]`` is not broken.
3. Streams the answer back as it arrives (nothing is buffered whole) while
   feeding it to the usage reader (execution/metering/usage_readers.py). Usage is read
   from 2xx answers only, and not from paths that bill nothing
   (``.../count_tokens``, ``.../models``). Upstream 429 answers go back unchanged (status,
   headers, body) and are counted as ``rate_limited``.
4. If the agent disconnects, the handler is cancelled (aiohttp
   ``handler_cancellation``), the upstream connection is closed at once (so
   generation and billing stop) and the request is still recorded:
   ``complete: false``, output estimated from the bytes received, flagged.
5. Writes one record per request to ``record_sink`` and keeps totals
   (:meth:`MeteringProxy.totals`).

The endpoints can change while the proxy runs (issue 17: a running campaign's
network policy narrowed or widened, :meth:`MeteringProxy.replace_endpoints`):
each request is routed by the endpoints in force when its request line is
decided, so a change applies to every new request at once and never cuts one
in flight; each record carries the ``policy_version`` it was routed by.

Limits (:class:`~execution.metering.endpoints.Limits`, issue 11 finding 5): at most ``max_connections``
connections at once (others are closed at once and counted as
``connections_refused``), request lines and header fields of at most
``max_header_bytes``, bodies of at most ``max_body_bytes`` (a larger
Content-Length is refused before anything is read) and at most
``max_buffered_bytes`` of bodies held at once; at most
``records_in_memory`` request records kept in memory (the record file has
them all, up to ``record_file_bytes``; past that, records are dropped and
counted in the totals' ``records_dropped``).

Caps (:class:`~execution.metering.caps.Caps`) are checked before each request is forwarded: once the
task's or the campaign's tokens or cost have reached a cap, further requests
are refused (403, counted). Under a cap the proxy meters one request at a
time (the others wait their turn), and a request in flight is not cut, so a
task ends at most one request above its cap. The campaign's spending is
shared through a :class:`~execution.metering.caps.FileCampaignCounter` on the spool (or any object
with the same ``read()``/``add()`` methods, e.g. one calling a web service).

What a proxy enforces is one :class:`~execution.metering.proxy_spec.ProxySpec`.
Use :func:`~execution.metering.proxy_thread.start_proxy` from plain threaded
code (the runner), or :class:`MeteringProxy` ``start()``/``stop()`` inside an
asyncio program.

The parts: routing (execution/metering/routing.py), header and body rewriting
(rewriting.py), caps (caps.py), credentials (credentials.py), the books
(ledger.py), the threaded start (proxy_thread.py).
"""
from __future__ import annotations

import asyncio
import datetime as dt
import os
import time
from typing import Any, Callable, Iterable

import aiohttp
from aiohttp import web
from yarl import URL

from execution.metering.caps import cap_refusal
from execution.metering.credentials import CredentialError
from execution.metering.endpoints import Endpoint
from execution.metering.ledger import Ledger
from execution.metering.proxy_spec import ProxySpec
from execution.metering.rewriting import (UNMETERED_PATH, UsageChunkHider, downstream_headers, prepare_body,
                                          stream_back, upstream_headers)
from execution.metering.routing import Refusal, route
from execution.metering.routing import registration as registration_of
from execution.metering.usage import Usage, api_for_path, estimate_request_input_tokens
from execution.metering.usage_readers import ResponseUsageReader

__all__ = ["MeteringProxy", "REFUSED_HEADER"]

#: The header of every answer the proxy gives itself, naming the refusal's reason.
REFUSED_HEADER = "x-tco-proxy-refused"


def _iso(moment: dt.datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class MeteringProxy:
    """The proxy (module doc), enforcing ``spec`` (a :class:`~execution.metering.proxy_spec.ProxySpec`).

    ``record_sink``: callable taking each record dict (called in the event loop; keep it
    quick; False back counts the record as dropped) or None.

    A record: ``at`` (UTC ISO), ``method``, ``path``, ``endpoint``,
    ``status`` (None if no answer), ``refused`` (reason or None),
    ``model_requested``, ``model_returned``, ``stream``, ``usage``
    (:meth:`Usage.to_dict` or None), ``cost_usd`` (text or None),
    ``priced_as``, ``ttfb_ms``, ``latency_ms``, ``complete``,
    ``client_disconnected``, ``include_usage_added``, ``flags``, ``credential``
    (the name of the :class:`RegisteredEndpoint` whose credential was added, or None),
    ``policy_version`` (the network policy version the request was routed by: 0 the launch
    policy, then each :meth:`replace_endpoints`), ``response_id`` (the answer's ``id``, or None)
    ``finish_reasons`` (list of text: ``stop_reason``/``finish_reason``, empty if none came) and
    ``upstream`` (the base URL the endpoint forwards to, None when refused before routing).
    Only the newest :attr:`Limits.records_in_memory` records stay in :attr:`records`.
    """

    def __init__(self, spec: ProxySpec, record_sink: Callable[[dict], Any] | None = None) -> None:
        self.spec = spec
        # The routing rules in force and their version, swapped together by one assignment.
        self._rules: tuple[list[Endpoint], int] = (list(spec.endpoints), spec.policy_version)
        self.registered = spec.registered
        self.limits = spec.limits
        self.credentials = spec.credentials
        self.caps = spec.caps
        self.prices = spec.prices
        self.max_request_bytes = spec.body_limit
        self.ledger = Ledger(prices=spec.prices, campaign_counter=spec.caps.campaign_counter,
                             records_in_memory=spec.limits.records_in_memory, record_sink=record_sink)
        self._buffered = 0  # request body bytes held right now, all connections together
        self.buffered_high_water = 0
        self._timeout = aiohttp.ClientTimeout(total=None, connect=spec.connect_timeout_s,
                                              sock_read=spec.read_timeout_s)
        self._session: aiohttp.ClientSession | None = None
        self._runner: web.ServerRunner | None = None
        self.socket_path: str | None = None

    @property
    def records(self) -> list[dict]:
        """The newest request records (at most ``limits.records_in_memory``)."""
        return self.ledger.records

    @property
    def counts(self) -> dict[str, int]:
        """The counters of :meth:`totals` (execution/metering/ledger.py ``COUNTS``)."""
        return self.ledger.counts

    @property
    def buffered(self) -> int:
        """Request body bytes held right now, all connections together."""
        return self._buffered

    @property
    def endpoints(self) -> list[Endpoint]:
        """The endpoints new requests are routed by."""
        return self._rules[0]

    @property
    def policy_version(self) -> int:
        """The version of the network policy in force (0: the launch policy)."""
        return self._rules[1]

    def replace_endpoints(self, endpoints: Iterable[Endpoint], policy_version: int) -> None:
        """Route every request decided from now on by ``endpoints`` (network policy version
        ``policy_version``, an int). Requests already routed (in flight) keep the endpoint they
        were routed to and are not cut. Call it in the proxy's event loop (or through
        :meth:`ProxyHandle.replace_endpoints`). Raises ValueError for a version that is not an int."""
        if isinstance(policy_version, bool) or not isinstance(policy_version, int):
            raise ValueError(f"policy version {policy_version!r} is not an integer")
        self._rules = (list(endpoints), policy_version)

    # -- lifecycle

    async def start(self, socket_path: str | os.PathLike, mode: int = 0o600) -> None:
        """Listen on the Unix socket ``socket_path`` (a stale socket file is
        replaced) with permissions ``mode``. Raises OSError."""
        self.socket_path = os.fspath(socket_path)
        self._session = aiohttp.ClientSession(timeout=self._timeout, trust_env=False, auto_decompress=True)
        # Under a cap, one metered request at a time: a cap is checked against
        # what finished requests used, so parallel requests could each pass
        # the check and together overshoot without bound; one at a time, a
        # task ends at most one request past its cap.
        self._cap_lock = asyncio.Lock() if self.caps.any else None
        limits = self.limits
        server = _LimitedServer(self._serve, max_connections=limits.max_connections,
                                on_refused=self._connection_refused, handler_cancellation=True, access_log=None,
                                lingering_time=0,  # a refused body is never drained: the connection closes
                                max_line_size=limits.max_header_bytes, max_field_size=limits.max_header_bytes,
                                max_headers=limits.max_headers)
        self._runner = web.ServerRunner(server)
        await self._runner.setup()
        # At stop, requests still in flight get 5 s to end before they are cut (and recorded).
        await web.UnixSite(self._runner, self.socket_path, shutdown_timeout=5.0).start()
        os.chmod(self.socket_path, mode)

    async def stop(self) -> None:
        """Stop listening, close the upstream session and remove the socket."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self.socket_path and os.path.exists(self.socket_path):
            os.unlink(self.socket_path)

    def _connection_refused(self) -> None:
        self.ledger.counts["connections_refused"] += 1

    # -- totals

    def totals(self) -> dict:
        """Counts, token buckets and cost of everything so far
        (:meth:`execution.metering.ledger.Ledger.totals`)."""
        return self.ledger.totals()

    # -- the handler

    async def _serve(self, request: web.BaseRequest) -> web.StreamResponse:
        if self._cap_lock is None:
            return await self._handle(request)
        async with self._cap_lock:
            return await self._handle(request)

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        started = time.perf_counter()
        record: dict[str, Any] = {
            "at": _iso(dt.datetime.now(dt.timezone.utc)), "method": request.method,
            "path": request.raw_path[:2000], "endpoint": None, "status": None, "refused": None,
            "model_requested": None, "model_returned": None, "stream": False, "usage": None, "cost_usd": None,
            "priced_as": None, "ttfb_ms": None, "latency_ms": None, "complete": None, "client_disconnected": False,
            "include_usage_added": False, "flags": [], "credential": None,
            "response_id": None, "finish_reasons": [], "upstream": None,
        }
        endpoints, record["policy_version"] = self._rules
        self.counts["requests"] += 1
        decision = route(request.method, request.raw_path, request.headers, endpoints, self.registered)
        if isinstance(decision, Refusal):
            return self._refuse(record, decision, started, request)
        endpoint, target = decision
        record["endpoint"], record["path"], record["upstream"] = endpoint.name, target[:2000], endpoint.upstream
        try:
            body = await self._read_body(request)
        except _TooLarge:
            return self._refuse(record, Refusal("body_too_large", f"request body over {self.max_request_bytes} "
                                                                  "bytes", 413), started, request)
        except _Busy:
            return self._refuse(record, Refusal("proxy_busy", "too many request bodies are being received at "
                                                              "once; retry later", 503), started, request)
        api = api_for_path(target)
        request_obj, body, hide_usage = prepare_body(body, api, record)
        refusal = await cap_refusal(self.caps, self.ledger.bill, self.prices, record["model_requested"], api)
        if refusal is not None:
            return self._refuse(record, refusal, started, request)
        registration = registration_of(endpoint, target, self.registered)
        if isinstance(registration, Refusal):
            return self._refuse(record, registration, started, request)
        record["credential"] = registration.name if registration is not None else None
        try:
            secret = self.credentials.resolve(registration.credential_name) if registration is not None else None
        except CredentialError as exc:
            return self._refuse(record, Refusal("credential_unavailable", str(exc), 503), started, request)
        headers = upstream_headers(request.headers, endpoint, secret,
                                   registration.provider if registration is not None else None)
        url = URL(endpoint.upstream.rstrip("/") + target, encoded=True)
        self.counts["forwarded"] += 1
        reader: ResponseUsageReader | None = None
        upstream_ref: aiohttp.ClientResponse | None = None
        upstream_done = False
        client_gone = False
        maybe_billed = True  # False only when the request provably never reached the upstream
        response: web.StreamResponse | None = None
        try:
            assert self._session is not None, "proxy not started"
            async with self._session.request(request.method, url, headers=headers, data=body,
                                             allow_redirects=False) as upstream:
                upstream_ref = upstream
                record["ttfb_ms"] = round((time.perf_counter() - started) * 1000, 3)
                record["status"] = upstream.status
                if upstream.status == 429:
                    self.counts["rate_limited"] += 1
                elif upstream.status >= 500:
                    self.counts["upstream_errors"] += 1
                if 200 <= upstream.status < 300 and not UNMETERED_PATH.search(target.split("?", 1)[0]):
                    reader = ResponseUsageReader(upstream.headers.get("content-type"), api, request_obj)
                    record["stream"] = reader.streaming
                hider = UsageChunkHider() if hide_usage and reader is not None and reader.streaming else None
                response = web.StreamResponse(status=upstream.status, reason=upstream.reason,
                                              headers=downstream_headers(upstream.headers, hider is not None))
                try:
                    await response.prepare(request)
                    client_gone = await stream_back(upstream, response, reader, hider)
                    upstream_done = not client_gone
                except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError, asyncio.TimeoutError):
                    # The upstream cut its answer: recorded as incomplete below; the agent's
                    # connection is closed after what it got, so it sees the answer end early.
                    response.force_close()
                    return response
                if client_gone:
                    upstream.close()  # stop generation (and billing) now, not at the next read
                else:
                    try:
                        await response.write_eof()
                    except ConnectionError:
                        client_gone = True
        except asyncio.CancelledError:
            client_gone = True  # the agent disconnected; aiohttp cancelled this handler
            if upstream_ref is not None:
                upstream_ref.close()
            raise
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            if response is None or not response.prepared:
                maybe_billed = not isinstance(exc, aiohttp.ClientConnectorError)
                self.counts["upstream_errors"] += 1
                record["error"] = f"{type(exc).__name__}: {exc}"[:500]
                response = web.json_response(
                    {"type": "error", "error": {"type": "api_error",
                                                "message": "tco metering proxy: the model API could not be "
                                                           f"reached ({type(exc).__name__})"}}, status=502)
                record["status"] = 502
        finally:
            self._finish_record(record, reader, request_obj, api, upstream_done, client_gone, started,
                                maybe_billed and record["status"] in (None, 502) and reader is None)
        return response

    async def _read_body(self, request: web.BaseRequest) -> bytes:
        """The whole body, within :attr:`Limits.max_body_bytes` (a larger Content-Length is
        refused before reading) and the shared :attr:`Limits.max_buffered_bytes`."""
        if request.content_length is not None and request.content_length > self.max_request_bytes:
            raise _TooLarge()
        parts, size = [], 0
        try:
            while True:
                chunk = await request.content.readany()
                if not chunk:
                    return b"".join(parts)
                size += len(chunk)
                self._buffered += len(chunk)
                self.buffered_high_water = max(self.buffered_high_water, self._buffered)
                if size > self.max_request_bytes:
                    raise _TooLarge()
                if self._buffered > self.limits.max_buffered_bytes:
                    raise _Busy()
                parts.append(chunk)
        finally:
            self._buffered -= size

    def _refuse(self, record: dict, refusal: Refusal, started: float,
                request: web.BaseRequest | None = None) -> web.Response:
        self.ledger.refused(refusal.reason)
        record.update(status=refusal.status, refused=refusal.reason,
                      latency_ms=round((time.perf_counter() - started) * 1000, 3))
        self.ledger.emit(record)
        response = web.json_response(
            {"type": "error",
             "error": {"type": "permission_error" if refusal.status == 403 else "api_error",
                       "message": f"tco metering proxy: {refusal.message}"},
             "tco_proxy": {"refused": refusal.reason}},
            status=refusal.status, headers={REFUSED_HEADER: refusal.reason})
        if refusal.reason in ("connect", "upgrade", "body_too_large", "proxy_busy") \
                or (request is not None and not request.content.at_eof()):
            response.force_close()  # never drain what the agent still sends
        return response


    def _finish_record(self, record: dict, reader: ResponseUsageReader | None, request_obj: Any, api: str | None,
                       upstream_done: bool, client_gone: bool, started: float, unanswered: bool) -> None:
        """Usage, price, totals and the sink; synchronous, so it also runs in a cancelled handler."""
        record["latency_ms"] = round((time.perf_counter() - started) * 1000, 3)
        record["client_disconnected"] = client_gone
        usage: Usage | None = None
        if reader is not None:
            usage = reader.finish(transport_complete=upstream_done and not client_gone)
            record["response_id"], record["finish_reasons"] = reader.response_id, reader.finish_reasons
        elif unanswered:
            # Sent but never answered (the agent left, or the upstream failed, before the headers):
            # the model may still bill the input, so it is estimated and flagged rather than dropped.
            usage = Usage(api=api, input_tokens=estimate_request_input_tokens(request_obj), complete=False,
                          flags=["usage_missing", "output_estimated", "incomplete"])
        if client_gone:
            self.ledger.counts["client_disconnected"] += 1
        self.ledger.settle(record, usage)


class _TooLarge(Exception):
    pass


class _Busy(Exception):
    pass


class _LimitedServer(web.Server):
    """aiohttp's low-level server, closing connections past ``max_connections`` at once."""

    def __init__(self, handler: Any, *, max_connections: int, on_refused: Callable[[], None], **kwargs: Any) -> None:
        super().__init__(handler, **kwargs)
        self.max_connections = max_connections
        self.on_refused = on_refused

    def connection_made(self, handler: Any, transport: asyncio.Transport) -> None:
        super().connection_made(handler, transport)
        if len(self._connections) > self.max_connections:
            self.on_refused()
            transport.abort()

