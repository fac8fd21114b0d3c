"""The task's metering proxy: its settings from the spec, and starting it when the agent wants it.

See docs/runner.md ("The runner spec": credentials; "The metering proxy").
aiohttp (execution/metering/proxy.py) is imported only when the proxy starts,
at the agent's first model request: reading and checking the endpoints here
needs only execution/metering/endpoints.py (issue 15, integration overhead).
"""
from __future__ import annotations

import dataclasses
import json
import os
import threading
from collections.abc import Mapping
from decimal import Decimal

from execution.metering.credentials import CredentialError, CredentialResolver
from execution.metering.endpoints import Limits, RegisteredEndpoint
from execution.runner.config import PROXY_LIMITS, PROXY_STOP_S, RunnerError, TaskIdentity, limit
from execution.runner.task import credentials_file


@dataclasses.dataclass(frozen=True)
class ProxyPlan:
    """What the task's proxy will enforce, worked out before the sandbox starts.

    ``policy``: the network part as the proxy takes it (``Policy.proxy_policy()``);
    ``upstreams``: ``"host:port"`` -> base URL; ``registered``: the only destinations that
    get a credential; ``credentials_file``: JSON ``{"name": "secret"}``; ``prices_file``: the
    price table's path or None; ``token_cap`` (tokens) / ``cost_cap`` (USD): per-task caps or
    None; ``limits``: the proxy's; ``policy_version``: the network policy version of ``policy``.
    """

    policy: Mapping
    upstreams: Mapping[str, str]
    registered: tuple[RegisteredEndpoint, ...]
    credentials_file: str
    prices_file: str | None
    token_cap: int | None
    cost_cap: Decimal | None
    limits: Limits
    policy_version: int = 0


def plan_proxy(spec: Mapping, policy, environ: Mapping[str, str], task: TaskIdentity, notes: list[str]) -> ProxyPlan:
    """The proxy's plan from the spec's model endpoints, caps and the policy. Appends to ``notes``
    (the record's sandbox notes; kept when it raises later) what the record says: ignored
    ``credentials``, policy endpoints that bind a credential but are not registered. Only
    registered endpoints ever get a credential (docs/runner.md). Raises RunnerError for a
    malformed endpoint, cap or limit, or a cost cap without a price table."""
    from urllib.parse import urlsplit

    from execution.metering.endpoints import registered_endpoints

    try:
        registered = registered_endpoints(spec.get("model_endpoints"))
    except ValueError as exc:
        raise RunnerError(f"runner spec: {exc}") from None
    upstreams: dict[str, str] = {}
    for entry in registered:
        upstreams.setdefault(f"{entry.host}:{entry.port}", f"{entry.scheme}://{entry.host}:{entry.port}")
    endpoint = spec.get("model_endpoint") or {}
    base_url, credential = endpoint.get("base_url"), endpoint.get("credential_name")
    if base_url is not None:
        parts = urlsplit(base_url) if isinstance(base_url, str) else None
        if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
            raise RunnerError(f"model_endpoint.base_url {base_url!r} is not an http(s) URL")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        matches = [e for r, e in policy.endpoints() if r.binaries and e.protocol == "rest"
                   and e.host and e.host.lower() == parts.hostname.lower() and port in e.ports]
        if not matches:
            raise RunnerError(f"model_endpoint.base_url {base_url}: {parts.hostname}:{port} is not a "
                              "protocol: rest endpoint of the sandbox policy")
        upstreams[f"{matches[0].host}:{port}"] = base_url.rstrip("/")
        if credential is not None:
            if not isinstance(credential, str) or not credential:
                raise RunnerError("model_endpoint.credential_name must be a name")
            registered.append(RegisteredEndpoint(
                name="model_endpoint", provider=None, scheme=parts.scheme, host=parts.hostname, port=port,
                path_prefixes=(parts.path.rstrip("/") or "/",), credential_name=credential))
    elif credential is not None:
        raise RunnerError("model_endpoint.credential_name needs model_endpoint.base_url")
    if spec.get("credentials"):
        notes.append("spec credentials: ignored; only registered model endpoints (model_endpoints) receive "
                     "a credential")
    notes += unregistered_notes(policy, registered, upstreams)
    token_cap, cost_cap = spec.get("token_cap"), spec.get("cost_cap_usd")
    if token_cap is not None and (isinstance(token_cap, bool) or not isinstance(token_cap, int) or token_cap < 1):
        raise RunnerError("runner spec: token_cap must be a positive number of tokens")
    if cost_cap is not None:
        from decimal import InvalidOperation

        try:
            cost_cap = Decimal(str(cost_cap))
        except InvalidOperation:
            raise RunnerError("runner spec: cost_cap_usd must be a decimal amount of USD") from None
        if not cost_cap.is_finite() or cost_cap <= 0:
            raise RunnerError("runner spec: cost_cap_usd must be a positive amount of USD")
    prices = environ.get("TCO_PRICES_FILE") or task.layout.prices_path
    prices = prices if os.path.isfile(prices) else None
    if cost_cap is not None and prices is None:
        raise RunnerError("runner spec: cost_cap_usd needs a price table (TCO_PRICES_FILE or "
                          "<spool>/prices.json)")
    limits = Limits(**{field: limit(environ, name) for name, field in PROXY_LIMITS.items()
                       if limit(environ, name) is not None})
    plan = ProxyPlan(policy=policy.proxy_policy(), upstreams=upstreams, registered=tuple(registered),
                     credentials_file=credentials_file(environ, task.spool), prices_file=prices,
                     token_cap=token_cap, cost_cap=cost_cap, limits=limits)
    return plan


def unregistered_notes(policy, registered: list, upstreams: dict[str, str]) -> list[str]:
    """A note for each policy endpoint that binds a credential but is no registered model
    endpoint: its requests carry none."""
    from urllib.parse import urlsplit

    notes = []
    for rule, e in policy.endpoints():
        if not (rule.binaries and e.credential_provider and e.protocol == "rest" and e.host and not e.wildcard):
            continue
        for port in e.ports:
            upstream = upstreams.get(f"{e.host}:{port}") or f"{'http' if e.loopback else 'https'}://{e.host}:{port}"
            parts = urlsplit(upstream)
            if not any(r.scheme == parts.scheme and r.host.lower() == (parts.hostname or "").lower()
                       and r.port == (parts.port or (443 if parts.scheme == "https" else 80)) for r in registered):
                notes.append(f"{e.where}: {e.host}:{port} is not a registered model endpoint: requests there "
                             "carry no credential (credential_binding never chooses one)")
    return notes


class NamedCredentials(CredentialResolver):
    """Credentials by name from the runner's credentials file (JSON ``{"name": "secret"}``,
    ``path``), read at the first request that needs one. The proxy asks only for names of
    registered model endpoints."""

    def __init__(self, path: str) -> None:
        super().__init__({})
        self.path = path
        self._secrets: dict[str, str] = {}

    def resolve(self, name: str) -> str:
        """The secret named ``name``. Raises CredentialError (file unreadable, name missing)."""
        if name in self._secrets:
            return self._secrets[name]
        try:
            with open(self.path, encoding="utf-8") as fh:
                table = json.load(fh)
        except (OSError, ValueError) as exc:
            raise CredentialError(f"credentials file unreadable: {type(exc).__name__}") from None
        value = table.get(name) if isinstance(table, dict) else None
        if not isinstance(value, str) or not value.strip():
            raise CredentialError(f"credential {name!r} is not in the credentials file")
        self._secrets[name] = value.strip()
        return self._secrets[name]


class ProxyStarter:
    """The task's proxy, started at most once in a thread (:meth:`start_soon`), listening on
    ``socket_path`` and recording requests to ``requests_path``. :attr:`lock` orders rule
    changes (:meth:`replace_rules`) against the start: the proxy starts with the rules in force.
    ``tracer``: the task's :class:`~execution.metering.otel.TaskTracer` (or None): each request
    record becomes a span too; ``started_at``: the runner's ``task_started_at`` (ISO).
    """

    def __init__(self, plan: ProxyPlan, *, socket_path: str, requests_path: str, tracer=None,
                 started_at: str | None = None) -> None:
        self.plan = plan
        self.tracer = tracer
        self.started_at = started_at
        self.socket_path = socket_path
        self.requests_path = requests_path
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None
        self.handle = None  # execution.metering.proxy_thread.ProxyHandle once it listens
        self.error: str | None = None
        self.stopped = False  # set by stop(): a start still importing then never listens

    @property
    def requests_file(self) -> str | None:
        """The request records' file (``requests_path``) if the proxy listened (it creates the file before
        it listens, even for no request); None if it never did: there were then no requests, and a record
        naming a file that does not exist would be quarantined whole, its stages and exit status with it
        (seen: a review agent on a host at load 112, its proxy still importing aiohttp after 30 s)."""
        return self.requests_path if self.handle is not None else None

    @property
    def started(self) -> bool:
        """Whether :meth:`start_soon` was called (the agent asked for its base URL)."""
        return self.thread is not None

    def start_soon(self) -> None:
        """The agent wants its base URL: start the proxy in a thread (importing aiohttp takes
        a while; the relay retries its connection meanwhile). Once only."""
        if self.thread is not None:
            return
        self.thread = threading.Thread(target=self._start, name="tco-proxy-start", daemon=True)
        self.thread.start()

    def _start(self) -> None:
        try:
            from execution.metering.caps import Caps
            from execution.metering.endpoints import endpoints_from_policy
            from execution.metering.proxy_spec import ProxySpec
            from execution.metering.proxy_thread import start_proxy

            plan = self.plan
            prices = None
            if plan.prices_file is not None:
                from execution.metering.prices import PriceTable

                prices = PriceTable.from_file(plan.prices_file)
            caps = None
            if plan.token_cap is not None or plan.cost_cap is not None:
                caps = Caps(task_tokens=plan.token_cap, task_cost_usd=plan.cost_cap)
            # Tracing is set up by the runner in a thread of its own; this waits for it if need be.
            sink = self.tracer.record_sink if self.tracer is not None and self.tracer.start(self.started_at) else None
            with self.lock:  # a network policy change waits: the proxy starts with the rules in force
                if self.stopped:
                    return   # the runner gave up on it (stop): its record says it did not start
                plan = self.plan
                spec = ProxySpec(endpoints_from_policy(plan.policy, plan.upstreams),
                                 NamedCredentials(plan.credentials_file), caps, prices=prices,
                                 registered=plan.registered, limits=plan.limits, policy_version=plan.policy_version)
                self.handle = start_proxy(self.socket_path, spec, record_sink=sink, record_path=self.requests_path)
        except Exception as exc:  # noqa: BLE001 - recorded; the agent sees its connection refused
            self.error = f"metering proxy did not start: {type(exc).__name__}: {exc}"

    def replace_rules(self, proxy_policy: Mapping, version: int) -> None:
        """Make ``proxy_policy`` (``Policy.proxy_policy()``) the rules new requests are routed by,
        as network policy ``version``: in the plan, and in the proxy if it runs. Raises
        ValueError for a malformed endpoint (nothing changed)."""
        from execution.metering.endpoints import endpoints_from_policy

        endpoints = endpoints_from_policy(proxy_policy, self.plan.upstreams)
        with self.lock:
            self.plan = dataclasses.replace(self.plan, policy=proxy_policy, policy_version=version)
            if self.handle is not None:
                self.handle.replace_endpoints(endpoints, version)

    def stop(self) -> dict | None:
        """Stop the proxy if it started; its final totals (None if it never ran or they are lost).
        A start or stop that went wrong is in :attr:`error`."""
        if self.thread is None:
            return None
        self.thread.join(PROXY_STOP_S)
        with self.lock:
            self.stopped = True
        usage = None
        if self.handle is not None:
            try:
                usage = self.handle.stop(timeout=PROXY_STOP_S)
            except Exception as exc:  # noqa: BLE001
                self.error = self.error or f"metering proxy did not stop: {exc!r}"
                try:
                    usage = self.handle.proxy.totals()
                except Exception:  # noqa: BLE001
                    usage = None
        elif self.error is None:
            self.error = "metering proxy did not start in time"
        return usage
