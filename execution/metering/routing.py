"""Where a request goes: the metering proxy's routing decision and its refusals.

Decided from the request line alone (the ``Host`` header never targets a
request): see execution/metering/proxy.py's module doc, items 1 and 2.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from yarl import URL

from execution.metering.endpoints import Endpoint, RegisteredEndpoint, unsafe_path

__all__ = ["Refusal", "route", "registration"]


@dataclass
class Refusal:
    """A request the proxy answers itself: ``reason`` (counted in the totals'
    ``refused_by_reason``), ``message`` (shown to the agent) and the HTTP ``status``."""

    reason: str
    message: str
    status: int = 403


def route(method: str, target: str, headers: Mapping[str, str], endpoints: Sequence[Endpoint],
          registered: Sequence[RegisteredEndpoint]) -> tuple[Endpoint, str] | Refusal:
    """The endpoint a request goes to and its origin-form target (path and query), or the
    :class:`Refusal`. ``target`` is the raw request target: origin-form goes to the endpoint
    whose allowing rule is the most specific (then a registered destination, then policy
    order); absolute-form only to an endpoint with that host and port."""
    if method == "CONNECT":
        return Refusal("connect", "CONNECT is refused: a tunnel cannot be metered; send plain HTTP "
                                  "requests to the proxy base URL")
    if "upgrade" in headers:
        return Refusal("upgrade", "protocol upgrades (WebSocket) are refused")
    candidates = endpoints
    if not target.startswith("/"):
        url = URL(target, encoded=True) if "://" in target else None
        if url is None or url.scheme not in ("http", "https") or not url.host:
            return Refusal("bad_path", f"request target {target[:200]!r} is not a path")
        port = url.explicit_port or (443 if url.scheme == "https" else 80)
        candidates = [e for e in endpoints if e.host.lower() == url.host.lower() and e.port == port]
        if not candidates:
            return Refusal("host_not_allowed", f"{url.host}:{port} is not an endpoint of the sandbox policy")
        target = url.raw_path_qs
    path = target.split("?", 1)[0]
    if unsafe_path(path):
        return Refusal("bad_path", f"path {path[:200]!r} is refused (dot segments, '//' or encoded separators)")
    # The most specific allowing rule wins, never simply the first endpoint listed.
    best: tuple | None = None
    for index, endpoint in enumerate(candidates):
        score = endpoint.specificity(method, path)
        if score is None:
            continue
        is_registered = registration(endpoint, target, registered) is not None
        key = (score, is_registered, -index)
        if best is None or key > best[0]:
            best = (key, endpoint)
    if best is not None:
        return best[1], target
    return Refusal("not_in_policy", f"{method} {path[:200]} is not allowed by the sandbox policy")


def registration(endpoint: Endpoint, target: str,
                 registered: Sequence[RegisteredEndpoint]) -> RegisteredEndpoint | Refusal | None:
    """The registered endpoint whose credential a request to ``endpoint`` at ``target``
    carries: the most specific registration covering its upstream URL, if the policy
    endpoint binds a credential at all; None (no credential); a refusal when two
    registrations naming different credentials match equally."""
    if not endpoint.credential or not registered:
        return None
    url = URL(endpoint.upstream.rstrip("/") + target, encoded=True)
    scored = [(r.match(url), r) for r in registered]
    scored = [(score, r) for score, r in scored if score >= 0]
    if not scored:
        return None
    top = max(score for score, _ in scored)
    best = [r for score, r in scored if score == top]
    if len({r.credential_name for r in best}) > 1:
        return Refusal("credential_unavailable", "two registered model endpoints match this destination "
                                                 "equally; the site's registrations must be fixed", 503)
    return best[0]
