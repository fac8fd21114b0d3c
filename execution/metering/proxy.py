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
   together would pass :attr:`Limits.max_buffered_bytes`) and
   ``credential_unavailable`` (503). An origin-form request goes to the
   endpoint whose allowing rule is the most specific (an exact path before a
   glob, then the longer literal prefix, then an exact method; on a tie, an
   endpoint whose destination is registered, then policy order); an
   absolute-form one only to an endpoint with that host and port.
2. Forwards it to the endpoint's upstream base URL: client credential headers
   (``authorization``, ``x-api-key``, ``api-key``, ``x-goog-api-key``,
   ``cookie``, ``proxy-authorization``) and hop-by-hop headers are dropped.
   A credential is added only when the request's destination (scheme, host,
   port and path prefix of the upstream URL) is a model endpoint the site's
   admins registered (:class:`RegisteredEndpoint`; the most specific one
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
   feeding it to the usage reader (execution/metering/usage.py). Usage is read
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

Limits (:class:`Limits`, issue 11 finding 5): at most ``max_connections``
connections at once (others are closed at once and counted as
``connections_refused``), request lines and header fields of at most
``max_header_bytes``, bodies of at most ``max_body_bytes`` (a larger
Content-Length is refused before anything is read) and at most
``max_buffered_bytes`` of bodies held at once; at most
``records_in_memory`` request records kept in memory (the record file has
them all, up to ``record_file_bytes``; past that, records are dropped and
counted in the totals' ``records_dropped``).

Caps (:class:`Caps`) are checked before each request is forwarded: once the
task's or the campaign's tokens or cost have reached a cap, further requests
are refused (403, counted). Under a cap the proxy meters one request at a
time (the others wait their turn), and a request in flight is not cut, so a
task ends at most one request above its cap. The campaign's spending is
shared through a :class:`FileCampaignCounter` on the spool (or any object
with the same ``read()``/``add()`` methods, e.g. one calling a web service).

Use :func:`start_proxy` from plain threaded code (the runner), or
:class:`MeteringProxy` ``start()``/``stop()`` inside an asyncio program.
"""
from __future__ import annotations

import asyncio
import datetime as dt
import fcntl
import json
import os
import re
import threading
import time
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Callable, Iterable, Mapping, Protocol

import aiohttp
from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

from execution.metering.endpoints import (MAX_REQUEST_BYTES, Endpoint, Limits, RegisteredEndpoint, Rule,  # noqa: F401
                                          _is_loopback, _unsafe_path, endpoints_from_policy,
                                          registered_endpoints)
from execution.metering.prices import BillTotals, PriceTable, format_usd
from execution.metering.usage import (API_CHAT, ResponseUsageReader, Usage, api_for_path,
                                   estimate_request_input_tokens)

__all__ = ["Rule", "Endpoint", "endpoints_from_policy", "RegisteredEndpoint", "registered_endpoints", "Limits", "CredentialResolver", "CredentialError", "Caps",
           "CampaignCounter", "FileCampaignCounter", "JsonlRecordSink", "MeteringProxy", "ProxyHandle",
           "start_proxy"]

HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection",
                        "te", "trailer", "trailers", "transfer-encoding", "upgrade"})
CLIENT_CREDENTIAL_HEADERS = frozenset({"authorization", "x-api-key", "api-key", "x-goog-api-key", "cookie",
                                       "proxy-authorization"})
# Endpoints that generate nothing and bill nothing (Anthropic token counting, model lists): their
# answers carry no usage, and metering them would only add usage_missing estimates to the bill.
UNMETERED_PATH = re.compile(r"/(count_tokens|models)(/[^/]*)?\Z")
REFUSED_HEADER = "x-tco-proxy-refused"


# ------------------------------------------------------------- credentials


class CredentialError(RuntimeError):
    """A credential is not configured, or its file/variable is missing or empty."""


class CredentialResolver:
    """Credentials by name, read by the proxy (outside the sandbox). The proxy asks only
    for the ``credential_name`` of a :class:`RegisteredEndpoint`.

    ``sources`` maps a credential name (``anthropic-prod``) to ``file:/path`` (the file's
    content, stripped) or ``env:NAME`` (the runner's environment, read at the
    first request; the runner must not pass that variable to the agent).
    Values are cached in memory and never logged or recorded.
    """

    def __init__(self, sources: Mapping[str, str]) -> None:
        for provider, source in sources.items():
            if not (source.startswith("file:") or source.startswith("env:")):
                raise ValueError(f"credential {provider}: expected 'file:/path' or 'env:NAME'")
        self._sources = dict(sources)
        self._cache: dict[str, str] = {}

    def resolve(self, provider: str) -> str:
        """The secret named ``provider`` (a credential name). Raises CredentialError."""
        if provider in self._cache:
            return self._cache[provider]
        source = self._sources.get(provider)
        if source is None:
            raise CredentialError(f"no credential configured for provider {provider!r}")
        kind, _, where = source.partition(":")
        if kind == "file":
            try:
                with open(where, encoding="utf-8") as fh:
                    value = fh.read().strip()
            except OSError as exc:
                raise CredentialError(f"credential {provider}: cannot read its file: {exc.strerror}") from None
        else:
            value = os.environ.get(where, "").strip()
        if not value:
            raise CredentialError(f"credential {provider}: empty or missing")
        self._cache[provider] = value
        return value


# ------------------------------------------------------------------- caps


class CampaignCounter(Protocol):
    """Tokens and USD a whole campaign has spent, shared by its tasks' proxies."""

    def read(self) -> tuple[int, Decimal]: ...

    def add(self, tokens: int, cost_usd: Decimal) -> tuple[int, Decimal]: ...


class CampaignCounterError(RuntimeError):
    """The campaign counter file exists but cannot be read."""


class FileCampaignCounter:
    """A campaign's spending in a JSON file ``{"tokens": int, "cost_usd": "decimal"}``
    on the shared spool. Every access holds a POSIX lock (``fcntl.lockf``,
    which NFS supports through its lock manager) on ``<path>.lock``; updates
    replace the file atomically (temp file, fsync, rename), so a crash never
    leaves a half-written count. A missing file counts as zero; an unreadable
    one raises CampaignCounterError."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = os.fspath(path)

    def _locked(self):
        fd = os.open(self.path + ".lock", os.O_RDWR | os.O_CREAT, 0o660)
        fcntl.lockf(fd, fcntl.LOCK_EX)
        return fd

    def _load(self) -> tuple[int, Decimal]:
        try:
            with open(self.path, encoding="utf-8") as fh:
                data = json.load(fh)
            return int(data["tokens"]), Decimal(str(data["cost_usd"]))
        except FileNotFoundError:
            return 0, Decimal(0)
        except (ValueError, KeyError, TypeError, ArithmeticError) as exc:
            raise CampaignCounterError(f"{self.path}: unreadable campaign counter: {exc}") from exc

    def read(self) -> tuple[int, Decimal]:
        """``(tokens, cost_usd)`` spent so far."""
        fd = self._locked()
        try:
            return self._load()
        finally:
            os.close(fd)  # closing releases the lock

    def add(self, tokens: int, cost_usd: Decimal) -> tuple[int, Decimal]:
        """Add one request's tokens and cost; returns the new totals."""
        fd = self._locked()
        try:
            total_tokens, total_cost = self._load()
            total_tokens += int(tokens)
            total_cost += cost_usd
            tmp = f"{self.path}.{os.getpid()}.tmp"
            with open(tmp, "w", encoding="utf-8") as fh:
                json.dump({"tokens": total_tokens, "cost_usd": format_usd(total_cost)}, fh)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.path)
            return total_tokens, total_cost
        finally:
            os.close(fd)


@dataclass
class Caps:
    """Limits checked before each request; None: no limit. Tokens are all
    disjoint buckets together; costs are USD (Decimal) and need a price table.
    ``campaign_counter`` is required for the campaign caps."""

    task_tokens: int | None = None
    task_cost_usd: Decimal | None = None
    campaign_tokens: int | None = None
    campaign_cost_usd: Decimal | None = None
    campaign_counter: CampaignCounter | None = None

    @property
    def has_cost_cap(self) -> bool:
        return self.task_cost_usd is not None or self.campaign_cost_usd is not None

    @property
    def any(self) -> bool:
        """Whether any cap is set."""
        return any(v is not None for v in (self.task_tokens, self.task_cost_usd, self.campaign_tokens,
                                           self.campaign_cost_usd))


# ----------------------------------------------------------------- records


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
class _Refusal:
    reason: str
    message: str
    status: int = 403


def _iso(moment: dt.datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class _UsageChunkHider:
    """Drop the ``data:`` line of the OpenAI usage chunk (empty ``choices``,
    ``usage`` set) from a stream the agent did not ask usage for; forward every
    other line unchanged. Works on whole lines, so a line split across reads
    is held until complete (events are dispatched at blank lines anyway)."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, chunk: bytes) -> bytes:
        self._buf += chunk
        # A CR ending this read may be half of a CRLF; forwarding it now is harmless, its LF
        # then comes alone as an empty line, which the agent's decoder joins to it.
        cut = max(self._buf.rfind(b"\n"), self._buf.rfind(b"\r"))
        if cut < 0:
            return b""
        complete = bytes(self._buf[:cut + 1])
        del self._buf[:cut + 1]
        return b"".join(line for line in complete.splitlines(keepends=True) if not self._is_usage_line(line))

    def close(self) -> bytes:
        rest = bytes(self._buf)
        self._buf.clear()
        return b"" if self._is_usage_line(rest) else rest

    @staticmethod
    def _is_usage_line(line: bytes) -> bool:
        if not line.startswith(b"data:") or b'"usage"' not in line:
            return False
        try:
            obj = json.loads(line[5:])
        except ValueError:
            return False
        return isinstance(obj, dict) and obj.get("choices") == [] and isinstance(obj.get("usage"), dict)


# ------------------------------------------------------------------- proxy


class MeteringProxy:
    """The proxy (module doc).

    ``endpoints``: :class:`Endpoint` list (see :func:`endpoints_from_policy`);
    ``credentials``: a :class:`CredentialResolver` (or its ``sources``
    mapping); ``caps``: :class:`Caps` or None; ``record_sink``: callable
    taking each record dict (called in the event loop; keep it quick) or
    None; ``prices``: :class:`~execution.metering.prices.PriceTable` for costs
    (None: costs are not computed and usage is flagged ``unpriced_model``).
    Raises ValueError if a cost cap is set without prices or a campaign cap
    without a counter.

    A record: ``at`` (UTC ISO), ``method``, ``path``, ``endpoint``,
    ``status`` (None if no answer), ``refused`` (reason or None),
    ``model_requested``, ``model_returned``, ``stream``, ``usage``
    (:meth:`Usage.to_dict` or None), ``cost_usd`` (text or None),
    ``priced_as``, ``ttfb_ms``, ``latency_ms``, ``complete``,
    ``client_disconnected``, ``include_usage_added``, ``flags``, ``credential``
    (the name of the :class:`RegisteredEndpoint` whose credential was added, or None),
    ``policy_version`` (the network policy version the request was routed by: 0 the launch
    policy, then each :meth:`replace_endpoints`).
    Only the newest :attr:`Limits.records_in_memory` records stay in :attr:`records`.
    """

    def __init__(self, endpoints: Iterable[Endpoint], credentials: CredentialResolver | Mapping[str, str],
                 caps: Caps | None = None, record_sink: Callable[[dict], Any] | None = None,
                 prices: PriceTable | None = None, *, max_request_bytes: int | None = None,
                 registered: Iterable[RegisteredEndpoint] = (), limits: Limits | None = None,
                 connect_timeout_s: float = 30.0, read_timeout_s: float = 600.0, policy_version: int = 0) -> None:
        # The routing rules in force and their version, swapped together by one assignment.
        self._rules: tuple[list[Endpoint], int] = (list(endpoints), policy_version)
        self.registered = list(registered)
        self.limits = limits or Limits()
        self.credentials = credentials if isinstance(credentials, CredentialResolver) \
            else CredentialResolver(credentials)
        self.caps = caps or Caps()
        if self.caps.has_cost_cap and prices is None:
            raise ValueError("a cost cap needs a price table")
        if (self.caps.campaign_tokens is not None or self.caps.campaign_cost_usd is not None) \
                and self.caps.campaign_counter is None:
            raise ValueError("a campaign cap needs a campaign counter")
        self.record_sink = record_sink
        self.prices = prices
        self.max_request_bytes = max_request_bytes or self.limits.max_body_bytes
        self._buffered = 0  # request body bytes held right now, all connections together
        self.buffered_high_water = 0
        self._timeout = aiohttp.ClientTimeout(total=None, connect=connect_timeout_s, sock_read=read_timeout_s)
        self.records: list[dict] = []
        self.bill = BillTotals()
        self.counts = {"requests": 0, "forwarded": 0, "refused": 0, "rate_limited": 0, "upstream_errors": 0,
                       "incomplete": 0, "client_disconnected": 0, "connections_refused": 0, "records_dropped": 0}
        self.refused_by_reason: dict[str, int] = {}
        self.flag_counts: dict[str, int] = {}
        self._session: aiohttp.ClientSession | None = None
        self._runner: web.ServerRunner | None = None
        self.socket_path: str | None = None

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
        self.counts["connections_refused"] += 1

    # -- totals

    def totals(self) -> dict:
        """Counts, token buckets and cost of everything so far: ``requests``,
        ``forwarded``, ``refused``, ``refused_by_reason``, ``rate_limited``,
        ``upstream_errors``, ``incomplete``, ``client_disconnected``,
        ``connections_refused`` (over the connection limit), ``records_dropped``
        (not written: the record file reached its size cap), the
        buckets of :class:`~execution.metering.prices.BillTotals` (``cost_usd``
        text of the priced part, ``unpriced_tokens``, ``unpriced_models``) and
        ``flags`` (flag -> number of requests). ``cost_usd`` is None when no
        price table is configured."""
        bill = self.bill.to_dict()
        if self.prices is None:
            bill["cost_usd"] = None
        return {**self.counts, "refused_by_reason": dict(self.refused_by_reason), **bill,
                "flags": dict(self.flag_counts)}

    # -- decisions

    def _route(self, method: str, target: str, headers: Mapping[str, str],
               endpoints: list[Endpoint] | None = None) -> tuple[Endpoint, str] | _Refusal:
        endpoints = self.endpoints if endpoints is None else endpoints
        if method == "CONNECT":
            return _Refusal("connect", "CONNECT is refused: a tunnel cannot be metered; send plain HTTP "
                                       "requests to the proxy base URL")
        if "upgrade" in headers:
            return _Refusal("upgrade", "protocol upgrades (WebSocket) are refused")
        candidates = endpoints
        if not target.startswith("/"):
            url = URL(target, encoded=True) if "://" in target else None
            if url is None or url.scheme not in ("http", "https") or not url.host:
                return _Refusal("bad_path", f"request target {target[:200]!r} is not a path")
            port = url.explicit_port or (443 if url.scheme == "https" else 80)
            candidates = [e for e in endpoints if e.host.lower() == url.host.lower() and e.port == port]
            if not candidates:
                return _Refusal("host_not_allowed", f"{url.host}:{port} is not an endpoint of the sandbox policy")
            target = url.raw_path_qs
        path = target.split("?", 1)[0]
        if _unsafe_path(path):
            return _Refusal("bad_path", f"path {path[:200]!r} is refused (dot segments, '//' or encoded separators)")
        # The most specific allowing rule wins, never simply the first endpoint listed.
        best: tuple | None = None
        for index, endpoint in enumerate(candidates):
            score = endpoint.specificity(method, path)
            if score is None:
                continue
            registered = self._registration(endpoint, target) is not None
            key = (score, registered, -index)
            if best is None or key > best[0]:
                best = (key, endpoint)
        if best is not None:
            return best[1], target
        return _Refusal("not_in_policy", f"{method} {path[:200]} is not allowed by the sandbox policy")

    def _registration(self, endpoint: Endpoint, target: str) -> RegisteredEndpoint | _Refusal | None:
        """The registered endpoint whose credential a request to ``endpoint`` at ``target``
        carries: the most specific registration covering its upstream URL, if the policy
        endpoint binds a credential at all; None (no credential); a refusal when two
        registrations naming different credentials match equally."""
        if not endpoint.credential or not self.registered:
            return None
        url = URL(endpoint.upstream.rstrip("/") + target, encoded=True)
        scored = [(r.match(url), r) for r in self.registered]
        scored = [(score, r) for score, r in scored if score >= 0]
        if not scored:
            return None
        top = max(score for score, _ in scored)
        best = [r for score, r in scored if score == top]
        if len({r.credential_name for r in best}) > 1:
            return _Refusal("credential_unavailable", "two registered model endpoints match this destination "
                                                      "equally; the site's registrations must be fixed", 503)
        return best[0]

    async def _cap_refusal(self, requested_model: str | None, api: str | None) -> _Refusal | None:
        caps = self.caps
        if caps.task_tokens is not None and self.bill.total_tokens >= caps.task_tokens:
            return _Refusal("task_token_cap", f"the task reached its cap of {caps.task_tokens} tokens")
        if caps.task_cost_usd is not None and self.bill.cost_usd >= caps.task_cost_usd:
            return _Refusal("task_cost_cap", f"the task reached its cap of {caps.task_cost_usd} USD")
        if caps.has_cost_cap and self.prices is not None and api is not None:
            name, _ = self.prices.resolve(None, requested_model)
            if name is None:
                return _Refusal("unpriced_model_under_cost_cap",
                                f"model {requested_model!r} has no price, so a cost cap cannot be enforced")
        if caps.campaign_counter is not None and (caps.campaign_tokens is not None
                                                  or caps.campaign_cost_usd is not None):
            try:
                tokens, cost = await asyncio.to_thread(caps.campaign_counter.read)
            except (OSError, CampaignCounterError) as exc:
                return _Refusal("campaign_counter_unreadable", f"campaign spending unknown: {exc}")
            if caps.campaign_tokens is not None and tokens >= caps.campaign_tokens:
                return _Refusal("campaign_token_cap", f"the campaign reached its cap of {caps.campaign_tokens} tokens")
            if caps.campaign_cost_usd is not None and cost >= caps.campaign_cost_usd:
                return _Refusal("campaign_cost_cap", f"the campaign reached its cap of {caps.campaign_cost_usd} USD")
        return None

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
        }
        endpoints, record["policy_version"] = self._rules
        self.counts["requests"] += 1
        decision = self._route(request.method, request.raw_path, request.headers, endpoints)
        if isinstance(decision, _Refusal):
            return self._refuse(record, decision, started, request)
        endpoint, target = decision
        record["endpoint"], record["path"] = endpoint.name, target[:2000]
        try:
            body = await self._read_body(request)
        except _TooLarge:
            return self._refuse(record, _Refusal("body_too_large", f"request body over {self.max_request_bytes} "
                                                                   "bytes", 413), started, request)
        except _Busy:
            return self._refuse(record, _Refusal("proxy_busy", "too many request bodies are being received at "
                                                               "once; retry later", 503), started, request)
        api = api_for_path(target)
        request_obj, body, hide_usage = self._prepare_body(body, api, record)
        refusal = await self._cap_refusal(record["model_requested"], api)
        if refusal is not None:
            return self._refuse(record, refusal, started, request)
        registration = self._registration(endpoint, target)
        if isinstance(registration, _Refusal):
            return self._refuse(record, registration, started, request)
        record["credential"] = registration.name if registration is not None else None
        try:
            secret = self.credentials.resolve(registration.credential_name) if registration is not None else None
        except CredentialError as exc:
            return self._refuse(record, _Refusal("credential_unavailable", str(exc), 503), started, request)
        headers = self._upstream_headers(request.headers, endpoint, secret,
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
                hider = _UsageChunkHider() if hide_usage and reader is not None and reader.streaming else None
                response = web.StreamResponse(status=upstream.status, reason=upstream.reason,
                                              headers=self._downstream_headers(upstream.headers, hider is not None))
                try:
                    await response.prepare(request)
                    client_gone = await self._pump(upstream, response, reader, hider)
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

    async def _pump(self, upstream: aiohttp.ClientResponse, response: web.StreamResponse,
                    reader: ResponseUsageReader | None, hider: _UsageChunkHider | None) -> bool:
        """Copy upstream to the agent as it arrives. Returns True if the agent went away."""
        async for chunk in upstream.content.iter_any():
            if reader is not None:
                reader.feed(chunk)
            out = hider.feed(chunk) if hider is not None else chunk
            if not out:
                continue
            try:
                await response.write(out)
            except ConnectionError:
                return True
        if hider is not None:
            rest = hider.close()
            if rest:
                try:
                    await response.write(rest)
                except ConnectionError:
                    return True
        return False

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

    def _prepare_body(self, body: bytes, api: str | None, record: dict) -> tuple[Any, bytes, bool]:
        """Parse the request JSON (model, stream); add include_usage to an
        OpenAI chat stream. Returns (parsed or None, body to send, hide usage chunk)."""
        try:
            obj = json.loads(body) if body else None
        except ValueError:
            return None, body, False
        if not isinstance(obj, dict):
            return obj, body, False
        if isinstance(obj.get("model"), str):
            record["model_requested"] = obj["model"]
        if api == API_CHAT and obj.get("stream") is True:
            options = obj.get("stream_options")
            asked = isinstance(options, dict) and options.get("include_usage") is True
            if not asked:
                obj["stream_options"] = {**(options if isinstance(options, dict) else {}), "include_usage": True}
                record["include_usage_added"] = True
                return obj, json.dumps(obj).encode("utf-8"), True
        return obj, body, False

    @staticmethod
    def _upstream_headers(incoming: Mapping[str, str], endpoint: Endpoint, secret: str | None,
                          provider: str | None = None) -> CIMultiDict:
        headers: CIMultiDict = CIMultiDict()
        connection_named = {t.strip().lower() for t in incoming.get("connection", "").split(",") if t.strip()}
        for name, value in incoming.items():
            low = name.lower()
            if low in HOP_BY_HOP or low in CLIENT_CREDENTIAL_HEADERS or low in connection_named \
                    or low in ("host", "content-length", "accept-encoding", "expect"):
                continue
            headers.add(name, value)
        headers["accept-encoding"] = "identity"
        if secret is not None:
            headers.update(endpoint.credential_headers(secret, provider))
        return headers

    @staticmethod
    def _downstream_headers(upstream: Mapping[str, str], rewritten: bool) -> CIMultiDict:
        headers: CIMultiDict = CIMultiDict()
        encoded = upstream.get("content-encoding", "identity").lower() not in ("", "identity")
        for name, value in upstream.items():
            low = name.lower()
            if low in HOP_BY_HOP:
                continue
            # aiohttp decompressed the body, or the hider shortened it: the length no longer holds.
            if low == "content-length" and (encoded or rewritten):
                continue
            if low == "content-encoding" and encoded:
                continue
            headers.add(name, value)
        return headers

    def _refuse(self, record: dict, refusal: _Refusal, started: float,
                request: web.BaseRequest | None = None) -> web.Response:
        self.counts["refused"] += 1
        self.refused_by_reason[refusal.reason] = self.refused_by_reason.get(refusal.reason, 0) + 1
        record.update(status=refusal.status, refused=refusal.reason,
                      latency_ms=round((time.perf_counter() - started) * 1000, 3))
        self._emit(record)
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
        elif unanswered:
            # Sent but never answered (the agent left, or the upstream failed, before the headers):
            # the model may still bill the input, so it is estimated and flagged rather than dropped.
            usage = Usage(api=api, input_tokens=estimate_request_input_tokens(request_obj), complete=False,
                          flags=["usage_missing", "output_estimated", "incomplete"])
        if client_gone:
            self.counts["client_disconnected"] += 1
        if usage is not None:
            record["usage"] = usage.to_dict()
            record["model_returned"] = usage.model
            record["complete"] = usage.complete
            flags = list(usage.flags)
            price = None
            if self.prices is not None:
                at = dt.datetime.fromisoformat(record["at"].replace("Z", "+00:00"))
                price = self.prices.price(usage, record["model_requested"], at=at)
                record["cost_usd"], record["priced_as"] = price.cost_text, price.priced_as
                flags += [f for f in price.flags if f not in flags]
            elif "unpriced_model" not in flags:
                flags.append("unpriced_model")
            record["flags"] = flags
            if not usage.complete:
                self.counts["incomplete"] += 1
            for flag in flags:
                self.flag_counts[flag] = self.flag_counts.get(flag, 0) + 1
            self.bill.add(usage, price, record["model_requested"])
            counter = self.caps.campaign_counter
            if counter is not None and usage.total_tokens:
                cost = price.cost_usd if price is not None and price.cost_usd is not None else Decimal(0)
                try:
                    counter.add(usage.total_tokens, cost)
                except (OSError, CampaignCounterError) as exc:
                    record["error"] = f"campaign counter not updated: {exc}"[:500]
        self._emit(record)

    def _emit(self, record: dict) -> None:
        self.records.append(record)
        if len(self.records) > self.limits.records_in_memory:
            del self.records[:len(self.records) - self.limits.records_in_memory]
        if self.record_sink is not None and self.record_sink(record) is False:
            self.counts["records_dropped"] += 1


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


# ---------------------------------------------------------- threaded start


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


def start_proxy(socket_path: str | os.PathLike, endpoints: Iterable[Endpoint] | Mapping[str, Any],
                credentials: CredentialResolver | Mapping[str, str], *, caps: Caps | None = None,
                prices: PriceTable | None = None, record_sink: Callable[[dict], Any] | None = None,
                record_path: str | os.PathLike | None = None, upstreams: Mapping[str, str] | None = None,
                registered: Iterable[RegisteredEndpoint] = (), limits: Limits | None = None,
                socket_mode: int = 0o600, ready_timeout_s: float = 10.0, policy_version: int = 0) -> ProxyHandle:
    """Start a :class:`MeteringProxy` on ``socket_path`` in a daemon thread
    with its own event loop, for a plain (non-asyncio) program such as the
    runner; returns once it listens. ``endpoints``: a list of
    :class:`Endpoint` or a parsed sandbox policy (:func:`endpoints_from_policy`,
    with ``upstreams``); ``record_path``: append records as JSON lines there
    (besides ``record_sink``), up to ``limits.record_file_bytes``;
    ``registered``: the only destinations that get a credential
    (:class:`RegisteredEndpoint`); ``limits``: :class:`Limits`; ``policy_version``: the network
    policy version of ``endpoints`` (0: the launch policy). Raises the start error (OSError, ValueError)
    in the caller's thread. Stop with :meth:`ProxyHandle.stop`."""
    if isinstance(endpoints, Mapping):
        endpoints = endpoints_from_policy(endpoints, upstreams)
    limits = limits or Limits()
    sinks: list[Callable[[dict], Any]] = [s for s in (record_sink,) if s is not None]
    closers: list[Callable[[], None]] = []
    if record_path is not None:
        jsonl = JsonlRecordSink(record_path, limits.record_file_bytes)
        sinks.append(jsonl)
        closers.append(jsonl.close)

    def sink(record: dict) -> bool:
        kept = True
        for each in sinks:
            kept = each(record) is not False and kept
        return kept

    proxy = MeteringProxy(endpoints, credentials, caps, sink if sinks else None, prices,
                          registered=registered, limits=limits, policy_version=policy_version)
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
