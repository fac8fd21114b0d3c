"""The metering proxy's policy side: which endpoints a sandbox may reach, which
registered model endpoints receive a credential, and the proxy's limits.

Kept apart from execution/metering/proxy.py (the aiohttp server) so that the
runner reads and checks a task's endpoints without importing aiohttp: that
import alone took about 110 ms of CPU (``python -X importtime``), on the
critical path between the runner's first timestamp and the sandbox's start,
and 96 runners starting at once paid it together (issue 15, integration
overhead). aiohttp is imported only when the proxy starts, at the agent's
first model request.
"""
from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping
from urllib.parse import unquote

if TYPE_CHECKING:
    from yarl import URL

__all__ = ["Rule", "Endpoint", "endpoints_from_policy", "RegisteredEndpoint", "registered_endpoints", "Limits",
           "MAX_REQUEST_BYTES", "unsafe_path"]

MAX_REQUEST_BYTES = 32 << 20


# ------------------------------------------------------------------ policy


@dataclass(frozen=True)
class Rule:
    """An allowed ``method`` (``*``: any) and ``path``: exact, or a glob where
    ``*`` matches within one segment and ``**`` across segments. The query
    string is not part of the match."""

    method: str
    path: str

    def __post_init__(self) -> None:
        pattern = ""
        for piece in re.split(r"(\*\*|\*)", self.path):
            pattern += ".*" if piece == "**" else "[^/]*" if piece == "*" else re.escape(piece)
        object.__setattr__(self, "_regex", re.compile(pattern + r"\Z"))

    def allows(self, method: str, path: str) -> bool:
        """True if this rule allows ``method`` on ``path`` (without query)."""
        if self.method != "*" and self.method.upper() != method.upper():
            return False
        return bool(self._regex.match(path))  # type: ignore[attr-defined]

    @property
    def specificity(self) -> tuple[int, int, int]:
        """Orders rules from the most specific: an exact path, then the longer literal
        prefix before the first wildcard, then an exact method."""
        literal = self.path.split("*", 1)[0]
        return ("*" not in self.path, len(literal), self.method != "*")


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class Endpoint:
    """One policy endpoint the proxy may reach.

    ``name``: the policy block; ``host``/``port``: as the policy lists them;
    ``rules``: allowed methods and paths; ``upstream``: base URL requests are
    sent to (default ``https://host:port``, or ``http://`` for a loopback
    host such as the stand-in model); ``credential``: the provider named by
    ``credential_binding`` (None: no credential added; a name: a credential is
    added only if the destination is a :class:`RegisteredEndpoint`, and it is
    that registration's, never one this name chooses); ``auth_header``:
    ``x-api-key``, ``authorization`` (Bearer) or ``api-key``; None picks
    ``x-api-key`` for provider ``anthropic``, else ``authorization``.
    """

    name: str
    host: str
    port: int
    rules: tuple[Rule, ...]
    upstream: str = ""
    credential: str | None = None
    auth_header: str | None = None

    def __post_init__(self) -> None:
        if not self.upstream:
            scheme = "http" if _is_loopback(self.host) else "https"
            object.__setattr__(self, "upstream", f"{scheme}://{self.host}:{self.port}")
        if self.auth_header not in (None, "x-api-key", "authorization", "api-key"):
            raise ValueError(f"{self.name}: unknown auth_header {self.auth_header!r}")

    def allows(self, method: str, path: str) -> bool:
        """True if a rule of this endpoint allows ``method`` on ``path``."""
        return any(rule.allows(method, path) for rule in self.rules)

    def specificity(self, method: str, path: str) -> tuple[int, int, int] | None:
        """The most specific of this endpoint's rules allowing ``method`` on ``path`` (see
        :attr:`Rule.specificity`), or None."""
        found = [rule.specificity for rule in self.rules if rule.allows(method, path)]
        return max(found) if found else None

    def credential_headers(self, secret: str, provider: str | None = None) -> dict[str, str]:
        """The header(s) carrying ``secret`` to this endpoint; ``provider`` (the registered
        endpoint's) picks the header, else the policy's ``credential_binding``."""
        provider = provider or self.credential
        header = self.auth_header or ("x-api-key" if provider == "anthropic" else "authorization")
        return {header: f"Bearer {secret}" if header == "authorization" else secret}


@dataclass(frozen=True)
class RegisteredEndpoint:
    """A model endpoint the site's admins registered: the only destinations that ever
    receive a credential. ``scheme`` ``http``/``https``; ``host`` (compared without
    case); ``port``; ``path_prefixes``: upstream paths it covers (``/`` covers all;
    ``/v1`` covers ``/v1`` and ``/v1/...``, not ``/v10``); ``credential_name``: the
    name in the runner's credentials file; ``provider`` picks the header
    (``anthropic``: ``x-api-key``; else ``Authorization: Bearer``; None: as the policy's
    ``credential_binding`` names it)."""

    name: str
    provider: str | None
    scheme: str
    host: str
    port: int
    path_prefixes: tuple[str, ...]
    credential_name: str

    def match(self, url: URL) -> int:
        """How specific this registration is for ``url`` (the length of the longest
        matching path prefix), or -1 if it does not cover ``url``."""
        port = url.port or (443 if url.scheme == "https" else 80)
        if url.scheme != self.scheme or (url.host or "").lower() != self.host.lower() or port != self.port:
            return -1
        path = url.raw_path or "/"
        best = -1
        for prefix in self.path_prefixes:
            stem = prefix.rstrip("/")
            if not stem or path == stem or path.startswith(stem + "/"):
                best = max(best, len(stem))
        return best


def registered_endpoints(items: Any) -> list[RegisteredEndpoint]:
    """The runner spec's ``model_endpoints`` (written by tco's launch side from the
    admin-registered endpoints) as :class:`RegisteredEndpoint`: a list of
    ``{"name", "provider", "scheme", "host", "port", "path_prefixes": [..],
    "credential_name"}``. None is an empty list. Raises ValueError naming the
    first malformed entry."""
    if items is None:
        return []
    if not isinstance(items, list):
        raise ValueError("model_endpoints: expected a list")
    out = []
    for i, item in enumerate(items):
        where = f"model_endpoints[{i}]"
        if not isinstance(item, Mapping):
            raise ValueError(f"{where}: expected a mapping")
        name, provider, scheme = item.get("name"), item.get("provider"), item.get("scheme")
        host, port, prefixes, credential = (item.get("host"), item.get("port"), item.get("path_prefixes"),
                                            item.get("credential_name"))
        if not isinstance(name, str) or not name:
            raise ValueError(f"{where}.name: expected a name")
        if provider is not None and not isinstance(provider, str):
            raise ValueError(f"{where}.provider: expected text")
        if scheme not in ("http", "https"):
            raise ValueError(f"{where}.scheme: expected http or https")
        if not isinstance(host, str) or not host or any(c in host for c in "/@?#% \t\r\n\\"):
            raise ValueError(f"{where}.host: expected a host name or IP address")
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
            raise ValueError(f"{where}.port: expected 1..65535")
        if prefixes is None:
            prefixes = ["/"]
        if not isinstance(prefixes, list) or not prefixes or not all(
                isinstance(p, str) and p.startswith("/") and not unsafe_path(p) for p in prefixes):
            raise ValueError(f"{where}.path_prefixes: expected a list of absolute paths")
        if not isinstance(credential, str) or not credential:
            raise ValueError(f"{where}.credential_name: expected a name")
        out.append(RegisteredEndpoint(name=name, provider=provider or None, scheme=scheme, host=host, port=port,
                                      path_prefixes=tuple(prefixes), credential_name=credential))
    return out


@dataclass(frozen=True)
class Limits:
    """The proxy's resource limits (issue 11, finding 5), each with a safe default.

    ``max_connections``: connections open at once (others are closed at once);
    ``max_header_bytes``: longest request line or header field; ``max_headers``: header
    fields per request; ``max_body_bytes``: one request body; ``max_buffered_bytes``:
    request bodies held in memory at once, all connections together;
    ``records_in_memory``: request records kept for :meth:`MeteringProxy.totals`
    callers (the newest); ``record_file_bytes``: size cap of the JSONL record file
    (:class:`JsonlRecordSink`). All bytes or counts, each >= 1."""

    max_connections: int = 32
    max_header_bytes: int = 8190
    max_headers: int = 64
    max_body_bytes: int = MAX_REQUEST_BYTES
    max_buffered_bytes: int = 64 << 20
    records_in_memory: int = 1000
    record_file_bytes: int = 64 << 20

    def __post_init__(self) -> None:
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"proxy limit {name}: expected a positive integer, got {value!r}")


def endpoints_from_policy(policy: Mapping[str, Any], upstreams: Mapping[str, str] | None = None) -> list[Endpoint]:
    """Endpoints of a sandbox policy in OpenShell's schema (DESIGN.md, "Sandbox
    policy"): every ``network_policies.<name>.endpoints[]`` with ``protocol:
    rest`` and its ``rules: [{allow: {method, path}}]`` and
    ``credential_binding.provider``. An endpoint without ``protocol: rest`` is
    left out: its traffic could not be inspected, so it cannot be metered and
    is not reachable through this proxy. Rules are always enforced here
    (OpenShell's ``enforcement: audit`` would only log). ``upstreams`` maps
    ``"host:port"`` (or ``"host"``) to a base URL, for a gateway or the
    stand-in model. Raises ValueError on a malformed endpoint or rule."""
    upstreams = upstreams or {}
    endpoints = []
    blocks = policy.get("network_policies") or {}
    if not isinstance(blocks, Mapping):
        raise ValueError("network_policies: expected a mapping of named blocks")
    for name, block in blocks.items():
        for ep in (block or {}).get("endpoints") or []:
            if not isinstance(ep, Mapping) or ep.get("protocol") != "rest":
                continue
            host, port = ep.get("host"), ep.get("port")
            if not isinstance(host, str) or not isinstance(port, int):
                raise ValueError(f"{name}: an endpoint needs host (text) and port (integer)")
            rules = []
            for item in ep.get("rules") or []:
                allow = item.get("allow") if isinstance(item, Mapping) else None
                if not isinstance(allow, Mapping) or not isinstance(allow.get("method"), str) \
                        or not isinstance(allow.get("path"), str):
                    raise ValueError(f"{name}: rule {item!r}: expected {{allow: {{method, path}}}}")
                rules.append(Rule(allow["method"], allow["path"]))
            binding = ep.get("credential_binding") or {}
            endpoints.append(Endpoint(
                name=name, host=host, port=port, rules=tuple(rules),
                upstream=upstreams.get(f"{host}:{port}") or upstreams.get(host) or "",
                credential=binding.get("provider") if isinstance(binding, Mapping) else None,
            ))
    return endpoints


def unsafe_path(path: str) -> bool:
    """True if the request path ``path`` (without query) must be refused: not absolute, ``//``
    first, a backslash or NUL, an encoded ``/``, ``\\`` or NUL, or a ``.``/``..`` segment
    (also percent-encoded)."""
    if not path.startswith("/") or path.startswith("//") or "\\" in path or "\0" in path:
        return True
    lowered = path.lower()
    if "%2f" in lowered or "%5c" in lowered or "%00" in lowered:
        return True
    return any(unquote(segment) in (".", "..") for segment in path.split("/"))
