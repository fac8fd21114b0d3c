"""The OCS 9.1.4 captures (tests/fixtures/ocs914/): their accounting records, read as JSON."""
from __future__ import annotations

import copy
import json

from tests.support.paths import FIXTURES

CAPTURES = FIXTURES / "ocs914"


def captured_records(name: str) -> list[dict]:
    return [json.loads(line) for line in (CAPTURES / name).read_text().splitlines() if line.strip()]


def job17_line() -> dict:
    """The real accounting.jsonl record of job 17 (the one whose context says ``tco_campaign=17``)."""
    (record,) = [r for r in captured_records("accounting.jsonl") if r["job_number"] == 17]
    return record


def with_tco_group(record: dict, group: dict) -> bytes:
    """``record`` with ``usage.tco`` added as sge_conf(5) documents it (documented shape, not captured)."""
    record = copy.deepcopy(record)
    record["usage"]["tco"] = group
    return json.dumps(record, separators=(",", ":")).encode()
