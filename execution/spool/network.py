"""The live network policy file, ``campaigns/<campaign>/network.json`` (issue 17, item 4).

Written by the web side, read by each running runner (docs/runner.md, "Live
network policy"). Standard library only.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from execution.spool.contract import MAX_NETWORK_POLICY_BYTES, NETWORK_POLICY_FILE_VERSION, RecordError, SpoolError, \
    is_int
from execution.spool.files import write_json_atomic
from execution.spool.layout import check_campaign_id
from execution.spool.record import parse_stage_time

__all__ = ["NetworkPolicyFileError", "NetworkPolicyFile"]


class NetworkPolicyFileError(ValueError):
    """A network policy file that does not follow this contract; ``str(err)`` names the field."""


@dataclasses.dataclass(frozen=True)
class NetworkPolicyFile:
    """``campaigns/<campaign>/network.json``: a running campaign's network policy, changed live.

    JSON shape (version :data:`NETWORK_POLICY_FILE_VERSION`)::

        {"version": 1, "campaign_id": str|int, "policy_version": int >= 1,
         "changed_at": ISO-8601 UTC text with a zone, "changed_by": str,
         "network_policies": {mapping in OpenShell's schema (execution/sandbox/policy/)}}

    ``policy_version`` rises by one with every change (the launch policy is version 0); a
    runner applies a file only when its ``policy_version`` is higher than the one in force,
    to new requests of its metering proxy. Written by the web side only, atomically
    (:func:`write_json_atomic`); this type checks the shape, the runner checks the policy
    itself (validator, ceilings, registered endpoints).
    """

    campaign_id: str | int
    policy_version: int
    changed_at: str
    changed_by: str
    network_policies: dict[str, Any]
    version: int = NETWORK_POLICY_FILE_VERSION

    def __post_init__(self) -> None:
        if self.version != NETWORK_POLICY_FILE_VERSION:
            raise NetworkPolicyFileError(f"version must be {NETWORK_POLICY_FILE_VERSION}")
        try:
            check_campaign_id(self.campaign_id)
        except SpoolError as exc:
            raise NetworkPolicyFileError(f"campaign_id: {exc}") from None
        if not is_int(self.policy_version) or self.policy_version < 1:
            raise NetworkPolicyFileError("policy_version must be an integer >= 1")
        try:
            if parse_stage_time(self.changed_at) is None:
                raise RecordError("empty")
        except RecordError:
            raise NetworkPolicyFileError("changed_at must be an ISO-8601 time with a zone") from None
        if not isinstance(self.changed_by, str):
            raise NetworkPolicyFileError("changed_by must be text")
        if not isinstance(self.network_policies, dict):
            raise NetworkPolicyFileError("network_policies must be a mapping of named rules")

    def to_json(self) -> dict[str, Any]:
        """The JSON mapping."""
        return {"version": self.version, "campaign_id": self.campaign_id, "policy_version": self.policy_version,
                "changed_at": self.changed_at, "changed_by": self.changed_by,
                "network_policies": self.network_policies}

    @classmethod
    def from_json(cls, data: Any) -> "NetworkPolicyFile":
        """Parse the mapping. Raises :class:`NetworkPolicyFileError` naming the first wrong field."""
        if not isinstance(data, dict):
            raise NetworkPolicyFileError("a network policy file is a JSON object")
        fields = ("version", "campaign_id", "policy_version", "changed_at", "changed_by", "network_policies")
        missing = [f for f in fields if f not in data]
        if missing:
            raise NetworkPolicyFileError(f"{missing[0]} is required")
        if isinstance(data["version"], bool):
            raise NetworkPolicyFileError(f"version must be {NETWORK_POLICY_FILE_VERSION}")
        return cls(**{f: data[f] for f in fields})

    @classmethod
    def read(cls, path: str | os.PathLike) -> "NetworkPolicyFile":
        """Read and parse ``path`` (at most :data:`MAX_NETWORK_POLICY_BYTES`). Raises OSError
        (FileNotFoundError when no change was made) or :class:`NetworkPolicyFileError`."""
        with open(path, "rb") as fh:
            raw = fh.read(MAX_NETWORK_POLICY_BYTES + 1)
        if len(raw) > MAX_NETWORK_POLICY_BYTES:
            raise NetworkPolicyFileError(f"larger than {MAX_NETWORK_POLICY_BYTES} bytes")
        try:
            data = json.loads(raw)
        except ValueError as exc:
            raise NetworkPolicyFileError(f"not JSON: {exc}") from None
        return cls.from_json(data)

    def write(self, path: str | os.PathLike) -> None:
        """Write the file atomically (:func:`write_json_atomic`). Raises OSError."""
        write_json_atomic(path, self.to_json())
