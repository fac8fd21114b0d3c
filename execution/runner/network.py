"""The live network policy of a running task (bubblewrap runtime): follow ``network.json``.

See docs/runner.md ("Live network policy"). The checks themselves are
execution/sandbox/live_network.py's; a change that passes them reaches the
metering proxy through :meth:`ProxyStarter.replace_rules
<execution.runner.proxy_start.ProxyStarter.replace_rules>`.
"""
from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping

from execution.runner.clock import StageClock
from execution.runner.config import MAX_NETWORK_CHANGES_NOTED, NETWORK_POLICY_POLL_S, PROXY_STOP_S, RunnerError
from execution.runner.proxy_start import ProxyStarter


class NetworkPolicyWatch(threading.Thread):
    """Call ``on_change`` whenever the file at ``path`` changes (size, mtime or inode, looked at
    every ``interval_s`` seconds), until ``done`` is set."""

    def __init__(self, path: str, interval_s: float, on_change: Callable[[], None]) -> None:
        super().__init__(daemon=True, name="tco-network-policy-watch")
        self.path, self.interval_s, self.on_change = path, interval_s, on_change
        self.done = threading.Event()
        self.seen = self.signature()

    def signature(self) -> tuple | None:
        """``(inode, size, mtime_ns)`` of the file, or None while it does not exist."""
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return st.st_ino, st.st_size, st.st_mtime_ns

    def run(self) -> None:
        """Look every ``interval_s`` seconds until ``done`` is set."""
        while not self.done.wait(self.interval_s):
            now = self.signature()
            if now is not None and now != self.seen:
                self.seen = now
                self.on_change()


class LiveNetworkPolicy:
    """Follows one campaign's network policy file (``path``) for this task.

    ``base``: the launch policy (execution/sandbox/policy/model.py ``Policy``); ``ceilings``:
    ``[(label, policy or {"network_policies": ...})]`` a change may not pass; ``proxy``: where
    an accepted change goes; ``info``: the record's ``sandbox.network_policy`` (``version`` in
    force, ``changes`` noted), updated here; ``campaign_id``: the campaign the file must name.
    """

    def __init__(self, *, base, ceilings: list, proxy: ProxyStarter, clock: StageClock, info: dict, path: str,
                 campaign_id: str) -> None:
        self.base, self.ceilings, self.proxy, self.clock = base, ceilings, proxy, clock
        self.info, self.path, self.campaign_id = info, path, campaign_id
        self.seen = 0  # the highest policy_version looked at
        self.watch = NetworkPolicyWatch(path, NETWORK_POLICY_POLL_S, self.changed)

    def start(self) -> None:
        """Apply the file present now (before the agent starts), then watch it."""
        self.changed()
        self.watch.start()

    def stop(self) -> None:
        """Stop watching; waits for a change being applied (at most the proxy's stop time)."""
        self.watch.done.set()
        if self.watch.is_alive():
            self.watch.join(PROXY_STOP_S)

    def note(self, version, error: str | None) -> None:
        """Note a change (``version``, or None for an unreadable file) as applied (``error``
        None) or refused; past :data:`MAX_NETWORK_CHANGES_NOTED`, only count it."""
        info = self.info
        if len(info["changes"]) >= MAX_NETWORK_CHANGES_NOTED:
            info["changes_not_noted"] = info.get("changes_not_noted", 0) + 1
            return
        info["changes"].append({"version": version, "at": self.clock.iso(), "applied": error is None,
                                "error": error})

    def changed(self) -> None:
        """Read the campaign's network policy file; apply a higher version that passes the checks,
        note a refused one (the rules in force stay). Never raises."""
        from execution.spool.network import NetworkPolicyFile, NetworkPolicyFileError

        try:
            changed = NetworkPolicyFile.read(self.path)
        except FileNotFoundError:
            return
        except (OSError, NetworkPolicyFileError) as exc:
            self.note(None, f"network policy file refused: {exc}"[:500])
            return
        version = changed.policy_version
        if version <= self.seen:
            return
        self.seen = version
        if str(changed.campaign_id) != str(self.campaign_id):
            self.note(version, f"network policy file names campaign {changed.campaign_id}")
            return
        try:
            self.apply(changed.network_policies, version)
        except Exception as exc:  # noqa: BLE001 - refused: the previous rules stay
            self.note(version, str(exc)[:1000])
        else:
            self.note(version, None)

    def apply(self, network_policies: Mapping, version: int) -> None:
        """Check ``network_policies`` (execution/sandbox/live_network.py) and make it the rules the
        proxy routes new requests by. Raises PolicyError, ValueError (refused; nothing changed)."""
        from execution.sandbox.live_network import network_problems, with_network
        from execution.sandbox.policy.model import PolicyError

        policy = with_network(self.base, network_policies)
        problems = network_problems(policy, self.ceilings)
        if problems:
            raise PolicyError(["wider than allowed: " + "; ".join(problems)])
        self.proxy.replace_rules(policy.proxy_policy(), version)
        self.info["version"] = version


def network_ceilings(spec: Mapping, policy) -> list:
    """The ceilings a change may not pass: the spec's ``network_ceilings`` as ``(label,
    {"network_policies": ...})``, or without them the launch ``policy`` itself. Raises
    RunnerError for a malformed list."""
    ceilings = spec.get("network_ceilings") or []
    if not isinstance(ceilings, list) or not all(
            isinstance(c, dict) and isinstance(c.get("network_policies"), dict) for c in ceilings):
        raise RunnerError("runner spec: network_ceilings must be a list of {label, network_policies}")
    return [(str(c.get("label") or "ceiling"), {"network_policies": c["network_policies"]})
            for c in ceilings] or [("the launch policy", policy)]
