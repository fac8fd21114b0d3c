"""Does a sandbox policy only narrow an admin's ceiling? (issue 11, finding 2)

A site's admin approves a *ceiling* per team or agent definition: a policy
in the same schema (execution/sandbox/policy/) holding the most a campaign
may ask for. :func:`narrowing_problems` compares a campaign's validated
:class:`~execution.sandbox.policy.model.Policy` with a ceiling's and lists every way
the policy asks for more; an empty list means it fits. Pure: no Django, no
file system (paths are compared as written, after the validator normalised
them; resolving links is the sandbox's part, ``bwrap.py``).

What "within" means, field by field:

- ``filesystem_policy``: each ``read_only`` path lies at or under a path the
  ceiling lists (read-only or read-write); each ``read_write`` path at or
  under a ceiling ``read_write`` path (a ceiling's ``/tmp``, ``/run`` and the
  other private directories cover only themselves: below them a policy path
  would be the host's); ``include_workdir`` only where the
  ceiling has it (a ceiling without ``filesystem_policy`` allows no path).
- ``network_policies``: each endpoint (host, every port, protocol) is an
  endpoint of the ceiling, with the same ``credential_binding`` provider (or
  none), ``tls`` no laxer (``skip`` only where the ceiling skips),
  ``enforcement`` no laxer (``audit`` only where the ceiling audits), and
  each of its rules (an ``access`` preset counts as its methods on ``/**``)
  covered by a rule of that ceiling endpoint: same method or ``*``, and the
  ceiling's path equal, ``/**``, or a ``<prefix>/**`` the path lies under.
  The policy rule's ``binaries`` must all be listed by the ceiling rule.
- ``process``: the same ``run_as_user`` and ``run_as_group`` (unset means
  ``sandbox``): a policy can never pick another identity than the ceiling's.
- ``landlock``: ``best_effort`` where the ceiling says ``hard_requirement``
  is a widening.
"""
from __future__ import annotations

import posixpath
from typing import TYPE_CHECKING

from .paths import PRIVATE_DIRS
from .policy.model import inside_id
from .policy.schema import ACCESS_METHODS

if TYPE_CHECKING:
    from .policy.model import Endpoint, NetworkRule, Policy

__all__ = ["narrowing_problems", "path_within"]


def path_within(path: str, roots: tuple[str, ...] | list[str]) -> bool:
    """Whether ``path`` is one of ``roots`` or lies under one (lexically, on ``/`` boundaries).

    A root that is one of the sandbox's private directories (``bwrap.PRIVATE_DIRS``: ``/tmp``,
    ``/run``, ...) stands for the sandbox's own tmpfs, not the host's tree: it covers only
    itself, never a host path below it (which the sandbox would bind from the host).
    """
    path = posixpath.normpath(path)
    for root in roots:
        root = posixpath.normpath(root)
        if path == root:
            return True
        if root in PRIVATE_DIRS:
            continue
        if root == "/" or path.startswith(root.rstrip("/") + "/"):
            return True
    return False


def _rules(endpoint: Endpoint) -> list[tuple[str, str]]:
    """``[(METHOD, path)]`` an endpoint allows (an access preset expanded to ``/**``)."""
    if endpoint.access is not None:
        return [(m, "/**") for m in ACCESS_METHODS[endpoint.access]]
    return [(str(r["allow"].get("method", "")).upper(), str(r["allow"].get("path", ""))) for r in endpoint.rules]


def _path_covered(path: str, ceiling_path: str) -> bool:
    if ceiling_path in ("/**", "**") or path == ceiling_path:
        return True
    if ceiling_path.endswith("/**"):
        prefix = ceiling_path[:-3]
        body = path[:-3] if path.endswith("/**") else path
        return body == prefix or body.startswith(prefix + "/")
    return False


def _rule_covered(rule: tuple[str, str], ceiling_rules: list[tuple[str, str]]) -> bool:
    method, path = rule
    return any(cm in ("*", method) and (cm == "*" or method != "*") and _path_covered(path, cp)
               for cm, cp in ceiling_rules)


def _same_host(a: str | None, b: str | None) -> bool:
    return a is not None and b is not None and a.lower().strip("[]") == b.lower().strip("[]")


def _endpoint_problems(rule: NetworkRule, endpoint: Endpoint, ceiling: Policy) -> list[str]:
    where = endpoint.where
    candidates = [(cr, ce) for cr, ce in ceiling.endpoints()
                  if _same_host(ce.host, endpoint.host) and ce.protocol == endpoint.protocol]
    if endpoint.host is None or not candidates:
        return [f"{where}: {endpoint.host or 'an address range'} ({endpoint.protocol or 'no protocol'}) is not an "
                "endpoint the ceiling allows"]
    problems = []
    for port in endpoint.ports:
        at_port = [(cr, ce) for cr, ce in candidates if port in ce.ports]
        if not at_port:
            problems.append(f"{where}: port {port} of {endpoint.host} is not allowed by the ceiling")
            continue
        fitting = [(cr, ce) for cr, ce in at_port if _endpoint_fits(rule, endpoint, cr, ce) == []]
        if not fitting:
            problems.extend(f"{where} (port {port}): {p}" for p in _endpoint_fits(rule, endpoint, *at_port[0]))
    return problems


def _endpoint_fits(rule: NetworkRule, endpoint: Endpoint, crule: NetworkRule, cend: Endpoint) -> list[str]:
    problems = []
    if endpoint.credential_provider != cend.credential_provider:
        problems.append(f"credential_binding {endpoint.credential_provider!r} differs from the ceiling's "
                        f"{cend.credential_provider!r}")
    if endpoint.tls == "skip" and cend.tls != "skip":
        problems.append("tls: skip is wider than the ceiling")
    if endpoint.enforcement == "audit" and cend.enforcement != "audit":
        if "enforcement" in endpoint.fields:
            problems.append("enforcement: audit is wider than the ceiling's enforce")
        else:  # the launcher never wrote "audit": say where it comes from
            problems.append("enforcement: not set, so it is audit (OpenShell's default: requests the rules do "
                            "not allow are logged, not refused), wider than the ceiling's enforce; "
                            "write enforcement: enforce")
    if endpoint.allowed_ips and not set(endpoint.allowed_ips) <= set(cend.allowed_ips or ()):
        problems.append("allowed_ips wider than the ceiling's")
    ceiling_rules = _rules(cend)
    for method, path in _rules(endpoint):
        if not _rule_covered((method, path), ceiling_rules):
            problems.append(f"rule {method} {path} is not allowed by the ceiling")
    extra = sorted(set(rule.binaries) - set(crule.binaries))
    if extra:
        problems.append(f"binaries {', '.join(extra)} are not in the ceiling's rule")
    return problems


def narrowing_problems(policy: Policy, ceiling: Policy) -> list[str]:
    """Every way ``policy`` allows more than ``ceiling`` (module doc), each starting with the
    policy's field; ``[]`` when the policy fits within the ceiling."""
    problems: list[str] = []
    # Filesystem.
    ceiling_any = tuple(ceiling.read_only or ()) + tuple(ceiling.read_write or ())
    for path in policy.read_only or ():
        if not path_within(path, ceiling_any):
            problems.append(f"filesystem_policy.read_only: {path} is outside the ceiling's paths")
    for path in policy.read_write or ():
        if not path_within(path, tuple(ceiling.read_write or ())):
            problems.append(f"filesystem_policy.read_write: {path} is outside the ceiling's read_write paths")
    if policy.include_workdir and not ceiling.include_workdir:
        problems.append("filesystem_policy.include_workdir: the ceiling does not include the work directory")
    # Process identity and landlock.
    for name, mine, theirs in (("run_as_user", policy.run_as_user, ceiling.run_as_user),
                               ("run_as_group", policy.run_as_group, ceiling.run_as_group)):
        if inside_id(mine) != inside_id(theirs):
            problems.append(f"process.{name}: {mine or 'sandbox'!r} differs from the ceiling's "
                            f"{theirs or 'sandbox'!r}")
    if ceiling.landlock_compatibility == "hard_requirement" and policy.landlock_compatibility != "hard_requirement":
        problems.append("landlock.compatibility: the ceiling requires hard_requirement")
    # Network.
    for rule, endpoint in policy.endpoints():
        problems.extend(_endpoint_problems(rule, endpoint, ceiling))
    extra_mw = sorted(set(policy.middlewares or ()) - set(ceiling.middlewares or ()))
    if extra_mw:
        problems.append(f"network_middlewares: {', '.join(extra_mw)} not in the ceiling")
    return problems
