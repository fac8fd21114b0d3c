"""The flexible-accounting epilog (OCS/GCS 9), at the file level: numeric tco_ lines only, appended."""
from __future__ import annotations

from execution.metering.usage_file import append_usage_file
from execution.usage_epilog import append


def test_it_appends_the_runner_totals_after_the_shepherd_lines(tmp_path):
    spool, job_spool = tmp_path / "spool", tmp_path / "active_jobs" / "77.3"
    (spool / "records" / "5").mkdir(parents=True)
    job_spool.mkdir(parents=True)
    (job_spool / "usage").write_text("wallclock=12.5\nru_utime=0.3\n")
    totals = {"requests": 2, "input_tokens": 110, "cache_read_tokens": 1000, "output_tokens": 25,
              "total_tokens": 1135, "cost_usd": "0.0015"}
    append_usage_file(spool / "records" / "5" / "3.usage", totals)
    env = {"TCO_SPOOL_DIR": str(spool), "TCO_CAMPAIGN_ID": "5", "SGE_TASK_ID": "3",
           "SGE_JOB_SPOOL_DIR": str(job_spool)}
    lines = append(env)
    assert (job_spool / "usage").read_text().splitlines() == [
        "wallclock=12.5", "ru_utime=0.3", "tco_requests=2", "tco_input_tokens=110", "tco_cache_read_tokens=1000",
        "tco_output_tokens=25", "tco_total_tokens=1135", "tco_cost_usd=0.0015"]
    assert lines[-1] == "tco_cost_usd=0.0015"


def test_lines_a_job_could_have_forged_are_dropped(tmp_path):
    spool, job_spool = tmp_path / "spool", tmp_path / "job"
    (spool / "records" / "5").mkdir(parents=True)
    job_spool.mkdir()
    (spool / "records" / "5" / "1.usage").write_text(  # a non-array job's runner writes as task 1
        "tco_input_tokens=10\nru_wallclock=0\ntco_model=opus\ntco_x=1e9\ntco_output_tokens=4\n")
    appended = append({"TCO_SPOOL_DIR": str(spool), "TCO_CAMPAIGN_ID": "5", "SGE_TASK_ID": "undefined",
                       "SGE_JOB_SPOOL_DIR": str(job_spool)})
    assert appended == ["tco_input_tokens=10", "tco_output_tokens=4"]
    assert (job_spool / "usage").read_text() == "tco_input_tokens=10\ntco_output_tokens=4\n"


def test_a_task_without_totals_appends_nothing(tmp_path):
    job_spool = tmp_path / "job"
    job_spool.mkdir()
    assert append({"TCO_SPOOL_DIR": str(tmp_path), "TCO_CAMPAIGN_ID": "5", "SGE_TASK_ID": "1",
                   "SGE_JOB_SPOOL_DIR": str(job_spool)}) == []
    assert not (job_spool / "usage").exists()
