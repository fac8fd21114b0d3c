"""The runner record, ``records/<campaign>/<task>.json``: what each runner leaves, ingest reads.

See :class:`RunnerRecord`; the runner's side of it is docs/runner.md. Standard library only.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
from typing import Any

from execution.spool.contract import (RECORD_VERSION, RECORD_VERSIONS_READ, STAGES, RecordError, RecordVersionError,
                                      SpoolError, is_int)
from execution.spool.files import write_json_atomic
from execution.spool.layout import check_campaign_id, check_task_number

__all__ = ["parse_stage_time", "RunnerRecord"]


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
        if not is_int(version) or version not in RECORD_VERSIONS_READ:
            raise RecordVersionError(f"runner record version {version!r} is not one of "
                                     f"{', '.join(map(str, RECORD_VERSIONS_READ))}")
        try:
            check_campaign_id(data.get("campaign_id"))
            task_number = check_task_number(data.get("task_number"))
        except SpoolError as exc:
            raise RecordError(str(exc)) from None
        for key in ("job_number", "exit_status", "signal", "runner_signal"):
            if data.get(key) is not None and not is_int(data[key]):
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
