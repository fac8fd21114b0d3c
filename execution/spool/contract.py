"""The spool contract's vocabulary: versions, stage and token names, file suffixes, errors.

Standard library only.
"""
from __future__ import annotations

from typing import Any

__all__ = ["SPEC_VERSION", "RECORD_VERSION", "RECORD_VERSIONS_READ", "NETWORK_POLICY_FILE_VERSION",
           "MAX_NETWORK_POLICY_BYTES", "STAGES", "STAGE_LABELS", "DURATIONS", "TOKEN_BUCKETS", "REASONING_TOKENS",
           "TOKEN_FIELDS", "TASK_FILE_SUFFIXES", "SpoolError", "SpecError", "RecordError", "RecordVersionError",
           "is_int", "is_number"]

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


class SpoolError(ValueError):
    """A name that cannot be a spool path component (campaign id, task number)."""


class SpecError(ValueError):
    """A runner spec that does not follow this contract; ``str(err)`` names the field."""


class RecordError(ValueError):
    """A runner record that does not follow this contract; ``str(err)`` names the field."""


class RecordVersionError(RecordError):
    """A runner record of a version ingest does not read (not in :data:`RECORD_VERSIONS_READ`)."""


def is_int(value: Any) -> bool:
    """Whether a JSON value is an integer (never a bool)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """Whether a JSON value is an integer or a float (never a bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)
