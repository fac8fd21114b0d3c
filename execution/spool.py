"""The spool contract: what the web side and the execution hosts exchange through the spool directory.

Standard library only, no Django: the runner (``execution/runner.py``) imports
it on every execution host, and the web side (``dashboards/services.py``
writes specs, ``dashboards/ingest.py`` reads records) imports the same
module, so both sides agree on one layout and one set of versioned types.

Layout under the spool root (``TCO_SPOOL_DIR``), all in :class:`SpoolLayout`::

    campaigns/<campaign>/spec.json          runner spec (RunnerSpec), written at launch
    campaigns/<campaign>/inputs.jsonl       one JSON object per line; line N is task N's input
    campaigns/<campaign>/network.json       the network policy in force now (NetworkPolicyFile), when changed
    records/<campaign>/<task>.json          runner record (RunnerRecord), written last, atomically
    records/<campaign>/<task>.stdout        the agent's output, capped by the runner
    records/<campaign>/<task>.stderr
    records/<campaign>/<task>.requests.jsonl  the metering proxy's request records, one per line
    records/<campaign>/<task>.usage         token totals for flexible accounting (OCS/GCS 9)
    records/<campaign>/<task>.outputs/      declared output files, copied and capped
    records/<campaign>/.<task>.json.claim-<token>  a record an ingester has claimed (transient)
    work/<campaign>/<task>/                 the task's work directory (``/sandbox`` inside)
    logs/<campaign>/                        Grid Engine's -o/-e files of the campaign's job
    ingested/<campaign>/<task>.json         records ingest has stored
    quarantine/<campaign>/<task>.json       records ingest refused (malformed, unknown version)
    prices.json                             price table (execution/metering/prices.py's format)
    credentials.json                        {"name": "secret"}, readable by the submit account only

Versions: the runner spec is :data:`SPEC_VERSION` (1; ``model_endpoints``
was added as an optional key, which readers of version 1 ignore, so the
version did not change; nor when ``network_ceilings`` was). The network policy file is
:data:`NETWORK_POLICY_FILE_VERSION` (1). Runner records are :data:`RECORD_VERSION` (2);
ingest still reads the versions in :data:`RECORD_VERSIONS_READ` (1 lacked
``outputs``, ``sandbox``, ``usage`` and ``requests_path``) and refuses any
other (:class:`RecordVersionError`).
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import re
import time
from decimal import Decimal, InvalidOperation
from typing import Any, Iterator, Mapping

SPEC_VERSION = 1
RECORD_VERSION = 2
#: The format of ``campaigns/<campaign>/network.json`` (:class:`NetworkPolicyFile`).
NETWORK_POLICY_FILE_VERSION = 1
#: The largest network policy file a runner reads (bytes).
MAX_NETWORK_POLICY_BYTES = 256 << 10
#: Runner record versions ingest accepts (version 1: before outputs, sandbox, usage and requests_path).
RECORD_VERSIONS_READ = (1, 2)

#: The runner's six stage timestamps, in the order a task passes them, with the pages' labels.
STAGES = ("task_started_at", "sandbox_create_at", "sandbox_ready_at", "agent_started_at", "agent_exited_at",
          "teardown_done_at")
STAGE_LABELS = {
    "task_started_at": "task started",
    "sandbox_create_at": "sandbox create",
    "sandbox_ready_at": "sandbox ready",
    "agent_started_at": "agent started",
    "agent_exited_at": "agent exited",
    "teardown_done_at": "teardown done",
}
#: The durations the pages report (DESIGN.md "Stages"), in order, with labels.
DURATIONS = (
    ("submit", "submit"),
    ("queue_wait", "queue wait"),
    ("sandbox_start", "sandbox start"),
    ("agent_work", "agent work"),
    ("integration_overhead", "integration overhead"),
)

#: Disjoint token buckets (DESIGN.md, "Token metering and cost"); their sum is a request's tokens.
TOKEN_BUCKETS = ("input_tokens", "cache_read_tokens", "cache_write_5m_tokens", "cache_write_1h_tokens",
                 "output_tokens")
#: Reasoning tokens are part of ``output_tokens``, counted apart, never added to the sum.
REASONING_TOKENS = "reasoning_tokens"
#: Every token count kept per request and per task.
TOKEN_FIELDS = (*TOKEN_BUCKETS, REASONING_TOKENS)

#: The files the runner leaves per task, ``records/<campaign>/<task>.<suffix>``: the record, the
#: agent's capped output, the proxy's request records, the flexible-accounting usage lines, and
#: the folder of declared outputs.
TASK_FILE_SUFFIXES = ("json", "stdout", "stderr", "requests.jsonl", "usage", "outputs")

CAMPAIGN_ID_RE = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")
_ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
_ENDPOINT_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_HOST_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.-]{0,252}[A-Za-z0-9])?$|^\[[0-9A-Fa-f:.]+\]$")
_CLAIM_MARK = ".json.claim-"


class SpoolError(ValueError):
    """A name that cannot be a spool path component (campaign id, task number)."""


class SpecError(ValueError):
    """A runner spec that does not follow this contract; ``str(err)`` names the field."""


class RecordError(ValueError):
    """A runner record that does not follow this contract; ``str(err)`` names the field."""


class RecordVersionError(RecordError):
    """A runner record of a version ingest does not read (not in :data:`RECORD_VERSIONS_READ`)."""


# --------------------------------------------------------------------------- layout

def check_campaign_id(campaign_id: str | int) -> str:
    """``campaign_id`` as the path component it becomes: 1-128 letters, digits, ``_.-``, never
    ``.``/``..``; an int (not bool) is written in decimal. Raises :class:`SpoolError`."""
    if isinstance(campaign_id, bool) or not isinstance(campaign_id, (str, int)):
        raise SpoolError(f"campaign id {campaign_id!r} is not text or a number")
    text = str(campaign_id)
    if not CAMPAIGN_ID_RE.match(text) or text in (".", ".."):
        raise SpoolError(f"campaign id {text!r} is not a safe name")
    return text


def check_task_number(task_number: int) -> int:
    """A Grid Engine task number (int >= 1). Raises :class:`SpoolError`."""
    if isinstance(task_number, bool) or not isinstance(task_number, int) or task_number < 1:
        raise SpoolError(f"task number {task_number!r} is not a positive integer")
    return task_number


class SpoolLayout:
    """Every path of the spool under ``root`` (text paths; ``root`` as given, not resolved).

    Campaign ids and task numbers are checked (:func:`check_campaign_id`,
    :func:`check_task_number`) so that no name leads outside the spool;
    methods raise :class:`SpoolError` for a bad one.
    """

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = os.fspath(root)

    def __repr__(self) -> str:
        return f"SpoolLayout({self.root!r})"

    # ---- written at launch
    def campaign_dir(self, campaign_id: str | int) -> str:
        """``campaigns/<campaign>``: the campaign's spec and inputs."""
        return os.path.join(self.root, "campaigns", check_campaign_id(campaign_id))

    def spec_path(self, campaign_id: str | int) -> str:
        """``campaigns/<campaign>/spec.json``: the :class:`RunnerSpec`."""
        return os.path.join(self.campaign_dir(campaign_id), "spec.json")

    def inputs_path(self, campaign_id: str | int) -> str:
        """``campaigns/<campaign>/inputs.jsonl``: line N is task N's input (a JSON object)."""
        return os.path.join(self.campaign_dir(campaign_id), "inputs.jsonl")

    def network_policy_path(self, campaign_id: str | int) -> str:
        """``campaigns/<campaign>/network.json``: the :class:`NetworkPolicyFile` (written by the web
        side when a running campaign's network policy changes; read by its runners)."""
        return os.path.join(self.campaign_dir(campaign_id), "network.json")

    @property
    def prices_path(self) -> str:
        """``prices.json``: the price table the metering proxies read."""
        return os.path.join(self.root, "prices.json")

    @property
    def credentials_path(self) -> str:
        """``credentials.json``: ``{"name": "secret"}``, readable by the submit account only."""
        return os.path.join(self.root, "credentials.json")

    # ---- written by the runner
    @property
    def records_root(self) -> str:
        """``records``: one folder per campaign."""
        return os.path.join(self.root, "records")

    def records_dir(self, campaign_id: str | int) -> str:
        """``records/<campaign>``: every task's record, logs, requests and outputs."""
        return os.path.join(self.records_root, check_campaign_id(campaign_id))

    def task_file(self, campaign_id: str | int, task_number: int, suffix: str) -> str:
        """``records/<campaign>/<task>.<suffix>``, ``suffix`` one of :data:`TASK_FILE_SUFFIXES`."""
        if suffix not in TASK_FILE_SUFFIXES:
            raise SpoolError(f"suffix {suffix!r} is not one of {', '.join(TASK_FILE_SUFFIXES)}")
        return os.path.join(self.records_dir(campaign_id), f"{check_task_number(task_number)}.{suffix}")

    def record_path(self, campaign_id: str | int, task_number: int) -> str:
        """``records/<campaign>/<task>.json``: the :class:`RunnerRecord`."""
        return self.task_file(campaign_id, task_number, "json")

    def outputs_dir(self, campaign_id: str | int, task_number: int) -> str:
        """``records/<campaign>/<task>.outputs``: declared outputs, copied and capped."""
        return self.task_file(campaign_id, task_number, "outputs")

    def work_dir(self, campaign_id: str | int, task_number: int | None = None) -> str:
        """``work/<campaign>`` or ``work/<campaign>/<task>`` (shown at ``/sandbox``)."""
        base = os.path.join(self.root, "work", check_campaign_id(campaign_id))
        return base if task_number is None else os.path.join(base, str(check_task_number(task_number)))

    def logs_dir(self, campaign_id: str | int) -> str:
        """``logs/<campaign>``: Grid Engine's output and error files of the campaign's job."""
        return os.path.join(self.root, "logs", check_campaign_id(campaign_id))

    # ---- ingest's folders
    def ingested_path(self, campaign_folder: str, name: str) -> str:
        """``ingested/<campaign>/<name>``: where a stored record goes."""
        return os.path.join(self.root, "ingested", _component(campaign_folder), _component(name))

    def quarantine_path(self, campaign_folder: str, name: str) -> str:
        """``quarantine/<campaign>/<name>``: where a refused record goes."""
        return os.path.join(self.root, "quarantine", _component(campaign_folder), _component(name))

    def _record_entries(self) -> list[os.DirEntry]:
        """Regular files directly in ``records/<campaign>/`` folders, sorted by path."""
        found: list[os.DirEntry] = []
        try:
            campaigns = list(os.scandir(self.records_root))
        except FileNotFoundError:
            return []
        for campaign in campaigns:
            if not campaign.is_dir(follow_symlinks=False):
                continue
            try:
                found += [e for e in os.scandir(campaign.path) if e.is_file(follow_symlinks=False)]
            except OSError:
                continue
        return sorted(found, key=lambda e: e.path)

    def record_files(self) -> list[str]:
        """Every runner record waiting in ``records/*/*.json``, sorted (claimed ones excluded)."""
        return [e.path for e in self._record_entries() if e.name.endswith(".json") and not e.name.startswith(".")]

    def stale_claims(self, older_than_s: float, *, now: float | None = None) -> list[str]:
        """Claimed records (``records/<campaign>/.<task>.json.claim-*``) whose claim is older than
        ``older_than_s`` seconds (by the rename's inode change time): their ingester died."""
        now = time.time() if now is None else now
        found = []
        for entry in self._record_entries():
            if entry.name.startswith(".") and _CLAIM_MARK in entry.name:
                try:
                    if now - entry.stat(follow_symlinks=False).st_ctime > older_than_s:
                        found.append(entry.path)
                except OSError:
                    continue
        return found

    @staticmethod
    def claim_name(path: str, token: str) -> str:
        """The hidden name a record at ``path`` takes while ingester ``token`` holds it."""
        directory, name = os.path.split(path)
        if name.startswith(".") and _CLAIM_MARK in name:  # re-claiming a stale claim
            name = name[1:name.index(_CLAIM_MARK)] + ".json"
        return os.path.join(directory, f".{name[:-len('.json')]}{_CLAIM_MARK}{token}")

    @staticmethod
    def unclaimed_name(path: str) -> str:
        """The record's own name (``<task>.json``) of a claimed path (or of the record itself)."""
        name = os.path.basename(path)
        if name.startswith(".") and _CLAIM_MARK in name:
            return name[1:name.index(_CLAIM_MARK)] + ".json"
        return name


def _component(name: str) -> str:
    if not name or "/" in name or name in (".", ".."):
        raise SpoolError(f"{name!r} is not a file name")
    return name


# --------------------------------------------------------------------------- atomic writes

def make_private_dirs(path: str | os.PathLike) -> None:
    """``os.makedirs(path, exist_ok=True)``, but every directory it makes is 0700 (``makedirs``
    gives its ``mode`` to the last one only): the spool is the submit account's alone. Existing
    directories are left as they are. Raises OSError."""
    path = os.path.abspath(os.fspath(path))
    missing = []
    while not os.path.isdir(path):
        missing.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    for directory in reversed(missing):
        try:
            os.mkdir(directory, 0o700)
        except FileExistsError:
            if not os.path.isdir(directory):
                raise


def write_atomic(path: str | os.PathLike, data: bytes, *, mode: int = 0o600) -> None:
    """Write ``data`` to ``path`` so that a reader sees the old file or the whole new one.

    A temporary file in the same directory (made if missing), written and
    ``fsync``-ed, then ``os.replace``-d over ``path``, then the directory
    ``fsync``-ed (skipped where the filesystem refuses it). ``mode`` is the
    new file's permission bits (default 0600: the spool is the submit account's
    alone; missing directories are made 0700, :func:`make_private_dirs`). Raises
    OSError; the temporary file is removed on failure.
    """
    path = os.fspath(path)
    directory = os.path.dirname(path) or "."
    make_private_dirs(directory)
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}.{id(data):x}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    try:
        dir_fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dir_fd)
    except OSError:
        pass  # some filesystems (NFS, tmpfs variants) refuse fsync on a directory
    finally:
        os.close(dir_fd)


def write_json_atomic(path: str | os.PathLike, data: Mapping[str, Any], *, mode: int = 0o600) -> None:
    """:func:`write_atomic` of ``data`` as indented JSON text with a final newline."""
    write_atomic(path, (json.dumps(data, indent=1) + "\n").encode(), mode=mode)


# --------------------------------------------------------------------------- streamed JSON lines

@dataclasses.dataclass
class JsonLinesStats:
    """What :func:`iter_json_lines` passed over: ``lines`` yielded, ``too_long`` skipped lines
    (longer than the limit; never held in memory), ``bytes_read``."""

    lines: int = 0
    too_long: int = 0
    bytes_read: int = 0


def iter_json_lines(path: str | os.PathLike, *, max_line_bytes: int = 1 << 20, chunk_bytes: int = 1 << 16,
                    stats: JsonLinesStats | None = None) -> Iterator[Any]:
    """The JSON value of each non-blank line of ``path``, read ``chunk_bytes`` at a time.

    Memory stays bounded by ``chunk_bytes + max_line_bytes`` whatever the
    file's size: a line longer than ``max_line_bytes`` is skipped as it
    streams past and counted in ``stats.too_long``. Raises OSError, and
    ValueError for a line that is not JSON (the line number in the message).
    """
    stats = stats if stats is not None else JsonLinesStats()
    pending = bytearray()
    skipping = False
    number = 0
    with open(path, "rb") as fh:
        while True:
            chunk = fh.read(chunk_bytes)
            stats.bytes_read += len(chunk)
            if not chunk:
                break
            start = 0
            while True:
                end = chunk.find(b"\n", start)
                if end < 0:
                    if not skipping:
                        pending += chunk[start:]
                        if len(pending) > max_line_bytes:
                            pending.clear()
                            skipping = True
                    break
                number += 1
                if skipping:
                    stats.too_long += 1
                    skipping = False
                else:
                    pending += chunk[start:end]
                    if len(pending) > max_line_bytes:
                        stats.too_long += 1
                    elif pending.strip():
                        yield _json_line(pending, path, number)
                        stats.lines += 1
                    pending.clear()
                start = end + 1
    if skipping:
        stats.too_long += 1
    elif pending.strip():
        yield _json_line(pending, path, number + 1)
        stats.lines += 1


def _json_line(data: bytearray, path, number: int) -> Any:
    try:
        return json.loads(bytes(data))
    except ValueError as exc:
        raise ValueError(f"{os.fspath(path)} line {number} is not JSON: {exc}") from None


# --------------------------------------------------------------------------- runner spec

def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


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
        if not _is_int(data["port"]) or not 1 <= data["port"] <= 65535:
            raise SpecError(f"{where}.port must be a port number (1-65535)")
        prefixes = data["path_prefixes"]
        if not isinstance(prefixes, list) or not prefixes or not all(
                isinstance(p, str) and p.startswith("/") and not any(c in p for c in "\0\r\n?#") for p in prefixes):
            raise SpecError(f"{where}.path_prefixes must be a non-empty list of paths starting with '/'")
        return cls(name=data["name"], provider=data["provider"], scheme=data["scheme"], host=data["host"],
                   port=data["port"], path_prefixes=tuple(prefixes), credential_name=data["credential_name"])


_SPEC_KEYS = ("version", "campaign_id", "agent", "inputs_file", "timeout_s", "kill_grace_s", "model", "token_cap",
              "cost_cap_usd", "policy", "model_endpoint", "model_endpoints", "credentials", "sandbox", "network_ceilings")


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
         "network_ceilings": [{"label": str, "network_policies": {mapping}}]}

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
        if self.agent_version is not None and not _is_int(self.agent_version):
            raise SpecError("agent.version must be an integer")
        if not isinstance(self.inputs_file, str) or not self.inputs_file or "\0" in self.inputs_file:
            raise SpecError("inputs_file must be a path")
        if self.timeout_s is not None and (not _is_number(self.timeout_s) or not self.timeout_s > 0):
            raise SpecError("timeout_s must be a positive number or null")
        if self.kill_grace_s is not None and (not _is_number(self.kill_grace_s) or not self.kill_grace_s >= 0):
            raise SpecError("kill_grace_s must be a number of seconds >= 0")
        if self.model is not None and not isinstance(self.model, str):
            raise SpecError("model must be text")
        if self.token_cap is not None and (not _is_int(self.token_cap) or self.token_cap < 1):
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
            network_ceilings=data.get("network_ceilings") or [])

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


# --------------------------------------------------------------------------- live network policy

class NetworkPolicyFileError(ValueError):
    """A network policy file that does not follow this contract; ``str(err)`` names the field."""


@dataclasses.dataclass(frozen=True)
class NetworkPolicyFile:
    """``campaigns/<campaign>/network.json``: a running campaign's network policy, changed live.

    JSON shape (version :data:`NETWORK_POLICY_FILE_VERSION`)::

        {"version": 1, "campaign_id": str|int, "policy_version": int >= 1,
         "changed_at": ISO-8601 UTC text with a zone, "changed_by": str,
         "network_policies": {mapping in OpenShell's schema (execution/sandbox/policy.py)}}

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
        if not _is_int(self.policy_version) or self.policy_version < 1:
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


# --------------------------------------------------------------------------- runner record

def parse_stage_time(value: Any) -> dt.datetime | None:
    """A stage timestamp (``2025-01-02T03:04:05.123456Z``, any ISO-8601 with a zone) as an aware UTC
    datetime; None or "" stays None. Raises :class:`RecordError` for text without a zone or not a time."""
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise RecordError(f"stage time {value!r} is not text")
    try:
        parsed = dt.datetime.fromisoformat(value)
    except ValueError:
        raise RecordError(f"stage time {value!r} is not an ISO-8601 time") from None
    if parsed.tzinfo is None:
        raise RecordError(f"stage time {value!r} has no zone")
    return parsed.astimezone(dt.timezone.utc)


_RECORD_FIELDS = ("version", "campaign_id", "task_number", "job_number", "hostname", "stages", "exit_status",
                  "signal", "stdout_path", "stderr_path", "stdout_truncated", "stderr_truncated", "outputs",
                  "sandbox", "usage", "requests_path", "requests", "usage_file", "flags", "runner_signal", "error")


@dataclasses.dataclass
class RunnerRecord:
    """The runner record, ``records/<campaign>/<task>.json``: how one task ran.

    JSON shape (version :data:`RECORD_VERSION`)::

        {"version": 2, "campaign_id": str, "task_number": int, "job_number": int|null,
         "hostname": str,
         "stages": {name in STAGES: ISO-8601 UTC text with a zone | null},
         "exit_status": int|null, "signal": int|null,
         "stdout_path": str|null, "stderr_path": str|null,
         "stdout_truncated": bool, "stderr_truncated": bool,
         "outputs": [{"name", "path", "bytes", "truncated"}],
         "sandbox": {"runtime", "policy_sha256", "uid", "gid", "notes": [str], "log": str} | null,
         "usage": {proxy totals} | null, "requests_path": str | null, "usage_file": str | null,
         "flags": [str], "runner_signal": int|null, "error": str|null}

    Version 1 had no ``outputs``, ``sandbox``, ``usage``, ``requests_path``;
    read, they take their empty values. ``requests`` (a list of the proxy's
    request records, inline instead of ``requests_path``) is read when
    present. Keys this version does not name are kept in ``extra`` and
    written back, so a record survives a read and write unchanged.
    """

    campaign_id: str | int
    task_number: int
    job_number: int | None = None
    hostname: str = ""
    stages: dict[str, str | None] = dataclasses.field(default_factory=lambda: dict.fromkeys(STAGES))
    exit_status: int | None = None
    signal: int | None = None
    stdout_path: str | None = None
    stderr_path: str | None = None
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    outputs: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    sandbox: dict[str, Any] | None = None
    usage: dict[str, Any] | None = None
    requests_path: str | None = None
    requests: list[dict[str, Any]] | None = None
    usage_file: str | None = None
    flags: list[str] = dataclasses.field(default_factory=list)
    runner_signal: int | None = None
    error: str | None = None
    version: int = RECORD_VERSION
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The JSON mapping (``requests`` only when inline requests were read; ``extra`` keys after)."""
        data = {"version": self.version, "campaign_id": self.campaign_id, "task_number": self.task_number,
                "job_number": self.job_number, "hostname": self.hostname,
                "stages": {name: self.stages.get(name) for name in STAGES},
                "exit_status": self.exit_status, "signal": self.signal, "stdout_path": self.stdout_path,
                "stderr_path": self.stderr_path, "stdout_truncated": self.stdout_truncated,
                "stderr_truncated": self.stderr_truncated, "outputs": self.outputs, "sandbox": self.sandbox,
                "usage": self.usage, "requests_path": self.requests_path, "usage_file": self.usage_file,
                "flags": self.flags, "runner_signal": self.runner_signal, "error": self.error}
        if self.requests is not None:
            data["requests"] = self.requests
        return {**data, **self.extra}

    @classmethod
    def from_json(cls, data: Any) -> "RunnerRecord":
        """Parse a record's JSON mapping. Raises :class:`RecordVersionError` for a version not in
        :data:`RECORD_VERSIONS_READ`, :class:`RecordError` for a wrong field."""
        if not isinstance(data, dict):
            raise RecordError("a runner record is a JSON object")
        version = data.get("version")
        if not _is_int(version) or version not in RECORD_VERSIONS_READ:
            raise RecordVersionError(f"runner record version {version!r} is not one of "
                                     f"{', '.join(map(str, RECORD_VERSIONS_READ))}")
        try:
            check_campaign_id(data.get("campaign_id"))
            task_number = check_task_number(data.get("task_number"))
        except SpoolError as exc:
            raise RecordError(str(exc)) from None
        for key in ("job_number", "exit_status", "signal", "runner_signal"):
            if data.get(key) is not None and not _is_int(data[key]):
                raise RecordError(f"{key} must be an integer or null")
        stages = data.get("stages")
        stages = {} if stages is None else stages
        if not isinstance(stages, dict):
            raise RecordError("stages must be a mapping")
        for name in STAGES:
            parse_stage_time(stages.get(name))
        for key in ("hostname", "stdout_path", "stderr_path", "requests_path", "usage_file", "error"):
            if data.get(key) is not None and not isinstance(data[key], str):
                raise RecordError(f"{key} must be text or null")
        for key in ("outputs", "flags"):
            if data.get(key) is not None and not isinstance(data[key], list):
                raise RecordError(f"{key} must be a list")
        if not all(isinstance(f, str) for f in data.get("flags") or []):
            raise RecordError("flags must be a list of text")
        for key in ("sandbox", "usage"):
            if data.get(key) is not None and not isinstance(data[key], dict):
                raise RecordError(f"{key} must be a mapping or null")
        if data.get("requests") is not None and not (
                isinstance(data["requests"], list) and all(isinstance(r, dict) for r in data["requests"])):
            raise RecordError("requests must be a list of request records")
        return cls(
            version=version, campaign_id=data["campaign_id"], task_number=task_number,
            job_number=data.get("job_number"), hostname=data.get("hostname") or "",
            stages={name: stages.get(name) for name in STAGES}, exit_status=data.get("exit_status"),
            signal=data.get("signal"), stdout_path=data.get("stdout_path"), stderr_path=data.get("stderr_path"),
            stdout_truncated=bool(data.get("stdout_truncated")), stderr_truncated=bool(data.get("stderr_truncated")),
            outputs=list(data.get("outputs") or []), sandbox=data.get("sandbox"), usage=data.get("usage"),
            requests_path=data.get("requests_path"), requests=data.get("requests"), usage_file=data.get("usage_file"),
            flags=list(data.get("flags") or []), runner_signal=data.get("runner_signal"), error=data.get("error"),
            extra={k: v for k, v in data.items() if k not in _RECORD_FIELDS},
        )

    @classmethod
    def read(cls, path: str | os.PathLike) -> "RunnerRecord":
        """Read and parse ``path``. Raises OSError, :class:`RecordError` (not JSON, or wrong), or
        :class:`RecordVersionError`."""
        with open(path, "rb") as fh:
            try:
                data = json.loads(fh.read())
            except ValueError as exc:
                raise RecordError(f"not JSON: {exc}") from None
        return cls.from_json(data)

    def stage_times(self) -> dict[str, dt.datetime | None]:
        """Every stage as an aware UTC datetime (None where not reached)."""
        return {name: parse_stage_time(self.stages.get(name)) for name in STAGES}

    def write(self, path: str | os.PathLike) -> None:
        """Write the record atomically (:func:`write_json_atomic`). Raises OSError."""
        write_json_atomic(path, self.to_json())


__all__ = ["SPEC_VERSION", "RECORD_VERSION", "RECORD_VERSIONS_READ", "STAGES", "STAGE_LABELS", "DURATIONS",
           "TOKEN_BUCKETS", "REASONING_TOKENS", "TOKEN_FIELDS", "TASK_FILE_SUFFIXES", "CAMPAIGN_ID_RE", "SpoolError", "SpecError",
           "RecordError", "RecordVersionError", "check_campaign_id", "check_task_number", "SpoolLayout",
           "make_private_dirs", "write_atomic", "write_json_atomic",
           "JsonLinesStats", "iter_json_lines", "ModelEndpoint", "RunnerSpec",
           "parse_stage_time", "RunnerRecord", "NETWORK_POLICY_FILE_VERSION", "MAX_NETWORK_POLICY_BYTES",
           "NetworkPolicyFileError", "NetworkPolicyFile"]
