"""A running campaign's network policy, narrowed or widened live (issue 17, item 4), web side.

OpenShell lets a running sandbox's ``network_policies`` change; tco does the
same through its metering proxies. An admin or a launcher of the campaign's
team (capability ``control``) submits the new ``network_policies`` (YAML in
OpenShell's schema); :func:`network_policy_change` checks it exactly as a
launch checks a policy (``launch.check_policy``: the runner's validator, the
sandbox's bind check, every admin ceiling of the team and agent definition,
the registered model endpoints: only those ever get a credential), then writes
``campaigns/<id>/network.json`` (execution/spool.py ``NetworkPolicyFile``)
atomically with the next ``policy_version``. Every runner of the campaign
re-checks it (execution/sandbox/live_network.py) and applies it to new
requests of its metering proxy within a second; requests in flight go on.
Only the network part changes: the filesystem, process and landlock parts
stay as launched.

Every request, allowed or refused, writes one audit entry (action
``network_policy``, target ``campaign:<id>``).
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import fcntl
import json
import os
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.utils import timezone

from dashboards.core import limits
from dashboards.core.audit import audit, refused
from dashboards.core.errors import LaunchError
from dashboards.core.roles import user_can
from dashboards.launch import policy, spool
from dashboards.models import Campaign, CampaignStatus
from execution.sandbox.live_network import with_network
from execution.sandbox.policy import PolicyError, parse_yaml
from execution.spool import NetworkPolicyFile, NetworkPolicyFileError, parse_stage_time

ACTION = "network_policy"
#: Campaign states whose network policy may change (tasks may be running or still to start).
CHANGEABLE = (CampaignStatus.SUBMITTING, CampaignStatus.SUBMITTED)


@dataclasses.dataclass
class NetworkPolicyInForce:
    """What a campaign's runners route new requests by: ``version`` (0: the launch policy),
    ``changed_at`` (aware UTC datetime, None for the launch policy), ``changed_by`` (user name,
    "" for the launch policy), ``network_policies`` (mapping, OpenShell's schema), ``yaml``
    (the same as YAML text, ``network_policies:`` at the top), ``error`` (the file could not
    be read: shown instead)."""

    version: int
    changed_at: dt.datetime | None
    changed_by: str
    network_policies: dict[str, Any]
    yaml: str
    error: str = ""


def _yaml(network_policies: dict[str, Any]) -> str:
    import yaml

    return yaml.safe_dump({"network_policies": network_policies}, sort_keys=False) if network_policies \
        else "network_policies: {}\n"


def _json_ready(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def network_policy_in_force(campaign: Campaign) -> NetworkPolicyInForce:
    """The network policy in force for ``campaign``: the last change written to the spool, else
    the launch policy's network part. Never raises: an unreadable file is reported in ``error``
    (with the launch policy shown)."""
    path = spool.spool_layout().network_policy_path(campaign.pk)
    error = ""
    try:
        current = NetworkPolicyFile.read(path)
    except FileNotFoundError:
        current = None
    except (OSError, NetworkPolicyFileError) as exc:
        current, error = None, f"the network policy file cannot be read: {exc}"
    if current is not None:
        return NetworkPolicyInForce(version=current.policy_version, changed_at=parse_stage_time(current.changed_at),
                                    changed_by=current.changed_by, network_policies=current.network_policies,
                                    yaml=_yaml(current.network_policies))
    try:
        network = dict(policy.effective_policy(campaign.policy).data.get("network_policies") or {})
    except LaunchError as exc:
        network, error = {}, error or str(exc)
    network = _json_ready(network)
    return NetworkPolicyInForce(version=0, changed_at=None, changed_by="", network_policies=network,
                                yaml=_yaml(network), error=error)


def _parse(text: str) -> dict[str, Any]:
    """The ``network_policies`` mapping of ``text`` (YAML whose only top-level key is
    ``network_policies``). Raises LaunchError."""
    text = (text or "").strip()
    if len(text.encode("utf-8", "surrogatepass")) > limits.POLICY_MAX_BYTES:
        raise LaunchError(f"network policy is larger than {limits.POLICY_MAX_BYTES // 1024} KB")
    try:
        data = parse_yaml(text) if text else {}
    except PolicyError as exc:
        raise LaunchError("network policy: " + "; ".join(exc.problems)) from None
    if data is None:
        data = {}
    if not isinstance(data, dict) or set(data) - {"network_policies"}:
        raise LaunchError("network policy: give a mapping with the one key network_policies "
                          "(the filesystem, process and landlock parts cannot change while the campaign runs)")
    network = data.get("network_policies") or {}
    if not isinstance(network, dict):
        raise LaunchError("network policy: network_policies must be a mapping of named rules")
    return network


def may_change(user: AbstractBaseUser, campaign: Campaign) -> bool:
    """Whether ``user`` may change ``campaign``'s network policy: an admin, or a launcher of its
    team (capability ``control``)."""
    return user_can(user, "control", campaign.team)


def refuse_change(user: AbstractBaseUser, campaign: Campaign, text: str) -> Exception:
    """Audit a refused change by a user without the capability and return the ActionRefused to raise."""
    return refused(user, ACTION, f"campaign:{campaign.pk}", {"campaign": campaign.pk, "text": (text or "")[:2000]},
                   f"you may not change the network policy of campaigns of team {campaign.team.name}")


def network_policy_change(*, user: AbstractBaseUser, campaign: Campaign, text: str) -> NetworkPolicyFile:
    """Make ``text`` (YAML: ``network_policies: {...}`` in OpenShell's schema; empty: no network)
    the network policy of the running ``campaign`` (module doc). Returns the file written, with
    its ``policy_version`` (one more than the one in force).

    Raises ActionRefused (the user has no ``control`` capability on the campaign's team) and
    LaunchError (the campaign has ended; a malformed policy; one wider than a ceiling or binding
    a credential to an unregistered endpoint); both audited, nothing written. OSError when the
    spool cannot be written (audited as failed).
    """
    target = f"campaign:{campaign.pk}"
    params: dict[str, Any] = {"campaign": campaign.pk, "text": (text or "")[:2000]}
    if not may_change(user, campaign):
        raise refuse_change(user, campaign, text)
    if campaign.status not in CHANGEABLE:
        raise refused(user, ACTION, target, params, f"campaign {campaign.pk} is {campaign.status}: its network "
                                                    "policy can no longer change", error=LaunchError)
    try:
        network = _parse(text)
        try:
            merged = with_network(policy.effective_policy(campaign.policy), network)
        except PolicyError as exc:
            raise LaunchError("network policy: " + "; ".join(exc.problems)) from None
        policy.check_policy(merged.to_yaml(), campaign.team, campaign.agent_definition)
    except LaunchError as exc:
        raise refused(user, ACTION, target, params, str(exc), error=LaunchError) from None
    network = _json_ready(network)
    layout = spool.spool_layout()
    path = layout.network_policy_path(campaign.pk)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path + ".lock", "a") as lock:  # one writer at a time: versions never repeat
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                previous = NetworkPolicyFile.read(path).policy_version
            except FileNotFoundError:
                previous = 0
            except NetworkPolicyFileError:
                previous = _version_of_broken(path)
            written = NetworkPolicyFile(
                campaign_id=campaign.pk, policy_version=previous + 1,
                changed_at=timezone.now().astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
                changed_by=user.get_username(), network_policies=network)
            written.write(path)
    except OSError as exc:
        audit(user=user, action=ACTION, target=target, params={**params, "status": "failed"}, ok=False,
              result=f"failed: the spool could not be written: {exc.strerror or exc}")
        raise
    audit(user=user, action=ACTION, target=target,
          params={**params, "status": "done", "policy_version": written.policy_version, "network_policies": network},
          ok=True, result=f"network policy version {written.policy_version} written; the campaign's runners apply "
                          "it to new requests")
    return written


def _version_of_broken(path: str) -> int:
    """The ``policy_version`` of a file that no longer parses, if it can be read at all, else 0
    (the next version must still rise past whatever a runner may have applied)."""
    try:
        with open(path, "rb") as fh:
            value = json.loads(fh.read()).get("policy_version")
    except (OSError, ValueError, AttributeError):
        return 0
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


__all__ = ["ACTION", "CHANGEABLE", "NetworkPolicyInForce", "network_policy_in_force", "may_change", "refuse_change",
           "network_policy_change"]
