"""A running campaign's network policy, changed live (issue 17, item 4): the one check both sides run.

OpenShell lets a sandbox's ``network_policies`` change while it runs; tco does
the same through its metering proxy. The web side (dashboards/netpolicy.py)
writes the new ``network_policies`` to the spool (execution/spool/network.py
``NetworkPolicyFile``); each runner of the campaign re-checks it here before
its proxy applies it, so a file the web side should have refused is refused on
the execution host too (defense in depth). Pure: no Django, no file system.

A change replaces the launch policy's ``network_policies`` only (the
filesystem, process and landlock parts never change while the sandbox runs);
:func:`with_network` builds the policy that results, :func:`network_problems`
lists every way its network part is wider than a ceiling's network part
(:func:`execution.sandbox.ceiling.narrowing_problems`, on the network parts
alone) or than what the bubblewrap runtime can enforce.
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping

from .ceiling import narrowing_problems
from .policy.model import Policy, PolicyError
from .policy.validate import validate_policy

__all__ = ["with_network", "network_part", "network_problems"]


def with_network(base: Policy, network_policies: Any) -> Policy:
    """``base`` with its ``network_policies`` replaced by ``network_policies`` (a mapping of named
    rules in OpenShell's schema; empty: no network), validated by the runner's validator
    (execution/sandbox/policy/). Raises PolicyError naming each problem."""
    if not isinstance(network_policies, Mapping):
        raise PolicyError(["network_policies: expected a mapping of named rules"])
    data = {k: v for k, v in dict(base.data or {}).items() if k != "network_policies"}
    if network_policies:
        data["network_policies"] = dict(network_policies)
    return validate_policy(data)


def network_part(policy: Policy | Mapping[str, Any]) -> Policy:
    """A policy holding only the network part (``network_policies``, ``network_middlewares``) of
    ``policy`` (a validated Policy or a mapping with those keys). Raises PolicyError."""
    data = policy.data if isinstance(policy, Policy) else policy
    data = dict(data or {})
    return validate_policy({"version": 1, **{k: data[k] for k in ("network_policies", "network_middlewares")
                                             if data.get(k)}})


def network_problems(policy: Policy, ceilings: Iterable[tuple[str, Policy | Mapping[str, Any]]]) -> list[str]:
    """Every way the network part of ``policy`` is wider than the network part of one of
    ``ceilings`` (``[(label, ceiling)]``; each problem names its ceiling), and every network
    field the bubblewrap runtime refuses (``Policy.refusals``). ``[]``: it may be applied.
    Raises PolicyError for a ceiling that does not validate."""
    mine = network_part(policy)
    problems = [str(f) for f in mine.refusals()]
    for label, ceiling in ceilings:
        problems += [f"{p} (ceiling: {label})" for p in narrowing_problems(mine, network_part(ceiling))]
    return problems
