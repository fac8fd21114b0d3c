"""The spool contract (execution/spool/): layout, versioned spec and record, atomic writes, streamed JSON lines."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from decimal import Decimal

import pytest

from execution.spool import contract as spool
from execution.spool.files import JsonLinesStats
from execution.spool.contract import (RECORD_VERSION, SPEC_VERSION, RecordError, RecordVersionError, SpecError,
                                      SpoolError)
from execution.spool.files import iter_json_lines, write_atomic
from execution.spool.layout import SpoolLayout
from execution.spool.record import RunnerRecord
from execution.spool.spec import ModelEndpoint, RunnerSpec

ENDPOINT = {"name": "stand-in", "provider": "anthropic", "scheme": "http", "host": "127.0.0.1", "port": 8123,
            "path_prefixes": ["/v1/messages"], "credential_name": "demo-stand-in"}


def minimal_spec(**extra) -> dict:
    return {"version": 1, "campaign_id": 7, "agent": {"command": ["python3", "{input}"]},
            "inputs_file": "inputs.jsonl", **extra}


# --------------------------------------------------------------------------- layout

def test_the_layout_names_every_path_of_the_spool(tmp_path):
    layout = SpoolLayout(tmp_path)
    root = str(tmp_path)
    assert layout.spec_path(7) == f"{root}/campaigns/7/spec.json"
    assert layout.inputs_path("7") == f"{root}/campaigns/7/inputs.jsonl"
    assert layout.record_path(7, 3) == f"{root}/records/7/3.json"
    assert layout.task_file(7, 3, "stdout") == f"{root}/records/7/3.stdout"
    assert layout.task_file(7, 3, "stderr") == f"{root}/records/7/3.stderr"
    assert layout.task_file(7, 3, "requests.jsonl") == f"{root}/records/7/3.requests.jsonl"
    assert layout.task_file(7, 3, "usage") == f"{root}/records/7/3.usage"
    assert layout.outputs_dir(7, 3) == f"{root}/records/7/3.outputs"
    assert layout.work_dir(7) == f"{root}/work/7" and layout.work_dir(7, 3) == f"{root}/work/7/3"
    assert layout.logs_dir(7) == f"{root}/logs/7"
    assert layout.prices_path == f"{root}/prices.json" and layout.credentials_path == f"{root}/credentials.json"
    assert layout.quarantine_path("7", "3.json") == f"{root}/quarantine/7/3.json"
    assert layout.ingested_path("7", "3.json") == f"{root}/ingested/7/3.json"


@pytest.mark.parametrize("campaign_id", ["..", ".", "../x", "a/b", "", "x" * 129, True, None, "a\0b"])
def test_no_campaign_id_leads_outside_the_spool(tmp_path, campaign_id):
    with pytest.raises(SpoolError):
        SpoolLayout(tmp_path).record_path(campaign_id, 1)


@pytest.mark.parametrize("suffix", ["../x", "json/..", "", "py"])
def test_a_task_file_suffix_is_one_of_the_contracts(tmp_path, suffix):
    with pytest.raises(SpoolError):
        SpoolLayout(tmp_path).task_file(7, 1, suffix)


@pytest.mark.parametrize("task", [0, -1, True, "1", 1.0])
def test_a_task_number_is_a_positive_integer(tmp_path, task):
    with pytest.raises(SpoolError):
        SpoolLayout(tmp_path).record_path(7, task)


def test_record_files_lists_waiting_records_but_not_claims_or_other_files(tmp_path):
    layout = SpoolLayout(tmp_path)
    folder = tmp_path / "records" / "7"
    folder.mkdir(parents=True)
    for name in ("1.json", "2.json", "1.stdout", "1.requests.jsonl", ".3.json.claim-x", ".1.json.9.tmp"):
        (folder / name).write_text("{}")
    assert layout.record_files() == [str(folder / "1.json"), str(folder / "2.json")]
    claim = layout.claim_name(str(folder / "3.json"), "tok")
    assert claim == str(folder / ".3.json.claim-tok")
    assert layout.unclaimed_name(claim) == "3.json"
    # A stale claim taken over keeps the record's own name under the new token.
    assert layout.claim_name(claim, "other") == str(folder / ".3.json.claim-other")
    assert SpoolLayout(tmp_path / "none").record_files() == []


def test_a_claim_is_stale_only_after_the_given_age(tmp_path):
    layout = SpoolLayout(tmp_path)
    folder = tmp_path / "records" / "7"
    folder.mkdir(parents=True)
    claim = folder / ".1.json.claim-dead"
    claim.write_text("{}")
    ctime = os.stat(claim).st_ctime
    assert layout.stale_claims(600, now=ctime + 10) == []
    assert layout.stale_claims(600, now=ctime + 601) == [str(claim)]


# --------------------------------------------------------------------------- constants

def test_stage_names_and_token_buckets_are_the_contracts():
    assert spool.STAGES == ("task_started_at", "sandbox_create_at", "sandbox_ready_at", "agent_started_at",
                            "agent_exited_at", "teardown_done_at")
    assert set(spool.STAGE_LABELS) == set(spool.STAGES)
    assert [k for k, _ in spool.DURATIONS] == ["submit", "queue_wait", "sandbox_start", "agent_work",
                                               "integration_overhead"]
    assert spool.TOKEN_BUCKETS == ("input_tokens", "cache_read_tokens", "cache_write_5m_tokens",
                                   "cache_write_1h_tokens", "output_tokens")
    assert spool.TOKEN_FIELDS == (*spool.TOKEN_BUCKETS, "reasoning_tokens")
    assert (SPEC_VERSION, RECORD_VERSION, spool.RECORD_VERSIONS_READ) == (1, 2, (1, 2))


def test_the_contract_imports_no_django():
    code = "import sys, execution.spool.record, execution.spool.spec, execution.runner.main; print(sorted(m for m in sys.modules if m.split('.')[0] " \
           "in ('django', 'dashboards', 'celery')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "DJANGO_SETTINGS_MODULE": ""})
    assert out.stdout.strip() == "[]"


# --------------------------------------------------------------------------- runner spec

def test_a_full_spec_round_trips():
    data = minimal_spec(
        agent={"name": "a", "version": 2, "command": ["x"], "environment": {"K": "v"}, "outputs": ["verdict.json"]},
        timeout_s=60, kill_grace_s=2.5, model="claude-x", token_cap=1000, cost_cap_usd="0.50", policy="version: 1\n",
        model_endpoint={"base_url": "http://127.0.0.1:8123", "credential_name": "c"}, model_endpoints=[ENDPOINT],
        credentials={"anthropic": "c"}, sandbox={"runtime": "bubblewrap"})
    spec = RunnerSpec.from_json(json.loads(json.dumps(data)))
    assert spec.outputs == ["verdict.json"] and spec.cost_cap_usd == Decimal("0.50")
    assert spec.model_endpoints == [ModelEndpoint(**{**ENDPOINT, "path_prefixes": ("/v1/messages",)})]
    assert spec.to_json() == data
    assert RunnerSpec.from_json(spec.to_json()) == spec


def test_a_plain_spec_writes_no_optional_keys(tmp_path):
    spec = RunnerSpec(campaign_id=7, command=["x"], inputs_file="inputs.jsonl", timeout_s=3600)
    path = tmp_path / "spec.json"
    spec.write(path)
    assert json.loads(path.read_text()) == {"version": 1, "campaign_id": 7, "agent": {"command": ["x"]},
                                            "inputs_file": "inputs.jsonl", "timeout_s": 3600}
    assert RunnerSpec.read(path) == spec


def test_unknown_spec_keys_are_ignored_for_a_newer_launcher():
    assert RunnerSpec.from_json(minimal_spec(something_new={"x": 1})).campaign_id == 7


@pytest.mark.parametrize("change, message", [
    ({"version": 2}, "version must be 1"),
    ({"version": True}, "version must be 1"),
    ({"campaign_id": "../x"}, "campaign_id"),
    ({"agent": {"command": []}}, "agent.command"),
    ({"agent": "x"}, "agent.command"),
    ({"agent": {"command": ["x"], "environment": {"1X": "v"}}}, "agent.environment"),
    ({"agent": {"command": ["x"], "outputs": ["/etc/passwd"]}}, "agent.outputs"),
    ({"inputs_file": ""}, "inputs_file"),
    ({"timeout_s": 0}, "timeout_s"),
    ({"timeout_s": True}, "timeout_s"),
    ({"kill_grace_s": -1}, "kill_grace_s"),
    ({"token_cap": 0}, "token_cap"),
    ({"cost_cap_usd": "lots"}, "cost_cap_usd"),
    ({"cost_cap_usd": "-1"}, "cost_cap_usd"),
    ({"cost_cap_usd": "NaN"}, "cost_cap_usd"),
    ({"model_endpoint": "http://x"}, "model_endpoint must be a mapping"),
    ({"credentials": ["x"]}, "credentials must be a mapping"),
    ({"model_endpoints": {}}, "model_endpoints must be a list"),
    ({"model_endpoints": [{**ENDPOINT, "scheme": "ftp"}]}, r"model_endpoints\[0\].scheme"),
    ({"model_endpoints": [{**ENDPOINT, "port": 0}]}, r"model_endpoints\[0\].port"),
    ({"model_endpoints": [{**ENDPOINT, "port": "443"}]}, r"model_endpoints\[0\].port"),
    ({"model_endpoints": [{**ENDPOINT, "host": "a b"}]}, r"model_endpoints\[0\].host"),
    ({"model_endpoints": [{**ENDPOINT, "path_prefixes": ["v1"]}]}, "path_prefixes"),
    ({"model_endpoints": [{**ENDPOINT, "path_prefixes": []}]}, "path_prefixes"),
    ({"model_endpoints": [{**ENDPOINT, "credential_name": ""}]}, "credential_name"),
    ({"model_endpoints": [{**ENDPOINT, "extra": 1}]}, "unknown field 'extra'"),
    ({"model_endpoints": [{k: v for k, v in ENDPOINT.items() if k != "host"}]}, "host is required"),
    ({"model_endpoints": [ENDPOINT, ENDPOINT]}, "each name once"),
])
def test_a_wrong_spec_is_refused_with_the_field_named(change, message):
    with pytest.raises(SpecError, match=message):
        RunnerSpec.from_json({**minimal_spec(), **change})


def test_a_spec_that_is_not_json_is_a_spec_error(tmp_path):
    path = tmp_path / "spec.json"
    path.write_text("{nope")
    with pytest.raises(SpecError, match="not JSON"):
        RunnerSpec.read(path)


# --------------------------------------------------------------------------- runner record

def full_record() -> dict:
    return {"version": 2, "campaign_id": "7", "task_number": 3, "job_number": 41, "hostname": "exec1",
            "stages": {name: f"2026-11-29T12:00:0{i}.000001Z" for i, name in enumerate(spool.STAGES)},
            "exit_status": 0, "signal": None, "stdout_path": "/s/records/7/3.stdout",
            "stderr_path": "/s/records/7/3.stderr", "stdout_truncated": False, "stderr_truncated": True,
            "outputs": [{"name": "v.json", "path": "/s/records/7/3.outputs/v.json", "bytes": 3, "truncated": False}],
            "sandbox": {"runtime": "bubblewrap", "policy_sha256": "ab", "uid": 1, "gid": 1, "notes": [], "log": ""},
            "usage": {"requests": 1}, "requests_path": "/s/records/7/3.requests.jsonl", "usage_file": None,
            "flags": ["agent_timeout"], "runner_signal": None, "error": None}


def test_a_record_round_trips_and_keeps_unknown_keys():
    data = {**full_record(), "policy": "version: 1\n"}
    record = RunnerRecord.from_json(data)
    assert record.extra == {"policy": "version: 1\n"}
    assert record.to_json() == data
    times = record.stage_times()
    assert times["teardown_done_at"].isoformat() == "2026-11-29T12:00:05.000001+00:00"


def test_a_version_1_record_is_read_with_empty_new_fields():
    data = {"version": 1, "campaign_id": 7, "task_number": 1, "job_number": None, "stages": {}}
    record = RunnerRecord.from_json(data)
    assert (record.outputs, record.sandbox, record.usage, record.requests_path) == ([], None, None, None)
    assert record.stages == dict.fromkeys(spool.STAGES)


@pytest.mark.parametrize("version", [3, 0, "2", None, True, 2.0])
def test_a_record_of_an_unknown_version_is_refused(version):
    data = {**full_record(), "version": version}
    if version is None:
        del data["version"]
    with pytest.raises(RecordVersionError):
        RunnerRecord.from_json(data)


@pytest.mark.parametrize("change, message", [
    ({"task_number": 0}, "task number"),
    ({"task_number": "1"}, "task number"),
    ({"campaign_id": "../7"}, "campaign id"),
    ({"job_number": "41"}, "job_number"),
    ({"stages": {"task_started_at": "2026-11-29T12:00:00"}}, "has no zone"),
    ({"stages": {"task_started_at": "yesterday"}}, "not an ISO-8601 time"),
    ({"stages": []}, "stages must be a mapping"),
    ({"flags": "x"}, "flags must be a list"),
    ({"flags": [1]}, "flags must be a list of text"),
    ({"usage": [1]}, "usage must be a mapping"),
    ({"requests": {"a": 1}}, "requests must be a list"),
    ({"stdout_path": 3}, "stdout_path must be text"),
])
def test_a_malformed_record_is_a_record_error(change, message):
    with pytest.raises(RecordError, match=message) as caught:
        RunnerRecord.from_json({**full_record(), **change})
    assert not isinstance(caught.value, RecordVersionError)


# --------------------------------------------------------------------------- atomic writes

def test_an_atomic_write_leaves_the_whole_file_and_no_temporary(tmp_path):
    path = tmp_path / "sub" / "credentials.json"
    write_atomic(path, b"first")
    write_atomic(path, b"second", mode=0o600)
    assert path.read_bytes() == b"second"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert os.listdir(path.parent) == ["credentials.json"]


def test_a_failed_atomic_write_keeps_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "spec.json"
    write_atomic(path, b"old")

    def refuse(*_args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", refuse)
    with pytest.raises(OSError):
        write_atomic(path, b"new")
    assert path.read_bytes() == b"old" and os.listdir(tmp_path) == ["spec.json"]


# --------------------------------------------------------------------------- streamed JSON lines

def test_json_lines_read_in_small_chunks_equal_a_whole_read(tmp_path):
    items = [{"n": i, "text": "x" * (i * 7 % 23)} for i in range(200)]
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps(i) + ("\n\n" if i["n"] % 10 == 0 else "\n") for i in items).rstrip("\n"))
    for chunk in (1, 7, 64, 1 << 16):
        stats = JsonLinesStats()
        assert list(iter_json_lines(path, chunk_bytes=chunk, stats=stats)) == items
        assert (stats.lines, stats.too_long, stats.bytes_read) == (200, 0, path.stat().st_size)


def test_a_line_over_the_limit_is_skipped_and_counted_not_kept(tmp_path):
    path = tmp_path / "r.jsonl"
    long_line = json.dumps({"pad": "y" * 5000})
    path.write_text("\n".join([json.dumps({"n": 1}), long_line, json.dumps({"n": 2}), long_line]))
    stats = JsonLinesStats()
    assert list(iter_json_lines(path, max_line_bytes=1000, chunk_bytes=256, stats=stats)) == [{"n": 1}, {"n": 2}]
    assert (stats.lines, stats.too_long) == (2, 2)


def test_a_line_that_is_not_json_names_its_number(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text('{"n": 1}\n{broken\n')
    with pytest.raises(ValueError, match="line 2 is not JSON"):
        list(iter_json_lines(path))
