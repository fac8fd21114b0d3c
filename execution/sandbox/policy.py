"""The sandbox policy: YAML in OpenShell's own schema, loaded strictly.

One file serves both runtimes (DESIGN.md, "Sandbox policy"). The schema is
OpenShell's "Policy Schema Reference": ``version``, ``filesystem_policy``,
``landlock``, ``process``, ``network_policies`` and ``network_middlewares``.
Like OpenShell, :func:`load_policy` rejects unknown fields (with a "did you
mean" hint) and duplicate keys (with both line numbers), and checks types,
enumerations and the documented constraints (absolute paths without ``..``,
at most 256 of them, ``read_write`` never ``/``, ``run_as_user`` never root,
``access`` xor ``rules``, wildcard host shapes, ...). Every problem found is
reported at once in one :class:`PolicyError`, each naming its field.

Some fields have no bubblewrap equivalent. :meth:`Policy.unenforceable` says
which, as :class:`Finding` messages: a *note* where the bubblewrap runtime
does something different but never allows more than the policy (for
example ``binaries``, which cannot be checked through the relay, or
``run_as_user``, which is a uid inside the user namespace); a *refusal*
where enforcing less would allow more than the policy says (``deny_rules``,
query matchers, ``allowed_ips``, middlewares): the runner then refuses to
start the agent rather than run it under a weaker policy.

:meth:`Policy.proxy_policy` is the network part as the metering proxy
(execution/metering/proxy.py) takes it: only endpoints it can reach and meter
(``protocol: rest``, an exact host, a rule that lists binaries), ``ports``
expanded, ``access`` presets expanded to rules.
"""
from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any

MAX_POLICY_BYTES = 4 * 1024 * 1024
MAX_PATHS = 256
MAX_PATH_BYTES = 4096
MAX_MIDDLEWARES = 10
MAX_ID = 4294967294
SANDBOX_UID = 1000  # what ``run_as_user: sandbox`` means inside the user namespace

PROTOCOLS = ("rest", "websocket", "graphql", "mcp", "json-rpc", "tcp")
REQUEST_PROTOCOLS = ("rest", "websocket", "graphql", "mcp", "json-rpc")
ENFORCEMENTS = ("enforce", "audit")
ACCESS_PRESETS = ("read-only", "read-write", "full")
TLS_MODES = ("skip", "terminate")
COMPATIBILITY = ("best_effort", "hard_requirement")
SIGNING = ("sigv4", "sigv4:body", "sigv4:no_body")
MCP_VERSIONS = ("2025-03-26", "2025-06-18", "2025-11-25", "2026-07-28")
ON_ERROR = ("fail_closed", "fail_open")

ACCESS_METHODS = {
    "read-only": ("GET", "HEAD", "OPTIONS"),
    "read-write": ("GET", "HEAD", "OPTIONS", "POST", "PUT", "PATCH"),
    "full": ("*",),
}

TOP_FIELDS = ("version", "filesystem_policy", "landlock", "process", "network_policies", "network_middlewares")
FILESYSTEM_FIELDS = ("include_workdir", "read_only", "read_write")
LANDLOCK_FIELDS = ("compatibility",)
PROCESS_FIELDS = ("run_as_user", "run_as_group")
RULE_FIELDS = ("name", "endpoints", "binaries")
ENDPOINT_FIELDS = (
    "host", "port", "ports", "path", "allowed_ips",
    "protocol", "tls", "enforcement", "access", "rules", "deny_rules", "allow_encoded_slash",
    "credential_binding", "request_body_credential_rewrite", "websocket_credential_rewrite",
    "allow_uninspected_credentials", "credential_signing", "signing_service", "signing_region",
    "persisted_queries", "graphql_persisted_queries", "graphql_max_body_bytes", "mcp", "json_rpc",
)
REQUEST_FIELDS = ("path", "enforcement", "access", "rules", "deny_rules", "allow_encoded_slash",
                  "request_body_credential_rewrite", "websocket_credential_rewrite", "credential_signing",
                  "signing_service", "signing_region", "persisted_queries", "graphql_persisted_queries",
                  "graphql_max_body_bytes", "mcp", "json_rpc")
MATCHER_FIELDS = {
    "rest": ("method", "path", "query"),
    "websocket": ("method", "path", "query"),
    "graphql": ("operation_type", "operation_name", "fields"),
    "mcp": ("method", "tool", "params"),
    "json-rpc": ("method",),
}
MIDDLEWARE_FIELDS = ("middleware", "endpoints", "order", "config", "on_error", "name")
TRIVIAL_ENDPOINT_PATHS = ("", "**", "/**")
_METHOD_RE = re.compile(r"^(\*|[A-Za-z][A-Za-z_-]{0,31})$")
_LABEL_RE = re.compile(r"^[A-Za-z0-9*]([A-Za-z0-9*-]{0,61}[A-Za-z0-9*])?$")


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
        return self.host is not None and "*" in self.host

    @property
    def loopback(self) -> bool:
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
        return _inside_id(self.run_as_user)

    @property
    def gid(self) -> int:
        """The agent's gid inside the user namespace (never 0)."""
        return _inside_id(self.run_as_group)

    @property
    def sha256(self) -> str:
        """Hash of the policy as written (its YAML text, else its canonical JSON)."""
        import hashlib
        import json

        raw = self.text if self.text is not None else json.dumps(self.data, sort_keys=True)
        return hashlib.sha256(raw.encode("utf-8")).hexdigest()

    def endpoints(self) -> Iterator[tuple[NetworkRule, Endpoint]]:
        for rule in self.network:
            for endpoint in rule.endpoints:
                yield rule, endpoint

    def to_yaml(self) -> str:
        """The policy as YAML: its source text when it was loaded from text."""
        if self.text is not None:
            return self.text
        import yaml

        return yaml.safe_dump(_plain(self.data), sort_keys=False)

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
                found.append(Finding(f"process.{name}", f"{value!r} is id {_inside_id(value)} inside the "
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
                found.extend(_endpoint_findings(endpoint))
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
                if not _forwardable(endpoint):
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
                if r.binaries and e.credential_provider and _forwardable(e)}


def _forwardable(endpoint: Endpoint) -> bool:
    return endpoint.protocol == "rest" and endpoint.host is not None and not endpoint.wildcard


def _endpoint_findings(e: Endpoint) -> list[Finding]:
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


def _inside_id(value: str | None) -> int:
    if value is None or value == "sandbox":
        return SANDBOX_UID
    return int(value)


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


# --------------------------------------------------------------------------- YAML


def _strict_loader():
    """A PyYAML safe loader that rejects duplicate keys, merge keys and non-text keys."""
    import yaml

    base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

    class StrictLoader(base):  # type: ignore[misc,valid-type]
        pass

    def construct_mapping(loader, node, deep=False):
        seen: dict[str, int] = {}
        mapping: dict[str, Any] = {}
        for key_node, value_node in node.value:
            line = key_node.start_mark.line + 1
            if key_node.tag == "tag:yaml.org,2002:merge":
                raise PolicyError([f"line {line}: YAML merge keys ('<<') are not allowed"])
            key = loader.construct_object(key_node, deep=True)
            if not isinstance(key, str):
                raise PolicyError([f"line {line}: key {key!r} must be text"])
            if key in seen:
                raise PolicyError([f"line {line}: duplicate key {key!r} (first at line {seen[key]})"])
            seen[key] = line
            mapping[key] = loader.construct_object(value_node, deep=True)
        return mapping

    StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, construct_mapping)
    return yaml, StrictLoader


def parse_yaml(text: str) -> Any:
    """The YAML document in ``text``; raises PolicyError (duplicate keys, syntax, size)."""
    if len(text.encode("utf-8")) > MAX_POLICY_BYTES:
        raise PolicyError([f"policy is larger than {MAX_POLICY_BYTES} bytes"])
    yaml, loader = _strict_loader()
    try:
        return yaml.load(text, Loader=loader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise PolicyError([f"{where}not valid YAML: {problem}"]) from None


def load_policy(source: str | os.PathLike | Mapping[str, Any]) -> Policy:
    """Load and validate a policy: YAML text, a path to a YAML file (an absolute path on
    one line), or an already parsed mapping. Raises PolicyError."""
    if isinstance(source, Mapping):
        return validate_policy(source)
    if isinstance(source, os.PathLike) or (isinstance(source, str) and "\n" not in source
                                           and source.startswith("/")):
        path = os.fspath(source)
        try:
            with open(path, "rb") as fh:
                raw = fh.read(MAX_POLICY_BYTES + 1)
        except OSError as exc:
            raise PolicyError([f"cannot read policy file {path}: {exc.strerror}"]) from None
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise PolicyError([f"policy file {path} is not UTF-8"]) from None
    else:
        text = source
    return validate_policy(parse_yaml(text), text=text)


# --------------------------------------------------------------------------- validation


class _Checker:
    def __init__(self) -> None:
        self.problems: list[str] = []

    def add(self, where: str, message: str) -> None:
        self.problems.append(f"{where}: {message}")

    def mapping(self, value: Any, where: str, allowed: tuple[str, ...]) -> Mapping[str, Any] | None:
        if not isinstance(value, Mapping):
            self.add(where, f"expected a mapping, got {_kind(value)}")
            return None
        for key in value:
            if key not in allowed:
                import difflib

                hint = difflib.get_close_matches(str(key), allowed, n=1)
                self.add(f"{where}.{key}" if where else str(key),
                         "unknown field" + (f" (did you mean {hint[0]!r}?)" if hint else
                                            f" (known: {', '.join(allowed)})"))
        return value

    def boolean(self, value: Any, where: str) -> bool | None:
        if not isinstance(value, bool):
            self.add(where, f"expected true or false, got {_kind(value)}")
            return None
        return value

    def text(self, value: Any, where: str, *, choices: tuple[str, ...] | None = None) -> str | None:
        if not isinstance(value, str):
            self.add(where, f"expected text, got {_kind(value)}")
            return None
        if choices is not None and value not in choices:
            self.add(where, f"{value!r} is not one of {', '.join(choices)}")
            return None
        return value

    def integer(self, value: Any, where: str, low: int, high: int) -> int | None:
        if isinstance(value, bool) or not isinstance(value, int):
            self.add(where, f"expected an integer, got {_kind(value)}")
            return None
        if not low <= value <= high:
            self.add(where, f"{value} is outside {low}..{high}")
            return None
        return value

    def text_list(self, value: Any, where: str) -> list[str]:
        if not isinstance(value, list):
            self.add(where, f"expected a list, got {_kind(value)}")
            return []
        out = []
        for i, item in enumerate(value):
            if self.text(item, f"{where}[{i}]") is not None:
                out.append(item)
        return out


def _kind(value: Any) -> str:
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if isinstance(value, int):
        return f"an integer ({value})"
    if isinstance(value, float):
        return f"a number ({value})"
    if isinstance(value, str):
        return f"text ({value[:40]!r})"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, Mapping):
        return "a mapping"
    return type(value).__name__


def validate_policy(data: Any, *, text: str | None = None) -> Policy:
    """Check a parsed policy against the schema; return a :class:`Policy` or raise PolicyError."""
    c = _Checker()
    if data is None:
        raise PolicyError(["the policy is empty (it needs at least 'version: 1')"])
    top = c.mapping(data, "", TOP_FIELDS)
    if top is None:
        raise PolicyError(["the policy must be a mapping of fields (version, filesystem_policy, ...)"])

    if "version" not in top:
        c.add("version", "required (version: 1)")
    elif isinstance(top["version"], bool) or not isinstance(top["version"], int):
        c.add("version", f"expected the integer 1, got {_kind(top['version'])}")
    elif top["version"] != 1:
        c.add("version", f"{top['version']} is not supported (must be 1)")
    version = 1

    fs_present = "filesystem_policy" in top
    include_workdir, read_only, read_write = (not fs_present), [], []
    if fs_present:
        fs = c.mapping(top["filesystem_policy"], "filesystem_policy", FILESYSTEM_FIELDS)
        if fs is not None:
            if "include_workdir" in fs:
                value = c.boolean(fs["include_workdir"], "filesystem_policy.include_workdir")
                include_workdir = bool(value)
            for name, out in (("read_only", read_only), ("read_write", read_write)):
                if name in fs:
                    for i, path in enumerate(c.text_list(fs[name], f"filesystem_policy.{name}")):
                        if _check_path(c, path, f"filesystem_policy.{name}[{i}]", writable=name == "read_write"):
                            out.append(os.path.normpath(path) if path != "/" else "/")
            if len(read_only) + len(read_write) > MAX_PATHS:
                c.add("filesystem_policy", f"lists {len(read_only) + len(read_write)} paths; at most {MAX_PATHS}")

    landlock_present = "landlock" in top
    compatibility = "best_effort"
    if landlock_present:
        ll = c.mapping(top["landlock"], "landlock", LANDLOCK_FIELDS)
        if ll is not None and "compatibility" in ll:
            compatibility = c.text(ll["compatibility"], "landlock.compatibility", choices=COMPATIBILITY) \
                or compatibility

    run_as_user = run_as_group = None
    if "process" in top:
        proc = c.mapping(top["process"], "process", PROCESS_FIELDS)
        if proc is not None:
            for name in PROCESS_FIELDS:
                if name in proc:
                    value = _check_identity(c, proc[name], f"process.{name}")
                    if name == "run_as_user":
                        run_as_user = value
                    else:
                        run_as_group = value

    network: list[NetworkRule] = []
    if "network_policies" in top:
        blocks = top["network_policies"]
        if blocks is None:
            blocks = {}
        if not isinstance(blocks, Mapping):
            c.add("network_policies", f"expected a mapping of named rules, got {_kind(blocks)}")
        else:
            for key, block in blocks.items():
                rule = _check_rule(c, key, block)
                if rule is not None:
                    network.append(rule)

    middlewares: list[str] = []
    if "network_middlewares" in top:
        mws = top["network_middlewares"]
        if not isinstance(mws, Mapping):
            c.add("network_middlewares", f"expected a mapping of named middleware, got {_kind(mws)}")
        else:
            if len(mws) > MAX_MIDDLEWARES:
                c.add("network_middlewares", f"{len(mws)} configurations; at most {MAX_MIDDLEWARES}")
            orders: dict[int, str] = {}
            for key, mw in mws.items():
                where = f"network_middlewares.{key}"
                m = c.mapping(mw, where, MIDDLEWARE_FIELDS)
                middlewares.append(str(key))
                if m is None:
                    continue
                if "middleware" not in m:
                    c.add(f"{where}.middleware", "required")
                else:
                    c.text(m["middleware"], f"{where}.middleware")
                if "endpoints" not in m:
                    c.add(f"{where}.endpoints", "required (include: [host patterns])")
                else:
                    eps = c.mapping(m["endpoints"], f"{where}.endpoints", ("include", "exclude"))
                    if eps is not None:
                        if "include" not in eps:
                            c.add(f"{where}.endpoints.include", "required")
                        for part in ("include", "exclude"):
                            if part in eps:
                                c.text_list(eps[part], f"{where}.endpoints.{part}")
                order = c.integer(m["order"], f"{where}.order", -2**31, 2**31 - 1) if "order" in m else 0
                if order is not None:
                    if order in orders:
                        c.add(f"{where}.order", f"{order} is also the order of {orders[order]} (must be unique)")
                    orders[order] = str(key)
                if "config" in m and not isinstance(m["config"], Mapping):
                    c.add(f"{where}.config", f"expected a mapping, got {_kind(m['config'])}")
                if "on_error" in m:
                    c.text(m["on_error"], f"{where}.on_error", choices=ON_ERROR)
                if "name" in m:
                    c.text(m["name"], f"{where}.name")

    if c.problems:
        raise PolicyError(c.problems)
    return Policy(
        version=version, filesystem_present=fs_present, include_workdir=include_workdir,
        read_only=tuple(read_only), read_write=tuple(read_write), landlock_present=landlock_present,
        landlock_compatibility=compatibility, run_as_user=run_as_user, run_as_group=run_as_group,
        network=tuple(network), middlewares=tuple(middlewares), data=data, text=text,
    )


def _check_path(c: _Checker, path: str, where: str, *, writable: bool) -> bool:
    if not path.startswith("/"):
        c.add(where, f"{path!r} is not an absolute path")
        return False
    if ".." in path.split("/"):
        c.add(where, f"{path!r} contains '..'")
        return False
    if "\0" in path:
        c.add(where, "contains a NUL character")
        return False
    if len(path.encode("utf-8")) > MAX_PATH_BYTES:
        c.add(where, f"longer than {MAX_PATH_BYTES} bytes")
        return False
    if writable and os.path.normpath(path) in ("/", "//"):
        c.add(where, "read_write cannot contain '/'")
        return False
    return True


def _check_identity(c: _Checker, value: Any, where: str) -> str | None:
    if isinstance(value, int) and not isinstance(value, bool):
        c.add(where, "0 is root, which is never allowed" if value == 0
              else f"expected text: write the id in quotes ('{value}')")
        return None
    if c.text(value, where) is None:
        return None
    if value == "sandbox":
        return value
    if not value.isdigit():
        c.add(where, f"{value!r} must be 'sandbox' or a numeric id")
        return None
    number = int(value)
    if not 1 <= number <= MAX_ID:
        c.add(where, f"{value} is outside 1..{MAX_ID} (root, 0, is never allowed)")
        return None
    return str(number)


def _check_rule(c: _Checker, key: Any, block: Any) -> NetworkRule | None:
    where = f"network_policies.{key}"
    if not isinstance(key, str) or not key:
        c.add("network_policies", f"rule key {key!r} must be non-empty text")
        return None
    if key.startswith("_provider_"):
        c.add(where, "rule keys starting with '_provider_' are reserved for providers")
    rule = c.mapping(block if block is not None else {}, where, RULE_FIELDS)
    if rule is None:
        return None
    name = key
    if "name" in rule:
        name = c.text(rule["name"], f"{where}.name") or key
    endpoints: list[Endpoint] = []
    if "endpoints" in rule:
        items = rule["endpoints"]
        if not isinstance(items, list):
            c.add(f"{where}.endpoints", f"expected a list, got {_kind(items)}")
        else:
            for i, item in enumerate(items):
                endpoint = _check_endpoint(c, item, f"{where}.endpoints[{i}]")
                if endpoint is not None:
                    endpoints.append(endpoint)
    binaries: list[str] = []
    if "binaries" in rule:
        items = rule["binaries"]
        if not isinstance(items, list):
            c.add(f"{where}.binaries", f"expected a list, got {_kind(items)}")
        else:
            for i, item in enumerate(items):
                b = c.mapping(item, f"{where}.binaries[{i}]", ("path",))
                if b is None:
                    continue
                if "path" not in b:
                    c.add(f"{where}.binaries[{i}].path", "required")
                elif c.text(b["path"], f"{where}.binaries[{i}].path") is not None:
                    if not b["path"].startswith("/"):
                        c.add(f"{where}.binaries[{i}].path", f"{b['path']!r} is not an absolute path")
                    else:
                        binaries.append(b["path"])
    return NetworkRule(key=key, name=name, endpoints=tuple(endpoints), binaries=tuple(binaries))


def _check_host(c: _Checker, host: str, where: str) -> None:
    if not host or len(host) > 253 or any(ch.isspace() for ch in host) or "/" in host \
            or (":" in host.strip("[]") and not _is_ip(host)):
        c.add(where, f"{host!r} is not a host name or IP address")
        return
    if _is_ip(host):
        return
    labels = host.split(".")
    if "*" in host:
        if len(labels) < 3:
            c.add(where, f"wildcard host {host!r} needs at least three labels (like *.example.com)")
        for i, label in enumerate(labels):
            if "**" in label and (i != 0 or label != "**"):
                c.add(where, f"{host!r}: '**' is allowed only as the whole first label")
            elif "*" in label and i > 0 and label != "*":
                c.add(where, f"{host!r}: after the first label, '*' must be a whole label")
    for label in labels:
        if not _LABEL_RE.match(label.replace("**", "*")):
            c.add(where, f"{host!r} has an invalid label {label!r}")
            break


def _is_ip(host: str) -> bool:
    import ipaddress

    try:
        ipaddress.ip_address(host.strip("[]"))
        return True
    except ValueError:
        return False


def _check_endpoint(c: _Checker, item: Any, where: str) -> Endpoint | None:
    e = c.mapping(item, where, ENDPOINT_FIELDS)
    if e is None:
        return None
    before = len(c.problems)
    host = None
    if "host" in e:
        host = c.text(e["host"], f"{where}.host")
        if host is not None:
            _check_host(c, host, f"{where}.host")
    allowed_ips: list[str] = []
    if "allowed_ips" in e:
        import ipaddress

        for i, value in enumerate(c.text_list(e["allowed_ips"], f"{where}.allowed_ips")):
            try:
                ipaddress.ip_network(value, strict=False)
                allowed_ips.append(value)
            except ValueError:
                c.add(f"{where}.allowed_ips[{i}]", f"{value!r} is not an IP address or CIDR range")
    if "host" not in e and "allowed_ips" not in e:
        c.add(where, "needs host (or allowed_ips)")
    ports: list[int] = []
    if "port" in e and "ports" in e:
        c.add(where, "set port or ports, not both")
    elif "port" in e:
        port = c.integer(e["port"], f"{where}.port", 1, 65535)
        if port is not None:
            ports.append(port)
    elif "ports" in e:
        if not isinstance(e["ports"], list) or not e["ports"]:
            c.add(f"{where}.ports", "expected a non-empty list of ports")
        else:
            for i, value in enumerate(e["ports"]):
                port = c.integer(value, f"{where}.ports[{i}]", 1, 65535)
                if port is not None:
                    ports.append(port)
    else:
        c.add(where, "needs port (or ports)")

    protocol = c.text(e["protocol"], f"{where}.protocol", choices=PROTOCOLS) if "protocol" in e else None
    tls = c.text(e["tls"], f"{where}.tls", choices=TLS_MODES) if "tls" in e else None
    enforcement = "audit"
    if "enforcement" in e:
        enforcement = c.text(e["enforcement"], f"{where}.enforcement", choices=ENFORCEMENTS) or "audit"
    access = c.text(e["access"], f"{where}.access", choices=ACCESS_PRESETS) if "access" in e else None
    path = c.text(e["path"], f"{where}.path") if "path" in e else None
    for flag in ("allow_encoded_slash", "request_body_credential_rewrite", "websocket_credential_rewrite",
                 "allow_uninspected_credentials"):
        if flag in e:
            c.boolean(e[flag], f"{where}.{flag}")

    provider = None
    if "credential_binding" in e:
        binding = c.mapping(e["credential_binding"], f"{where}.credential_binding", ("provider",))
        if binding is not None:
            if "provider" not in binding:
                c.add(f"{where}.credential_binding.provider", "required")
            else:
                provider = c.text(binding["provider"], f"{where}.credential_binding.provider")
    if "credential_signing" in e:
        c.text(e["credential_signing"], f"{where}.credential_signing", choices=SIGNING)
        if "signing_service" not in e:
            c.add(f"{where}.signing_service", "required with credential_signing")
        if "request_body_credential_rewrite" in e:
            c.add(where, "credential_signing cannot be combined with request_body_credential_rewrite")
    for name in ("signing_service", "signing_region"):
        if name in e:
            c.text(e[name], f"{where}.{name}")
            if "credential_signing" not in e:
                c.add(f"{where}.{name}", "only used with credential_signing")
    if "persisted_queries" in e:
        c.text(e["persisted_queries"], f"{where}.persisted_queries", choices=("deny", "allow_registered"))
    if "graphql_persisted_queries" in e and not isinstance(e["graphql_persisted_queries"], Mapping):
        c.add(f"{where}.graphql_persisted_queries", f"expected a mapping, got {_kind(e['graphql_persisted_queries'])}")
    if "graphql_max_body_bytes" in e:
        c.integer(e["graphql_max_body_bytes"], f"{where}.graphql_max_body_bytes", 1, 2**31 - 1)
    allow_all_mcp = False
    if "mcp" in e:
        mcp = c.mapping(e["mcp"], f"{where}.mcp",
                        ("versions", "max_body_bytes", "strict_tool_names", "allow_all_known_mcp_methods"))
        if mcp is not None:
            if "versions" in mcp:
                for i, v in enumerate(c.text_list(mcp["versions"], f"{where}.mcp.versions")):
                    if v not in MCP_VERSIONS:
                        c.add(f"{where}.mcp.versions[{i}]", f"{v!r} is not one of {', '.join(MCP_VERSIONS)}")
            if "max_body_bytes" in mcp:
                c.integer(mcp["max_body_bytes"], f"{where}.mcp.max_body_bytes", 1, 2**31 - 1)
            for flag in ("strict_tool_names", "allow_all_known_mcp_methods"):
                if flag in mcp:
                    c.boolean(mcp[flag], f"{where}.mcp.{flag}")
            allow_all_mcp = mcp.get("allow_all_known_mcp_methods") is True
    if "json_rpc" in e:
        jr = c.mapping(e["json_rpc"], f"{where}.json_rpc", ("max_body_bytes",))
        if jr is not None and "max_body_bytes" in jr:
            c.integer(jr["max_body_bytes"], f"{where}.json_rpc.max_body_bytes", 1, 2**31 - 1)

    matcher_protocol = protocol if protocol in MATCHER_FIELDS else "rest"
    rules = _check_rules(c, e.get("rules"), f"{where}.rules", matcher_protocol, wrapped=True) \
        if "rules" in e else []
    deny_rules = _check_rules(c, e.get("deny_rules"), f"{where}.deny_rules", matcher_protocol, wrapped=False) \
        if "deny_rules" in e else []

    # Constraints between fields (OpenShell's "Endpoint Constraints").
    if access is not None and "rules" in e:
        c.add(where, "access and rules cannot be combined")
    if protocol in ("rest", "websocket", "graphql") and access is None and "rules" not in e:
        c.add(where, f"a {protocol} endpoint needs access or rules")
    if protocol in ("mcp", "json-rpc"):
        if access is not None:
            c.add(f"{where}.access", f"{protocol} endpoints do not accept access presets; use rules")
        elif "rules" not in e and not (protocol == "mcp" and allow_all_mcp):
            c.add(where, f"a {protocol} endpoint needs rules")
    if "deny_rules" in e:
        if protocol is None:
            c.add(f"{where}.deny_rules", "require protocol")
        elif protocol != "mcp" and access is None and "rules" not in e:
            c.add(f"{where}.deny_rules", "require rules or access")
    if protocol == "tcp":
        if host is None or _is_ip(host or ""):
            c.add(where, "protocol tcp needs a host name (not an IP address or allowed_ips only)")
        for name in REQUEST_FIELDS:
            if name in e:
                c.add(f"{where}.{name}", "not accepted with protocol tcp")
    if tls == "skip" and protocol in REQUEST_PROTOCOLS:
        c.add(f"{where}.tls", f"skip relays TLS uninspected; it cannot be combined with protocol {protocol}")
    if protocol is None and (access is not None or "rules" in e):
        pass  # allowed by OpenShell; they have no effect (an uninspected endpoint)

    if len(c.problems) != before:
        return None
    return Endpoint(
        where=where, host=host, ports=tuple(ports), path=path, allowed_ips=tuple(allowed_ips),
        protocol=protocol, tls=tls, enforcement=enforcement, access=access, rules=tuple(rules),
        deny_rules=tuple(deny_rules), credential_provider=provider, fields=frozenset(e.keys()),
    )


def _check_rules(c: _Checker, value: Any, where: str, protocol: str, *, wrapped: bool) -> list[Mapping[str, Any]]:
    if not isinstance(value, list):
        c.add(where, f"expected a list, got {_kind(value)}")
        return []
    out = []
    allowed = MATCHER_FIELDS[protocol]
    for i, item in enumerate(value):
        w = f"{where}[{i}]"
        if wrapped:
            outer = c.mapping(item, w, ("allow",))
            if outer is None:
                continue
            if "allow" not in outer:
                c.add(w, "each rule wraps its matcher in 'allow:'")
                continue
            matcher, mw = outer["allow"], f"{w}.allow"
        else:
            matcher, mw = item, w
        m = c.mapping(matcher, mw, allowed)
        if m is None:
            continue
        ok = True
        if protocol in ("rest", "websocket"):
            for name in ("method", "path"):
                if name not in m:
                    c.add(f"{mw}.{name}", "required")
                    ok = False
            if "method" in m and c.text(m["method"], f"{mw}.method") is not None:
                if protocol == "websocket" and m["method"] not in ("GET", "WEBSOCKET_TEXT", "*"):
                    c.add(f"{mw}.method", "websocket rules use GET, WEBSOCKET_TEXT or '*'")
                elif not _METHOD_RE.match(m["method"]):
                    c.add(f"{mw}.method", f"{m['method']!r} is not an HTTP method or '*'")
            if "path" in m and c.text(m["path"], f"{mw}.path") is not None and not m["path"].startswith("/"):
                c.add(f"{mw}.path", f"{m['path']!r} must start with '/'")
            if "query" in m:
                q = m["query"]
                if not isinstance(q, Mapping):
                    c.add(f"{mw}.query", f"expected a mapping of parameter -> glob, got {_kind(q)}")
                else:
                    for name, glob in q.items():
                        if isinstance(glob, Mapping):
                            g = c.mapping(glob, f"{mw}.query.{name}", ("any",))
                            if g is not None:
                                c.text_list(g.get("any"), f"{mw}.query.{name}.any")
                        else:
                            c.text(glob, f"{mw}.query.{name}")
        elif protocol == "graphql":
            if "operation_type" not in m:
                c.add(f"{mw}.operation_type", "required")
            else:
                c.text(m["operation_type"], f"{mw}.operation_type", choices=("query", "mutation", "subscription"))
            if "operation_name" in m:
                c.text(m["operation_name"], f"{mw}.operation_name")
            if "fields" in m:
                c.text_list(m["fields"], f"{mw}.fields")
        elif protocol == "mcp":
            if "method" in m:
                c.text(m["method"], f"{mw}.method")
            for name in ("tool",):
                if name in m and not isinstance(m[name], (str, Mapping)):
                    c.add(f"{mw}.{name}", "expected a glob or {any: [globs]}")
            if "params" in m:
                c.mapping(m["params"], f"{mw}.params", ("name",))
        elif protocol == "json-rpc":
            if "method" not in m:
                c.add(f"{mw}.method", "required")
            elif c.text(m["method"], f"{mw}.method") is not None and "*" in m["method"] and m["method"] != "*":
                c.add(f"{mw}.method", "JSON-RPC methods are exact names or '*'")
        if ok:
            out.append(outer if wrapped else m)  # type: ignore[possibly-undefined]
    return out
