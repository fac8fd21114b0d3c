"""Validating a parsed sandbox policy against the schema: :func:`validate_policy`.

Unknown fields (with a "did you mean" hint), types, enumerations and the
documented constraints; every problem at once in one PolicyError. One
network endpoint's checks are in endpoint_checks.py. Standard library only.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from execution.sandbox.policy.checker import Checker, kind
from execution.sandbox.policy.endpoint_checks import check_endpoint
from execution.sandbox.policy.model import Endpoint, NetworkRule, Policy, PolicyError
from execution.sandbox.policy.schema import (COMPATIBILITY, FILESYSTEM_FIELDS, LANDLOCK_FIELDS, MAX_ID,
                                             MAX_MIDDLEWARES, MAX_PATH_BYTES, MAX_PATHS, MIDDLEWARE_FIELDS,
                                             ON_ERROR, PROCESS_FIELDS, RULE_FIELDS, TOP_FIELDS)

__all__ = ["validate_policy"]


def validate_policy(data: Any, *, text: str | None = None) -> Policy:
    """Check a parsed policy against the schema; return a :class:`Policy` or raise PolicyError."""
    c = Checker()
    if data is None:
        raise PolicyError(["the policy is empty (it needs at least 'version: 1')"])
    top = c.mapping(data, "", TOP_FIELDS)
    if top is None:
        raise PolicyError(["the policy must be a mapping of fields (version, filesystem_policy, ...)"])

    if "version" not in top:
        c.add("version", "required (version: 1)")
    elif isinstance(top["version"], bool) or not isinstance(top["version"], int):
        c.add("version", f"expected the integer 1, got {kind(top['version'])}")
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
            c.add("network_policies", f"expected a mapping of named rules, got {kind(blocks)}")
        else:
            for key, block in blocks.items():
                rule = _check_rule(c, key, block)
                if rule is not None:
                    network.append(rule)

    middlewares: list[str] = []
    if "network_middlewares" in top:
        mws = top["network_middlewares"]
        if not isinstance(mws, Mapping):
            c.add("network_middlewares", f"expected a mapping of named middleware, got {kind(mws)}")
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
                    c.add(f"{where}.config", f"expected a mapping, got {kind(m['config'])}")
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


def _check_path(c: Checker, path: str, where: str, *, writable: bool) -> bool:
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


def _check_identity(c: Checker, value: Any, where: str) -> str | None:
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


def _check_rule(c: Checker, key: Any, block: Any) -> NetworkRule | None:
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
            c.add(f"{where}.endpoints", f"expected a list, got {kind(items)}")
        else:
            for i, item in enumerate(items):
                endpoint = check_endpoint(c, item, f"{where}.endpoints[{i}]")
                if endpoint is not None:
                    endpoints.append(endpoint)
    binaries: list[str] = []
    if "binaries" in rule:
        items = rule["binaries"]
        if not isinstance(items, list):
            c.add(f"{where}.binaries", f"expected a list, got {kind(items)}")
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
