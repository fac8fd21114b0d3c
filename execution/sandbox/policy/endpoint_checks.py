"""Validating one ``network_policies.<key>.endpoints[]`` entry and its rules.

OpenShell's "Endpoint Constraints" between fields included. Standard library only.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from execution.sandbox.policy.checker import Checker, kind
from execution.sandbox.policy.model import Endpoint
from execution.sandbox.policy.schema import (ACCESS_PRESETS, ENDPOINT_FIELDS, ENFORCEMENTS, LABEL_RE, MATCHER_FIELDS,
                                             MCP_VERSIONS, METHOD_RE, PROTOCOLS, REQUEST_FIELDS, REQUEST_PROTOCOLS,
                                             SIGNING, TLS_MODES)

__all__ = ["check_endpoint", "check_host", "check_rules", "is_ip"]


def check_host(c: Checker, host: str, where: str) -> None:
    """Check an endpoint's ``host`` (a name, an IP address, or a wildcard of OpenShell's shapes);
    problems go to ``c`` under ``where``."""
    if not host or len(host) > 253 or any(ch.isspace() for ch in host) or "/" in host \
            or (":" in host.strip("[]") and not is_ip(host)):
        c.add(where, f"{host!r} is not a host name or IP address")
        return
    if is_ip(host):
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
        if not LABEL_RE.match(label.replace("**", "*")):
            c.add(where, f"{host!r} has an invalid label {label!r}")
            break


def is_ip(host: str) -> bool:
    """Whether ``host`` (``[...]`` allowed) is an IPv4 or IPv6 address."""
    import ipaddress

    try:
        ipaddress.ip_address(host.strip("[]"))
        return True
    except ValueError:
        return False


def check_endpoint(c: Checker, item: Any, where: str) -> Endpoint | None:
    """Check one ``endpoints[]`` entry (``item``) at ``where``: its fields, types, enumerations and
    OpenShell's endpoint constraints. Returns the :class:`~execution.sandbox.policy.model.Endpoint`,
    or None when it has problems (added to ``c``)."""
    e = c.mapping(item, where, ENDPOINT_FIELDS)
    if e is None:
        return None
    before = len(c.problems)
    host = None
    if "host" in e:
        host = c.text(e["host"], f"{where}.host")
        if host is not None:
            check_host(c, host, f"{where}.host")
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
        c.add(f"{where}.graphql_persisted_queries", f"expected a mapping, got {kind(e['graphql_persisted_queries'])}")
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
    rules = check_rules(c, e.get("rules"), f"{where}.rules", matcher_protocol, wrapped=True) \
        if "rules" in e else []
    deny_rules = check_rules(c, e.get("deny_rules"), f"{where}.deny_rules", matcher_protocol, wrapped=False) \
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
        if host is None or is_ip(host or ""):
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


def check_rules(c: Checker, value: Any, where: str, protocol: str, *, wrapped: bool) -> list[Mapping[str, Any]]:
    """Check an endpoint's ``rules`` (``wrapped``: each in ``allow:``) or ``deny_rules`` for
    ``protocol``'s matchers. Returns the well-formed ones (their ``allow`` wrapper kept when wrapped)."""
    if not isinstance(value, list):
        c.add(where, f"expected a list, got {kind(value)}")
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
                elif not METHOD_RE.match(m["method"]):
                    c.add(f"{mw}.method", f"{m['method']!r} is not an HTTP method or '*'")
            if "path" in m and c.text(m["path"], f"{mw}.path") is not None and not m["path"].startswith("/"):
                c.add(f"{mw}.path", f"{m['path']!r} must start with '/'")
            if "query" in m:
                q = m["query"]
                if not isinstance(q, Mapping):
                    c.add(f"{mw}.query", f"expected a mapping of parameter -> glob, got {kind(q)}")
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
