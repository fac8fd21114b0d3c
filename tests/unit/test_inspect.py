"""`manage.py inspect KIND FILE`: parsed output as JSON lines."""
from __future__ import annotations

import datetime as dt
import io
import json
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from worker import inspect_cli

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
BUG01 = FIXTURES / "cases" / "BUG-01_array_tasks" / "qstat.xml"
BUG06 = FIXTURES / "cases" / "BUG-06_malformed_accounting_lines" / "accounting"
OCS9 = FIXTURES / "ocs9"

QSTAT_KEYS = ["job_number", "task_number", "name", "owner", "project", "state", "state_code", "restarted", "queue",
              "host", "slots", "submitted_at", "started_at", "priority"]
ACCOUNTING_KEYS = ["job_number", "task_number", "pe_taskid", "job_name", "owner", "group", "project", "department",
                   "account", "queue", "hostname", "slots", "submitted_at", "started_at", "ended_at", "wallclock_s",
                   "cpu_s", "maxvmem_bytes", "failed", "exit_status", "category", "usage"]


def inspect(*args: str) -> tuple[list[dict], str]:
    out, err = io.StringIO(), io.StringIO()
    call_command("inspect", *args, stdout=out, stderr=err)
    return [json.loads(line) for line in out.getvalue().splitlines()], err.getvalue()


def test_iso_utc_prints_a_fraction_only_when_there_is_one():
    assert inspect_cli.iso_utc(dt.datetime(2025, 3, 10, 9, 0, 5, tzinfo=dt.timezone.utc)) == "2025-03-10T09:00:05Z"
    berlin = dt.timezone(dt.timedelta(hours=1))
    assert inspect_cli.iso_utc(dt.datetime(2026, 3, 2, 15, 5, 1, 123456, tzinfo=berlin)) == \
        "2026-03-02T14:05:01.123456Z"
    assert inspect_cli.iso_utc(None) is None
    with pytest.raises(ValueError):
        inspect_cli.iso_utc(dt.datetime(2025, 3, 10))


def test_qstat_prints_one_object_per_task_with_the_documented_keys():
    objects, err = inspect("qstat", str(BUG01))
    assert len(objects) == 15 and err == ""
    assert all(list(obj) == QSTAT_KEYS for obj in objects)
    first = objects[0]
    assert first == {"job_number": 2002, "task_number": 1, "name": "param_sweep", "owner": "user01", "project": None,
                     "state": "running", "state_code": "r", "restarted": False, "queue": "all.q",
                     "host": "node01.example.org", "slots": 2, "submitted_at": None,
                     "started_at": "2025-03-10T09:00:05Z", "priority": 0.555}
    assert objects[-1]["task_number"] is None and objects[-1]["job_number"] == 2004


def test_qstat_times_are_read_in_tz_option_then_cluster_setting(settings):
    objects, _ = inspect("qstat", str(BUG01), "--tz", "Europe/Berlin")
    assert objects[0]["started_at"] == "2025-03-10T08:00:05Z"
    settings.TCO_CLUSTER_TZ = "America/New_York"
    objects, _ = inspect("qstat", str(BUG01))
    assert objects[0]["started_at"] == "2025-03-10T13:00:05Z"  # EDT (UTC-4) since 2025-03-09
    objects, _ = inspect("qstat", str(BUG01), "--tz", "UTC")
    assert objects[0]["started_at"] == "2025-03-10T09:00:05Z"


def test_ocs_microseconds_are_printed():
    objects, _ = inspect("qstat", str(OCS9 / "qstat.xml"))
    assert objects[0]["started_at"] == "2026-03-02T14:05:01.123456Z"
    assert objects[-1]["submitted_at"] == "2026-03-02T14:06:12Z"


def test_accounting_prints_records_and_a_summary_on_stderr():
    objects, err = inspect("accounting", str(BUG06))
    assert [obj["job_number"] for obj in objects] == [7001, 7003]
    assert all(list(obj) == ACCOUNTING_KEYS for obj in objects)
    assert objects[0]["submitted_at"] == "2025-03-10T15:20:00Z"
    assert objects[0]["wallclock_s"] == 600.0 and objects[0]["usage"] == {}
    assert err.strip().splitlines()[-1] == "accepted=2 quarantined=1 deferred=1"


def test_accounting_json_lines_keep_microseconds_and_flexible_usage():
    objects, err = inspect("accounting", str(OCS9 / "accounting_9.1.x.jsonl"))
    assert objects[0]["started_at"] == "2026-03-02T14:05:01.123456Z"
    assert objects[0]["usage"]["tco"]["input_tokens"] == 20111
    assert err.strip() == "accepted=2 quarantined=0 deferred=0"


def test_job_prints_details_and_pending_reasons():
    (obj,), _ = inspect("job", str(OCS9 / "qstat_j.xml"))
    assert list(obj) == ["job_number", "name", "owner", "project", "hard_resources", "tasks", "scheduler_messages",
                         "pending_reasons"]
    assert obj["job_number"] == 5101 and obj["hard_resources"]["anthropic_api"] == "1"
    assert [r["text"] for r in obj["pending_reasons"]] == [
        "waiting for a model API seat: the job asks 1 (-l anthropic_api=1); 0 free (consumable anthropic_api, global)"]


def test_qhost_and_qquota_kinds(tmp_path):
    qhost = tmp_path / "qhost.xml"
    qhost.write_bytes(b"<qhost><host name='global'><hostvalue name='num_proc'>-</hostvalue></host>"
                      b"<host name='vm'><hostvalue name='mem_total'>1.0G</hostvalue></host></qhost>")
    objects, _ = inspect("qhost", str(qhost))
    assert [o["name"] for o in objects] == ["global", "vm"] and objects[1]["mem_total_bytes"] == 1024**3
    qquota = tmp_path / "qquota.xml"
    qquota.write_bytes(b"<qquota_result><qquota_rule name='agent_cap/1'><users>tco</users>"
                       b"<limit resource='slots' limit='8' value='3'/></qquota_rule></qquota_result>")
    objects, _ = inspect("qquota", str(qquota))
    assert objects == [{"rule": "agent_cap/1", "resource": "slots", "limit": 8, "used": 3,
                        "filters": {"users": ["tco"]}}]


def test_an_unknown_job_or_garbage_is_a_command_error(tmp_path):
    unknown = tmp_path / "unknown.xml"
    unknown.write_bytes(b"<unknown_jobs><><ST_name>1</ST_name></></unknown_jobs>\n")
    with pytest.raises(CommandError, match="UnknownJob"):
        inspect("job", str(unknown))
    garbage = tmp_path / "garbage.xml"
    garbage.write_bytes(b"error: commlib error\n")
    with pytest.raises(CommandError, match="SchedulerParseError"):
        inspect("qstat", str(garbage))


def test_a_bad_zone_or_missing_file_is_a_command_error():
    with pytest.raises(CommandError, match="time zone"):
        inspect("qstat", str(BUG01), "--tz", "Mars/Olympus")
    with pytest.raises(CommandError, match="no such file"):
        inspect("qstat", "/nonexistent/qstat.xml")
