"""A validated sandbox policy and what the bubblewrap runtime makes of it.

:class:`Policy` (from execution/sandbox/policy/load.py or validate.py), its
network rules and endpoints, :meth:`Policy.unenforceable` (module doc of
``execution.sandbox.policy``) and :meth:`Policy.proxy_policy`. Standard library only.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

from execution.sandbox.policy.schema import ACCESS_METHODS, SANDBOX_UID, TRIVIAL_ENDPOINT_PATHS

if TYPE_CHECKING:
    from typing import Any

__all__ = ["PolicyError", "Finding", "Endpoint", "NetworkRule", "Policy", "inside_id", "plain"]


class PolicyError(ValueError):
    """The policy is not valid. ``problems`` lists every problem, each starting with its field."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("invalid sandbox policy:\n" + "\n".join(f"- {p}" for p in self.problems))


class _Record:
    """A small immutable record (keyword construction, equality, repr): the runner imports
    this module on every task, and dataclasses costs more to import than it saves here."""

    __slots__: tuple[str, ...] = ()

    def __init__(self, *args: Any, **values: Any) -> None:
        if len(args) > len(self.__slots__):
            raise TypeError(f"{type(self).__name__}: too many arguments")
        values.update(zip(self.__slots__, args))
        for name in self.__slots__:
            object.__setattr__(self, name, values.pop(name, getattr(type(self), "_defaults", {}).get(name)))
        if values:
            raise TypeError(f"{type(self).__name__}: unknown fields {', '.join(values)}")

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and all(getattr(self, n) == getattr(other, n) for n in self.__slots__)

    def __hash__(self) -> int:
        return hash(tuple(getattr(self, n) for n in self.__slots__ if n not in ("data",)))

    def __repr__(self) -> str:
        shown = ", ".join(f"{n}={getattr(self, n)!r}" for n in self.__slots__ if n not in ("data", "text"))
        return f"{type(self).__name__}({shown})"


class Finding(_Record):
    """What the bubblewrap runtime does with a field it cannot enforce as OpenShell would:
    ``field``, ``message``, and ``refuse`` (True where running anyway would allow more than
    the policy says)."""

    __slots__ = ("field", "message", "refuse")
    _defaults = {"refuse": False}

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


class Endpoint(_Record):
    """One ``network_policies.<key>.endpoints[]`` entry (``where`` names it): ``host``,
    ``ports`` (tuple), ``path``, ``allowed_ips``, ``protocol``, ``tls``, ``enforcement``,
    ``access``, ``rules`` and ``deny_rules`` (tuples of mappings), ``credential_provider``,
    ``fields`` (the field names written)."""

    __slots__ = ("where", "host", "ports", "path", "allowed_ips", "protocol", "tls", "enforcement", "access",
                 "rules", "deny_rules", "credential_provider", "fields")

    @property
    def wildcard(self) -> bool:
        """Whether the host is a wildcard pattern (``*.example.com``)."""
        return self.host is not None and "*" in self.host

    @property
    def loopback(self) -> bool:
        """Whether the host is ``localhost`` or a loopback address."""
        if self.host is None:
            return False
        if self.host.lower() == "localhost":
            return True
        import ipaddress

        try:
            return ipaddress.ip_address(self.host.strip("[]")).is_loopback
        except ValueError:
            return False


class NetworkRule(_Record):
    """One named block of ``network_policies``: ``key``, ``name``, ``endpoints`` (tuple of
    :class:`Endpoint`), ``binaries`` (tuple of paths)."""

    __slots__ = ("key", "name", "endpoints", "binaries")


class Policy(_Record):
    """A validated policy: ``version``, ``filesystem_present``, ``include_workdir``,
    ``read_only``, ``read_write`` (tuples of normalised paths), ``landlock_present``,
    ``landlock_compatibility``, ``run_as_user``, ``run_as_group``, ``network`` (tuple of
    :class:`NetworkRule`), ``middlewares`` (names); ``data`` is the parsed mapping as
    written and ``text`` its YAML source (None when given as a mapping)."""

    __slots__ = ("version", "filesystem_present", "include_workdir", "read_only", "read_write",
                 "landlock_present", "landlock_compatibility", "run_as_user", "run_as_group", "network",
                 "middlewares", "data", "text")

    # ---- identities inside the sandbox
    @property
    def uid(self) -> int:
        """The agent's uid inside the user namespace (never 0)."""
        return inside_id(self.run_as_user)

    @property
    def gid(self) -> int:
        """The agent's gid inside the user namespace (never 0)."""
        return inside_id(self.run_as_group)

    @property
    def sha256(self) -> str:
        """Hash of the policy as written (its YAML text, else its canonical JSON)."""
        import hashlib
        import json

        raw = self.text if self.text is not None else json.dumps(self.data, sort_keys=True)
        return hashlib.sha256(raw.encode("utf-8")).hexdigest()

    def endpoints(self) -> Iterator[tuple[NetworkRule, Endpoint]]:
        """Every ``(rule, endpoint)`` of ``network_policies``, in policy order."""
        for rule in self.network:
            for endpoint in rule.endpoints:
                yield rule, endpoint

    def to_yaml(self) -> str:
        """The policy as YAML: its source text when it was loaded from text."""
        if self.text is not None:
            return self.text
        import yaml

        return yaml.safe_dump(plain(self.data), sort_keys=False)

    # ---- what the bubblewrap runtime does differently
    def unenforceable(self) -> list[Finding]:
        """Fields the bubblewrap runtime (with the metering proxy) cannot enforce as OpenShell
        would, each with what happens instead (module doc)."""
        found: list[Finding] = []
        if self.landlock_present:
            found.append(Finding("landlock", "not used: bubblewrap enforces filesystem_policy with a private "
                                             "mount namespace (paths not listed do not exist in the sandbox); "
                                             "compatibility has no effect"))
        for name, value in (("run_as_user", self.run_as_user), ("run_as_group", self.run_as_group)):
            if value is not None:
                found.append(Finding(f"process.{name}", f"{value!r} is id {inside_id(value)} inside the "
                                                         "sandbox's user namespace only; on the host every "
                                                         "agent runs as the account that submitted the job"))
        for key in self.middlewares:
            found.append(Finding(f"network_middlewares.{key}", "middleware is not applied by the metering proxy; "
                                                               "refusing to run rather than pass traffic the "
                                                               "policy means to filter", refuse=True))
        for rule in self.network:
            where = f"network_policies.{rule.key}"
            if not rule.binaries:
                found.append(Finding(f"{where}.binaries", "empty, so (as in OpenShell) the rule allows no "
                                                           "program: its endpoints are not reachable"))
                continue
            found.append(Finding(f"{where}.binaries", "not checked: connections reach the proxy through the "
                                                       "relay, which cannot tell which program opened them, so "
                                                       "every process in the sandbox may use this rule"))
            for endpoint in rule.endpoints:
                found.extend(endpoint_findings(endpoint))
        return found

    def refusals(self) -> list[Finding]:
        """The findings that stop the bubblewrap runtime from running the agent."""
        return [f for f in self.unenforceable() if f.refuse]

    def proxy_policy(self) -> dict[str, Any]:
        """``{"network_policies": ...}`` holding only what the metering proxy can reach and meter:
        ``protocol: rest`` endpoints with an exact host in rules that list binaries, one entry
        per port, ``access`` presets expanded to ``{allow: {method, path}}`` rules."""
        blocks: dict[str, Any] = {}
        for rule in self.network:
            if not rule.binaries:
                continue
            endpoints = []
            for endpoint in rule.endpoints:
                if not forwardable(endpoint):
                    continue
                if endpoint.access is not None:
                    rules = [{"allow": {"method": m, "path": "/**"}} for m in ACCESS_METHODS[endpoint.access]]
                else:
                    rules = [{"allow": {"method": r["allow"]["method"], "path": r["allow"]["path"]}}
                             for r in endpoint.rules]
                for port in endpoint.ports:
                    entry: dict[str, Any] = {"host": endpoint.host, "port": port, "protocol": "rest",
                                             "rules": rules}
                    if endpoint.credential_provider:
                        entry["credential_binding"] = {"provider": endpoint.credential_provider}
                    endpoints.append(entry)
            if endpoints:
                blocks[rule.key] = {"endpoints": endpoints}
        return {"network_policies": blocks}

    def credential_providers(self) -> set[str]:
        """Providers named by a ``credential_binding`` of a reachable endpoint."""
        return {e.credential_provider for r, e in self.endpoints()
                if r.binaries and e.credential_provider and forwardable(e)}


def forwardable(endpoint: Endpoint) -> bool:
    """Whether the metering proxy can reach and meter ``endpoint``: ``protocol: rest`` to an
    exact host name."""
    return endpoint.protocol == "rest" and endpoint.host is not None and not endpoint.wildcard


def endpoint_findings(e: Endpoint) -> list[Finding]:
    """What the bubblewrap runtime does differently for one endpoint of a rule that lists
    binaries (:meth:`Policy.unenforceable`)."""
    where = e.where
    if e.host is None:
        return [Finding(where, "an endpoint without host (allowed_ips only) is not reachable: the metering "
                               "proxy sends requests to named hosts only")]
    if e.wildcard:
        return [Finding(f"{where}.host", f"wildcard host {e.host!r} is not reachable: the metering proxy "
                                         "forwards to exact host names only")]
    if e.protocol != "rest":
        kind = f"protocol {e.protocol}" if e.protocol else "an endpoint without protocol (not inspected)"
        return [Finding(where, f"{kind} is not reachable: the metering proxy forwards only inspected REST "
                               "requests (protocol: rest), since other traffic cannot be metered")]
    found = []
    if e.loopback:
        found.append(Finding(f"{where}.host", f"{e.host} is loopback: OpenShell refuses loopback endpoints, so "
                                              "this policy works with the bubblewrap runtime only"))
    if e.enforcement == "audit":
        # OpenShell's default is audit: requests the rules do not allow are logged but let
        # through. The metering proxy has no audit mode; it refuses them (as enforce would).
        what = ("not set, so OpenShell's default applies: audit (requests the rules do not allow are logged "
                "but not refused)" if "enforcement" not in e.fields
                else "audit: OpenShell logs but does not refuse requests the rules do not allow")
        found.append(Finding(f"{where}.enforcement", f"{what}; under the bubblewrap runtime the metering proxy "
                                                     "refuses them anyway, as enforcement: enforce does (write "
                                                     "enforcement: enforce to get that under OpenShell too)"))
    if e.allowed_ips:
        found.append(Finding(f"{where}.allowed_ips", "not checked by the metering proxy (it connects wherever "
                                                     "the host name resolves); refusing to run", refuse=True))
    if e.deny_rules:
        found.append(Finding(f"{where}.deny_rules", "not enforced by the metering proxy; refusing to run "
                                                    "rather than allow what the policy denies", refuse=True))
    if any("query" in r["allow"] for r in e.rules):
        found.append(Finding(f"{where}.rules", "query matchers are not checked by the metering proxy; "
                                               "refusing to run rather than allow any query", refuse=True))
    if e.path is not None and e.path not in TRIVIAL_ENDPOINT_PATHS:
        found.append(Finding(f"{where}.path", "endpoint path selectors are not supported by the metering "
                                              "proxy; refusing to run rather than widen the rules", refuse=True))
    if "allow_encoded_slash" in e.fields:
        found.append(Finding(f"{where}.allow_encoded_slash", "ignored: the metering proxy refuses encoded "
                                                             "slashes in paths"))
    for name in ("request_body_credential_rewrite", "websocket_credential_rewrite"):
        if name in e.fields:
            found.append(Finding(f"{where}.{name}", "not supported: credential placeholders are sent as "
                                                    "written; the proxy adds the bound credential as a header"))
    if "allow_uninspected_credentials" in e.fields:
        found.append(Finding(f"{where}.allow_uninspected_credentials", "no effect: uninspected traffic is "
                                                                      "never forwarded"))
    if "credential_signing" in e.fields:
        found.append(Finding(f"{where}.credential_signing", "not supported: requests are not signed, so a "
                                                            "service that needs a signature refuses them"))
    return found


def inside_id(value: str | None) -> int:
    """The id ``run_as_user``/``run_as_group`` means inside the user namespace: ``sandbox`` (or
    unset) is :data:`~execution.sandbox.policy.schema.SANDBOX_UID`, else the number written."""
    if value is None or value == "sandbox":
        return SANDBOX_UID
    return int(value)


def plain(value: Any) -> Any:
    """``value`` with mappings as dicts and sequences as lists (for YAML output)."""
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value
