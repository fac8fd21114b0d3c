"""GridEngine submission validation, native specification, control argv and run_command.

No cluster is needed: DRMAA is replaced by a spy, so "nothing submitted" is
checked by the spy never being called.
"""
from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap

import pytest

from schedulers.base import (
    ArrayJobSpec,
    InvalidSubmission,
    SchedulerCommandError,
    SchedulerParseError,
    SchedulerUnavailable,
)
from schedulers.gridengine import adapter as adapter_module
from schedulers.gridengine import drmaa as drmaa_session
from schedulers.gridengine import native_spec
from schedulers.gridengine.adapter import GridEngine
from schedulers.gridengine.commands import control_argv, run_command
from schedulers.gridengine.drmaa import parse_job_ids
from schedulers.gridengine.native_spec import job_id_arguments, sanitize_name

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def make_spec(**overrides) -> ArrayJobSpec:
    fields = dict(
        name="campaign-42",
        command="/work/main/.venv/bin/python",
        args=["-m", "execution.runner"],
        count=5,
        queue="agent.q",
        project="research",
        resources={"anthropic_api": 1},
        environment={"TCO_CAMPAIGN_ID": "42", "TCO_SPOOL_DIR": "/srv/tco/spool"},
        working_directory="/srv/tco/spool",
        output_path="/srv/tco/spool/logs/42.$TASK_ID.out",
        error_path="/srv/tco/spool/logs/42.$TASK_ID.err",
    )
    fields.update(overrides)
    return ArrayJobSpec(**fields)


@pytest.fixture
def engine() -> GridEngine:
    return GridEngine(queues=["agent.q", "classic.q"], projects=["research", "engineering"],
                      resources=["anthropic_api"])


@pytest.fixture
def drmaa_spy(monkeypatch):
    calls = []

    def fake_run_bulk(spec, native_specification, **session):
        calls.append({**drmaa_session.template_attributes(spec, native_specification), "count": spec.count,
                      "hold": spec.hold})
        return 123, list(range(1, spec.count + 1))

    def no_session(**_kwargs):
        raise AssertionError("the DRMAA session must not be touched")

    monkeypatch.setattr(drmaa_session, "run_bulk", fake_run_bulk)
    monkeypatch.setattr(drmaa_session, "open_session", no_session)
    return calls


# --------------------------------------------------------------------------- valid input

def test_it_builds_the_native_specification_from_fields_only(engine):
    native = engine.native_specification(make_spec(concurrency_cap=8, hold_jid_ad=77,
                                                   advance_reservation=5, priority=-10))
    assert native == ("-q agent.q -P research -l anthropic_api=1 -p -10 -A tco "
                      "-tc 8 -hold_jid_ad 77 -ar 5")
    assert "-t " not in native + " "  # -t in a native spec does not make an array
    assert "-notify" not in native


def test_notify_is_added_only_when_the_cluster_is_configured_for_it():
    engine = GridEngine(queues=["agent.q"], projects=["research"], resources=["anthropic_api"], notify=True)
    assert engine.native_specification(make_spec()).endswith(" -notify")


def test_it_submits_through_run_bulk_with_drmaa_attributes(engine, drmaa_spy):
    job_number, tasks = engine.submit_array(make_spec(hold=True))
    assert (job_number, tasks) == (123, [1, 2, 3, 4, 5])
    (call,) = drmaa_spy
    assert call["count"] == 5
    assert call["jobName"] == "campaign-42"
    assert call["outputPath"] == ":/srv/tco/spool/logs/42.$TASK_ID.out"
    assert call["errorPath"] == ":/srv/tco/spool/logs/42.$TASK_ID.err"
    assert call["jobEnvironment"] == {"TCO_CAMPAIGN_ID": "42", "TCO_SPOOL_DIR": "/srv/tco/spool"}
    assert call["hold"] is True
    assert call["nativeSpecification"].startswith("-q agent.q -P research")


def test_it_accepts_string_resource_values_and_priority_bounds(engine, drmaa_spy):
    engine.submit_array(make_spec(resources={"anthropic_api": "2"}, priority=1024))
    engine.submit_array(make_spec(resources={}, priority=-1023, count=75_000))
    assert len(drmaa_spy) == 2
    assert "-l" not in drmaa_spy[1]["nativeSpecification"].split()


# --------------------------------------------------------------------------- rejections

REJECTED = {
    "user root via queue": dict(queue="agent.q -u root"),
    "user root via project": dict(project="-u root"),
    "shell injection in queue": dict(queue="agent.q; rm -rf /"),
    "shell injection in resource value": dict(resources={"anthropic_api": "1; rm -rf /"}),
    "option smuggled in resource value": dict(resources={"anthropic_api": "1 -u root"}),
    "option smuggled in resource name": dict(resources={"anthropic_api=1 -P engineering -l x": 1}),
    "newline in queue": dict(queue="agent.q\n-u root"),
    "newline in job name": dict(name="ok\nname"),
    "space in job name": dict(name="my campaign"),
    "colon in job name": dict(name="campaign:42"),
    "slash in job name": dict(name="a/b"),
    "at in job name": dict(name="a@b"),
    "backslash in job name": dict(name="a\\b"),
    "star in job name": dict(name="a*"),
    "question mark in job name": dict(name="a?"),
    "job name starting with a digit": dict(name="42"),
    "job name too long": dict(name="x" * 65),
    "empty job name": dict(name=""),
    "unknown queue": dict(queue="all.q"),
    "unknown project": dict(project="marketing"),
    "unknown resource": dict(resources={"h_vmem": "4G"}),
    "negative resource": dict(resources={"anthropic_api": -1}),
    "colon in account": dict(account="a:b"),
    "option as account": dict(account="-u"),
    "option as job name": dict(name="-N"),
    "job name starting with a dot": dict(name=".hidden"),
    "space in account": dict(account="a b"),
    "priority too high": dict(priority=1025),
    "priority too low": dict(priority=-1024),
    "priority not int": dict(priority="10"),
    "priority bool": dict(priority=True),
    "zero count": dict(count=0),
    "negative count": dict(count=-5),
    "huge count": dict(count=75_001),
    "count not int": dict(count=5.0),
    "zero concurrency cap": dict(concurrency_cap=0),
    "negative concurrency cap": dict(concurrency_cap=-1),
    "string predecessor": dict(hold_jid_ad="77 -u root"),
    "negative advance reservation": dict(advance_reservation=-3),
    "comma in environment value": dict(environment={"A": "x,B=y"}),
    "newline in environment value": dict(environment={"A": "x\ny"}),
    "bad environment name": dict(environment={"A B": "x"}),
    "LD_PRELOAD in environment": dict(environment={"LD_PRELOAD": "/tmp/evil.so"}),
    "forged JOB_ID in environment": dict(environment={"JOB_ID": "1"}),
    "forged SGE_TASK_ID in environment": dict(environment={"SGE_TASK_ID": "1"}),
    "relative command": dict(command="python"),
    "command with space": dict(command="/bin/sh -c id"),
    "colon in output path": dict(output_path="/tmp/a:b"),
    "host in output path": dict(output_path="otherhost:/tmp/out"),
    "comma in error path": dict(error_path="/tmp/a,/tmp/b"),
    "relative working directory": dict(working_directory="spool"),
    "newline in args": dict(args=["-m", "execution.runner\n-u root"]),
    "args not a list": dict(args="-m execution.runner"),
    "hold not bool": dict(hold="yes"),
}


@pytest.mark.parametrize("overrides", REJECTED.values(), ids=REJECTED.keys())
def test_it_rejects_invalid_input_and_submits_nothing(engine, drmaa_spy, overrides):
    with pytest.raises(InvalidSubmission) as excinfo:
        engine.submit_array(make_spec(**overrides))
    assert str(excinfo.value)  # a message a user can read
    assert drmaa_spy == []


def test_invalid_submission_is_a_value_error():
    assert issubclass(InvalidSubmission, ValueError)


def test_an_empty_allow_list_allows_nothing(drmaa_spy):
    with pytest.raises(InvalidSubmission, match="not allowed"):
        GridEngine().submit_array(make_spec())
    assert drmaa_spy == []


def test_sanitize_name_makes_a_valid_job_name(engine):
    name = sanitize_name("42: my campaign/@home*?" + "x" * 100)
    assert name.startswith("j42_")
    assert sanitize_name("-u root") == "j-u_root"
    assert len(name) <= native_spec.JOB_NAME_MAX
    engine.native_specification(make_spec(name=name))  # does not raise
    assert sanitize_name("   ") == "tco"


# --------------------------------------------------------------------------- control

def test_job_ids_are_separate_ranges_never_comma_lists():
    assert job_id_arguments(7) == ["7"]
    assert job_id_arguments(7, [5, 1, 2, 3, 3]) == ["7.1-3", "7.5"]
    assert job_id_arguments(7, [4]) == ["7.4"]


@pytest.mark.parametrize("action,kwargs,argv", [
    ("hold", {}, ["qhold", "9"]),
    ("release", {"task_numbers": [1, 2]}, ["qrls", "9.1-2"]),
    ("delete", {"task_numbers": [1, 3]}, ["qdel", "9.1", "9.3"]),
    ("priority", {"priority": 1024}, ["qalter", "-p", "1024", "9"]),
    ("clear_error", {}, ["qmod", "-cj", "9"]),
])
def test_control_runs_the_right_command(monkeypatch, engine, action, kwargs, argv):
    seen = []
    monkeypatch.setattr(adapter_module, "run_command", lambda a, **kw: seen.append((a, kw)) or b"")
    engine.control(action, 9, **kwargs)
    assert seen[0][0] == argv
    assert seen[0][1]["env_extra"] == {"SGE_ROOT": engine.sge_root, "SGE_CELL": engine.sge_cell}


@pytest.mark.parametrize("args", [
    ("kill", 9), ("hold", "9; rm -rf /"), ("hold", -1), ("hold", 0), ("hold", True),
    ("hold", 9, ["1-3"]), ("hold", 9, [0]), ("hold", 9, []),
    ("priority", 9, None, 2000), ("priority", 9, None, None), ("priority", 9, [1], 10),
    ("delete", 9, None, 5),
])
def test_control_rejects_bad_requests_before_running_anything(monkeypatch, engine, args):
    monkeypatch.setattr(adapter_module, "run_command", lambda *a, **k: pytest.fail("ran a command"))
    with pytest.raises(InvalidSubmission):
        engine.control(*args)


def test_control_argv_is_reused_by_the_fake():
    assert control_argv("delete", 3) == ["qdel", "3"]


# --------------------------------------------------------------------------- job ids

def test_parse_job_ids_reads_bulk_ids():
    assert parse_job_ids(["123.1", "123.2", "123.3"]) == (123, [1, 2, 3])
    with pytest.raises(SchedulerParseError):
        parse_job_ids([])
    with pytest.raises(SchedulerParseError):
        parse_job_ids(["123.1", "124.2"])
    with pytest.raises(SchedulerParseError):
        parse_job_ids(["Your job 123 has been submitted"])


# --------------------------------------------------------------------------- run_command

def test_run_command_runs_in_utc_and_c_locale_with_a_cell():
    out = run_command(["env"], env_extra={"SGE_CELL": "other", "TZ": "Europe/Paris"}).decode()
    env = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    assert env["TZ"] == "UTC" and env["LC_ALL"] == "C"
    assert env["SGE_CELL"] == "other" and env["SGE_ROOT"]


def test_run_command_never_uses_a_shell(tmp_path):
    marker = tmp_path / "pwned"
    out = run_command(["echo", f"; touch {marker}"])
    assert out == f"; touch {marker}\n".encode() and not marker.exists()


def test_a_missing_binary_is_unavailable():
    with pytest.raises(SchedulerUnavailable, match="qstat-that-does-not-exist: .*not found"):
        run_command(["qstat-that-does-not-exist"])


def test_a_timeout_is_unavailable():
    with pytest.raises(SchedulerUnavailable, match="no answer"):
        run_command(["sleep", "5"], timeout=0.2)


@pytest.mark.parametrize("message", [
    'error: commlib error: got select error (Connection refused)',
    'error: unable to contact qmaster using port 6444 on host "vm"',
])
def test_an_unreachable_qmaster_is_unavailable(message):
    with pytest.raises(SchedulerUnavailable, match="cannot reach the qmaster"):
        run_command(["sh", "-c", f"echo '{message}' >&2; exit 1"])


def test_a_refusal_is_a_command_error_with_stderr():
    with pytest.raises(SchedulerCommandError) as excinfo:
        run_command(["sh", "-c", 'echo \'denied: job "5" does not exist\' >&2; exit 1'])
    err = excinfo.value
    assert err.returncode == 1 and 'job "5" does not exist' in err.stderr
    assert err.argv[0] == "sh"


def test_run_command_rejects_a_string():
    with pytest.raises(TypeError):
        run_command("qstat -xml")


# --------------------------------------------------------------------------- DRMAA loading

def test_loading_libdrmaa_without_preload_names_the_fix():
    if not os.path.exists(drmaa_session.DEFAULT_DRMAA_LIBRARY_PATH):
        pytest.skip("libdrmaa is not installed on this machine")
    code = textwrap.dedent("""
        from schedulers.gridengine import drmaa as drmaa_session
        from schedulers.base import SchedulerUnavailable
        try:
            drmaa_session.load_drmaa()
        except SchedulerUnavailable as exc:
            print("UNAVAILABLE", exc)
        else:
            print("LOADED")
    """)
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "DRMAA_LIBRARY_PATH")}
    env.update(PYTHONPATH=REPO, PYTHONDONTWRITEBYTECODE="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=30).stdout
    # Debian's libdrmaa links jemalloc; loaded late it fails unless preloaded.
    assert out.startswith("UNAVAILABLE") or out.startswith("LOADED"), out
    if out.startswith("UNAVAILABLE"):
        assert "LD_PRELOAD=" + drmaa_session.JEMALLOC_PRELOAD in out


def test_spec_fields_are_all_covered_by_validation():
    # A new ArrayJobSpec field must be validated (or knowingly ignored) here.
    known = {"name", "command", "args", "count", "queue", "project", "resources", "environment",
             "working_directory", "output_path", "error_path", "account", "priority",
             "concurrency_cap", "hold_jid_ad", "advance_reservation", "hold", "rerunnable"}
    assert {f.name for f in dataclasses.fields(ArrayJobSpec)} == known


def test_projects_come_from_qstat_ext_once_per_new_job(monkeypatch):
    """Plain qstat -xml has no JB_project; -ext has it but no times (SGE 8.1.9)."""

    plain = b"""<?xml version='1.0'?><job_info><queue_info></queue_info><job_info>
<job_list state="pending"><JB_job_number>901</JB_job_number><JAT_prio>0</JAT_prio><JB_name>x</JB_name>
<JB_owner>alice</JB_owner><state>qw</state><JB_submission_time>2026-11-29T12:00:00</JB_submission_time>
<queue_name></queue_name><slots>1</slots></job_list></job_info></job_info>"""
    ext = b"""<?xml version='1.0'?><job_info><queue_info></queue_info><job_info>
<job_list state="pending"><JB_job_number>901</JB_job_number><JAT_prio>0</JAT_prio><JAT_ntix>0</JAT_ntix>
<JB_name>x</JB_name><JB_owner>alice</JB_owner><JB_project>engineering</JB_project>
<JB_department>defaultdepartment</JB_department><state>qw</state><tickets>0</tickets>
<JB_override_tickets>0</JB_override_tickets><JB_jobshare>0</JB_jobshare><otickets>0</otickets>
<ftickets>0</ftickets><stickets>0</stickets><JAT_share>0</JAT_share><queue_name></queue_name>
<slots>1</slots></job_list></job_info></job_info>"""
    calls = []

    def fake_run(self, argv, timeout=None):
        calls.append(argv)
        return ext if "-ext" in argv else plain

    monkeypatch.setattr(GridEngine, "_run", fake_run)
    monkeypatch.setattr(adapter_module, "_PROJECTS", {})
    engine = GridEngine(sge_root="/x", sge_cell="c")
    (task,) = engine.list_tasks()
    assert task.project == "engineering" and task.submitted_at is not None
    (task,) = engine.list_tasks()
    assert task.project == "engineering"
    assert sum("-ext" in argv for argv in calls) == 1
