"""The runner spec, ``campaigns/<campaign>/spec.json``: what the launch writes and each runner reads.

See :class:`RunnerSpec`; the runner's side of it is docs/runner.md. Standard library only.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
from decimal import Decimal, InvalidOperation
from typing import Any

from execution.spool.contract import SPEC_VERSION, SpecError, SpoolError, is_int, is_number
from execution.spool.files import write_json_atomic
from execution.spool.layout import check_campaign_id

__all__ = ["ModelEndpoint", "RunnerSpec"]

_ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
_ENDPOINT_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_HOST_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.-]{0,252}[A-Za-z0-9])?$|^\[[0-9A-Fa-f:.]+\]$")


@dataclasses.dataclass(frozen=True)
class ModelEndpoint:
    """An admin-registered model endpoint a campaign may use (written by the launch side,
    consumed by the runner and its metering proxy).

    ``name``: the registration's name; ``provider``: whose API it speaks
    (``anthropic``, ``openai``...); ``scheme``: ``http`` or ``https``;
    ``host``/``port``: where it listens (port 1-65535); ``path_prefixes``:
    URL paths it serves (each starting with ``/``); ``credential_name``: the
    name of its credential in the runner's credentials file.
    """

    name: str
    provider: str
    scheme: str
    host: str
    port: int
    path_prefixes: tuple[str, ...]
    credential_name: str

    def to_json(self) -> dict[str, Any]:
        """The spec's mapping of this endpoint."""
        return {"name": self.name, "provider": self.provider, "scheme": self.scheme, "host": self.host,
                "port": self.port, "path_prefixes": list(self.path_prefixes), "credential_name": self.credential_name}

    @classmethod
    def from_json(cls, data: Any, where: str = "model_endpoints[]") -> "ModelEndpoint":
        """Parse and check one endpoint mapping. Raises :class:`SpecError` naming ``where``."""
        if not isinstance(data, dict):
            raise SpecError(f"{where} must be a mapping")
        fields = ("name", "provider", "scheme", "host", "port", "path_prefixes", "credential_name")
        unknown = sorted(set(data) - set(fields))
        if unknown:
            raise SpecError(f"{where}: unknown field {unknown[0]!r}")
        missing = [f for f in fields if f not in data]
        if missing:
            raise SpecError(f"{where}: {missing[0]} is required")
        for key in ("name", "provider", "credential_name"):
            if not isinstance(data[key], str) or not _ENDPOINT_NAME_RE.match(data[key]):
                raise SpecError(f"{where}.{key} must be 1-64 letters, digits, '_', '.', '-'")
        if data["scheme"] not in ("http", "https"):
            raise SpecError(f"{where}.scheme must be http or https")
        if not isinstance(data["host"], str) or not _HOST_RE.match(data["host"]):
            raise SpecError(f"{where}.host must be a host name or address")
        if not is_int(data["port"]) or not 1 <= data["port"] <= 65535:
            raise SpecError(f"{where}.port must be a port number (1-65535)")
        prefixes = data["path_prefixes"]
        if not isinstance(prefixes, list) or not prefixes or not all(
                isinstance(p, str) and p.startswith("/") and not any(c in p for c in "\0\r\n?#") for p in prefixes):
            raise SpecError(f"{where}.path_prefixes must be a non-empty list of paths starting with '/'")
        return cls(name=data["name"], provider=data["provider"], scheme=data["scheme"], host=data["host"],
                   port=data["port"], path_prefixes=tuple(prefixes), credential_name=data["credential_name"])


_SPEC_KEYS = ("version", "campaign_id", "agent", "inputs_file", "timeout_s", "kill_grace_s", "model", "token_cap",
              "cost_cap_usd", "policy", "model_endpoint", "model_endpoints", "credentials", "sandbox", "network_ceilings",
              "limits")


@dataclasses.dataclass
class RunnerSpec:
    """The runner spec, ``campaigns/<campaign>/spec.json``: what every task of a campaign runs.

    JSON shape (version :data:`SPEC_VERSION`; keys after ``inputs_file`` optional)::

        {"version": 1, "campaign_id": str|int,
         "agent": {"command": [argv...], "environment": {str: str}, "outputs": ["verdict.json", "*.txt"],
                   "name": str, "version": int},
         "inputs_file": path (relative to the campaign folder, or absolute),
         "timeout_s": seconds > 0 | null, "kill_grace_s": seconds >= 0,
         "model": str, "token_cap": tokens >= 1, "cost_cap_usd": "decimal USD > 0",
         "policy": YAML text | "/abs/path.yaml" | {mapping},
         "model_endpoint": {"base_url": str, "credential_name": str},
         "model_endpoints": [ModelEndpoint mapping...],
         "credentials": {"provider": "credential name"},
         "sandbox": {"runtime": "auto"|"bubblewrap"|"openshell"},
         "network_ceilings": [{"label": str, "network_policies": {mapping}}],
         "limits": {"memory_bytes"|"file_bytes"|"cpu_s"|"work_bytes"|"max_processes"|"tmpfs_bytes": int >= 1}}

    ``limits``: the task's sandbox limits where the launch wants less than the site's (the
    runner takes the smaller of each; docs/limits.md).

    ``network_ceilings``: the network part (``network_policies`` in OpenShell's schema) of
    each admin ceiling the campaign's policy had to fit at launch; a runner refuses a live
    network policy change (:class:`NetworkPolicyFile`) wider than any of them, and, without
    them, one wider than the launch policy's own network part.
    ``command`` may hold ``{input}`` and ``{workdir}``; ``outputs`` are
    relative paths or globs in the work directory. Optional keys left unset
    (None, empty) are not written, so a plain launch writes a short spec.
    Unknown keys are ignored when read (a newer launcher's additions).
    """

    campaign_id: str | int
    command: list[str]
    inputs_file: str
    environment: dict[str, str] = dataclasses.field(default_factory=dict)
    outputs: list[str] = dataclasses.field(default_factory=list)
    agent_name: str | None = None
    agent_version: int | None = None
    timeout_s: float | None = None
    kill_grace_s: float | None = None
    model: str | None = None
    token_cap: int | None = None
    cost_cap_usd: Decimal | None = None
    policy: str | dict | None = None
    model_endpoint: dict[str, str] | None = None
    model_endpoints: list[ModelEndpoint] = dataclasses.field(default_factory=list)
    credentials: dict[str, str] | None = None
    sandbox: dict[str, Any] | None = None
    network_ceilings: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    limits: dict[str, int] | None = None
    version: int = SPEC_VERSION

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Check every field. Raises :class:`SpecError` naming the first wrong one."""
        if self.version != SPEC_VERSION:
            raise SpecError(f"version must be {SPEC_VERSION}")
        try:
            check_campaign_id(self.campaign_id)
        except SpoolError as exc:
            raise SpecError(f"campaign_id: {exc}") from None
        if not isinstance(self.command, list) or not self.command or not all(isinstance(a, str) for a in self.command):
            raise SpecError("agent.command must be a non-empty list of strings")
        if not isinstance(self.environment, dict) or not all(
                isinstance(k, str) and _ENV_KEY_RE.match(k) and isinstance(v, str) and "\0" not in v
                for k, v in self.environment.items()):
            raise SpecError("agent.environment must map variable names to text")
        if not isinstance(self.outputs, list) or not all(isinstance(o, str) and o and not o.startswith("/")
                                                         and "\0" not in o for o in self.outputs):
            raise SpecError("agent.outputs must be a list of relative paths")
        if self.agent_name is not None and not isinstance(self.agent_name, str):
            raise SpecError("agent.name must be text")
        if self.agent_version is not None and not is_int(self.agent_version):
            raise SpecError("agent.version must be an integer")
        if not isinstance(self.inputs_file, str) or not self.inputs_file or "\0" in self.inputs_file:
            raise SpecError("inputs_file must be a path")
        if self.timeout_s is not None and (not is_number(self.timeout_s) or not self.timeout_s > 0):
            raise SpecError("timeout_s must be a positive number or null")
        if self.kill_grace_s is not None and (not is_number(self.kill_grace_s) or not self.kill_grace_s >= 0):
            raise SpecError("kill_grace_s must be a number of seconds >= 0")
        if self.model is not None and not isinstance(self.model, str):
            raise SpecError("model must be text")
        if self.token_cap is not None and (not is_int(self.token_cap) or self.token_cap < 1):
            raise SpecError("token_cap must be a positive number of tokens")
        if self.cost_cap_usd is not None:
            if not isinstance(self.cost_cap_usd, Decimal) or not self.cost_cap_usd.is_finite() \
                    or self.cost_cap_usd <= 0:
                raise SpecError("cost_cap_usd must be a positive amount of USD")
        if self.policy is not None and not isinstance(self.policy, (str, dict)):
            raise SpecError("policy must be YAML text, a path or a mapping")
        for name in ("model_endpoint", "credentials", "sandbox"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, dict):
                raise SpecError(f"{name} must be a mapping")
        if self.limits is not None and (not isinstance(self.limits, dict) or not all(
                isinstance(k, str) and is_int(v) and v >= 1 for k, v in self.limits.items())):
            raise SpecError("limits must map limit names to positive integers")
        if not isinstance(self.model_endpoints, list) or not all(isinstance(e, ModelEndpoint)
                                                                 for e in self.model_endpoints):
            raise SpecError("model_endpoints must be a list of endpoints")
        names = [e.name for e in self.model_endpoints]
        if len(set(names)) != len(names):
            raise SpecError("model_endpoints: each name once")
        if not isinstance(self.network_ceilings, list) or not all(
                isinstance(c, dict) and isinstance(c.get("label"), str) and isinstance(c.get("network_policies"), dict)
                for c in self.network_ceilings):
            raise SpecError("network_ceilings must be a list of {label, network_policies} mappings")

    def to_json(self) -> dict[str, Any]:
        """The JSON mapping (only the optional keys that are set)."""
        agent: dict[str, Any] = {}
        if self.agent_name is not None:
            agent["name"] = self.agent_name
        if self.agent_version is not None:
            agent["version"] = self.agent_version
        agent["command"] = list(self.command)
        if self.environment:
            agent["environment"] = dict(self.environment)
        if self.outputs:
            agent["outputs"] = list(self.outputs)
        data: dict[str, Any] = {"version": self.version, "campaign_id": self.campaign_id, "agent": agent,
                                "inputs_file": self.inputs_file, "timeout_s": self.timeout_s}
        if self.kill_grace_s is not None:
            data["kill_grace_s"] = self.kill_grace_s
        if self.model:
            data["model"] = self.model
        if self.policy:
            data["policy"] = self.policy
        if self.token_cap is not None:
            data["token_cap"] = self.token_cap
        if self.cost_cap_usd is not None:
            data["cost_cap_usd"] = str(self.cost_cap_usd)
        for name in ("model_endpoint", "credentials", "sandbox"):
            if getattr(self, name):
                data[name] = dict(getattr(self, name))
        if self.model_endpoints:
            data["model_endpoints"] = [e.to_json() for e in self.model_endpoints]
        if self.network_ceilings:
            data["network_ceilings"] = [dict(c) for c in self.network_ceilings]
        if self.limits:
            data["limits"] = dict(self.limits)
        return data

    @classmethod
    def from_json(cls, data: Any) -> "RunnerSpec":
        """Parse a spec's JSON mapping. Raises :class:`SpecError` (its version, or the first wrong field)."""
        if not isinstance(data, dict):
            raise SpecError("a runner spec is a JSON object")
        if data.get("version") != SPEC_VERSION or isinstance(data.get("version"), bool):
            raise SpecError(f"version must be {SPEC_VERSION}")
        agent = data.get("agent")
        if not isinstance(agent, dict):
            raise SpecError("agent.command must be a non-empty list of strings")
        cost = data.get("cost_cap_usd")
        if cost is not None:
            try:
                cost = Decimal(str(cost)) if not isinstance(cost, (bool, dict, list)) else None
            except InvalidOperation:
                cost = None
            if cost is None:
                raise SpecError("cost_cap_usd must be a decimal amount of USD")
        endpoints = data.get("model_endpoints")
        if endpoints is None:
            endpoints = []
        if not isinstance(endpoints, list):
            raise SpecError("model_endpoints must be a list of endpoints")
        if "campaign_id" not in data:
            raise SpecError("campaign_id is required")
        return cls(
            version=data["version"], campaign_id=data["campaign_id"], command=agent.get("command"),
            environment=agent.get("environment") or {}, outputs=agent.get("outputs") or [],
            agent_name=agent.get("name"), agent_version=agent.get("version"),
            inputs_file=data.get("inputs_file"), timeout_s=data.get("timeout_s"),
            kill_grace_s=data.get("kill_grace_s"), model=data.get("model") or None, token_cap=data.get("token_cap"),
            cost_cap_usd=cost, policy=data.get("policy") if data.get("policy") not in ("", None) else None,
            model_endpoint=data.get("model_endpoint"),
            model_endpoints=[ModelEndpoint.from_json(e, f"model_endpoints[{i}]") for i, e in enumerate(endpoints)],
            credentials=data.get("credentials"), sandbox=data.get("sandbox"),
            network_ceilings=data.get("network_ceilings") or [], limits=data.get("limits"))

    @classmethod
    def read(cls, path: str | os.PathLike) -> "RunnerSpec":
        """Read and parse ``path``. Raises OSError, or :class:`SpecError` (not JSON, or wrong)."""
        with open(path, encoding="utf-8") as fh:
            try:
                data = json.load(fh)
            except ValueError as exc:
                raise SpecError(f"not JSON: {exc}") from None
        return cls.from_json(data)

    def write(self, path: str | os.PathLike) -> None:
        """Write the spec atomically (:func:`write_json_atomic`). Raises OSError."""
        write_json_atomic(path, self.to_json())
