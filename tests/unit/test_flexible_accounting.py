"""OCS/GCS 9 flexible accounting of tco's token totals (issue 12, item 3).

Chain: the runner writes ``tco_<key>=<n>`` lines to ``<task>.usage``; the usage epilog
(execution/usage_epilog.py) appends them to the shepherd's usage file; with ``reporting_params
usage_patterns=tco:tco_*`` OCS puts them into the accounting record's ``usage.tco`` object
(sge_conf(5) of OCS 9, ``usage_patterns``; GRIDENGINE.md section 2); ingest keeps them as
``AccountingRecord.tokens`` and checks them against the runner record's totals.

What is real and what is documented: the OCS 9.1.4 captures (tests/fixtures/ocs914, a cell with
``reporting_params accounting=true reporting=true flush_time=... joblog=true ...``, no
``usage_patterns``) carry **no** flexible-accounting group: their ``tco_`` strings are a job name
(``tco_adapter_test``, jobs 22) and a job context (``-ac tco_campaign=17``), not usage values.
The tests on them check that nothing is invented from them. The ``usage.tco`` records below are a
real captured record (job 17) with the group added in the shape sge_conf(5) documents (JSON
numbers; qacct <= 9.1 reads them as doubles); they are labelled as such.
"""
from __future__ import annotations

import re
from pathlib import Path


from execution.metering.usage_file import append_usage_file
from execution.usage_epilog import append
from schedulers.gridengine.parsers.accounting import parse_line, read_accounting, usage_group_values
from tests.support.ocs914 import captured_records, job17_line, with_tco_group

CAPTURES = Path(__file__).resolve().parent.parent / "fixtures" / "ocs914"


# ------------------------------------------------------------------ the real captures

def test_the_captured_records_carry_no_flexible_accounting_and_none_is_read():
    raw = captured_records("accounting.jsonl")
    assert len(raw) == 253
    # Read independently: every record's usage has exactly rusage and eusage.
    assert {tuple(sorted(r["usage"])) for r in raw} == {("eusage", "rusage")}
    batch = read_accounting(CAPTURES / "accounting.jsonl", None, max_bytes=10 * 1024 * 1024)
    assert len(batch.records) == 253
    assert all(r.usage == {} and usage_group_values(r.usage, "tco", "tco_") == {} for r in batch.records)


def test_the_tco_strings_of_the_captures_are_names_and_contexts_not_usage_values():
    acct = (CAPTURES / "accounting.jsonl").read_text()
    assert sorted(set(re.findall(r"tco_[a-z_]+", acct))) == ["tco_adapter_test", "tco_campaign"]
    reporting_acct = [r for r in captured_records("reporting.jsonl") if r.get("type") == "acct"]
    assert reporting_acct and all(set(r["usage"]) == {"rusage", "eusage"} for r in reporting_acct)
    # qacct -j prints a flexible value as its own "name value" line (GRIDENGINE.md section 2): none here.
    for name in ("qacct_j_17.txt", "qacct_j_22.txt"):
        keys = [line.split()[0] for line in (CAPTURES / name).read_text().splitlines() if line.strip()]
        assert [k for k in keys if k.startswith("tco_")] == []
        assert "wallclock" in keys and "ru_wallclock" in keys
    # qacct -j 17's job context is where tco_campaign comes from.
    assert "-ac tco_campaign=17" in (CAPTURES / "qacct_j_17.txt").read_text()
    # The cell's reporting_params, as qconf printed them, have no usage_patterns.
    conf = (CAPTURES / "config" / "qconf_sconf_global.txt").read_text()
    assert "reporting_params" in conf and "usage_patterns" not in conf


# ------------------------------------------------------------------ parser (documented shape)

def test_the_parser_keeps_the_tco_group_of_a_record_and_maps_its_names():
    line = with_tco_group(job17_line(), {"tco_input_tokens": 1200.0, "tco_output_tokens": 85,
                                          "tco_cost_usd": 0.0042, "tco_model": "opus", "other": 7,
                                          "tco_flag": True})
    rec = parse_line(line)
    # The real record's other values are untouched (qacct_j_17.txt: ru_wallclock 5, wallclock 5.016).
    assert (rec.job_number, rec.wallclock_s, round(rec.wallclock_exact_s, 3)) == (17, 5, 5.016)
    assert rec.usage["tco"]["tco_input_tokens"] == 1200.0
    values = usage_group_values(rec.usage, "tco", "tco_")
    # Strings (OCS 9.2 quoted values) and booleans are not numbers; "other" lacks the prefix.
    assert values == {"input_tokens": 1200, "output_tokens": 85, "cost_usd": 0.0042}
    assert isinstance(values["input_tokens"], int)
    assert usage_group_values(rec.usage, "gpu") == {}
    assert usage_group_values({"tco": ["not", "an", "object"]}, "tco") == {}


def test_the_epilog_lines_come_back_as_the_runner_totals(tmp_path):
    """Runner -> epilog -> (qacct's doubles, as OCS would write them) -> parser -> ingest's buckets."""
    from dashboards.ingest.accounting import accounting_tokens

    spool, job_spool = tmp_path / "spool", tmp_path / "job"
    (spool / "records" / "9").mkdir(parents=True)
    job_spool.mkdir()
    (job_spool / "usage").write_text("wallclock=5.016431\n")  # the shepherd's own line
    totals = {"requests": 3, "input_tokens": 1200, "cache_read_tokens": 40000, "cache_write_5m_tokens": 512,
              "cache_write_1h_tokens": 0, "output_tokens": 85, "reasoning_tokens": 20, "total_tokens": 41797,
              "cost_usd": "0.0042"}
    append_usage_file(spool / "records" / "9" / "2.usage", totals)
    append({"TCO_SPOOL_DIR": str(spool), "TCO_CAMPAIGN_ID": "9", "SGE_TASK_ID": "2",
            "SGE_JOB_SPOOL_DIR": str(job_spool)})
    # usage_patterns=tco:tco_* selects the tco_ lines; qacct <= 9.1 holds them as doubles.
    group = {}
    for line in (job_spool / "usage").read_text().splitlines():
        name, value = line.split("=")
        if name.startswith("tco_"):
            group[name] = float(value)
    rec = parse_line(with_tco_group(job17_line(), group))
    assert accounting_tokens(rec.usage) == {"input_tokens": 1200, "cache_read_tokens": 40000,
                                            "cache_write_5m_tokens": 512, "cache_write_1h_tokens": 0,
                                            "output_tokens": 85, "reasoning_tokens": 20}


# ------------------------------------------------------------------ the check

def test_a_mismatch_is_flagged_with_both_numbers():
    from dashboards.ingest.accounting import token_check

    check = token_check({"input_tokens": 1200, "output_tokens": 85}, {"input_tokens": 1150, "output_tokens": 85})
    assert check["status"] == "differs"
    assert check["message"] == "accounting says 1,200 input tokens, metering 1,150"
    assert check["buckets"]["input_tokens"] == {"accounting": 1200, "metering": 1150}
    # A bucket metering lacks counts as 0; nothing to compare without a runner record.
    assert token_check({"cache_write_1h_tokens": 3}, {})["message"] == \
        "accounting says 3 cache write 1h tokens, metering 0"
    assert token_check({"input_tokens": 1}, None) is None
    assert token_check({}, {"input_tokens": 1}) is None


def test_equal_totals_are_confirmed():
    from dashboards.ingest.accounting import token_check

    check = token_check({"input_tokens": 1200, "output_tokens": 85},
                        {"input_tokens": 1200, "output_tokens": 85, "cost_usd": "0.01"})
    assert check["status"] == "confirmed"
    assert check["message"] == "accounting confirms metering: 1,200 input tokens, 85 output tokens"
