"""Submit real array jobs through GridEngine.submit_array (DRMAA) on the dev cluster.

The job runs the real runner (``python -m execution.runner``) with the demo
agent; the test waits for qstat to lose the job and for the accounting file
to hold its records, then checks the runner records against both.
"""
from __future__ import annotations

import functools
import json
import os
import signal
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from schedulers.base import ArrayJobSpec, SchedulerCommandError, SchedulerUnavailable
from schedulers.gridengine.adapter import GridEngine
from schedulers.gridengine.commands import run_command
from tests import helpers

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
STAGES = ["task_started_at", "sandbox_create_at", "sandbox_ready_at", "agent_started_at", "agent_exited_at",
          "teardown_done_at"]
QUEUE, PROJECT = "agent.q", "research"


@pytest.fixture
def engine(sge_cluster) -> GridEngine:
    return GridEngine(queues=[QUEUE, "classic.q"], projects=[PROJECT, "engineering"],
                      resources=["anthropic_api"], sge_root=sge_cluster["sge_root"],
                      sge_cell=sge_cluster["sge_cell"])


@pytest.fixture
def submitted(engine):
    """Job numbers submitted by a test; deleted at the end if still there."""
    jobs: list[int] = []
    yield jobs
    for job in jobs:
        if job in active_job_numbers(engine):
            try:
                engine.control("delete", job)
            except SchedulerCommandError:
                pass  # it ended between the two calls (a deleted job lingers in qstat for a moment)


def make_campaign(spool: Path, campaign_id: str, inputs: list[dict], **spec_extra) -> None:
    campaign_dir = spool / "campaigns" / campaign_id
    campaign_dir.mkdir(parents=True)
    (spool / "logs").mkdir(exist_ok=True)
    (campaign_dir / "inputs.jsonl").write_text("".join(json.dumps(i) + "\n" for i in inputs))
    spec = {"version": 1, "campaign_id": campaign_id,
            "agent": {"command": [sys.executable, "-m", "demo.demo_agent", "{input}", "{workdir}"]},
            "inputs_file": "inputs.jsonl", "timeout_s": 120, **spec_extra}
    (campaign_dir / "spec.json").write_text(json.dumps(spec))


def make_spec(spool: Path, campaign_id: str, count: int, **overrides) -> ArrayJobSpec:
    fields = dict(
        name=f"tco-test-{campaign_id}",
        command=sys.executable,
        args=["-m", "execution.runner"],
        count=count,
        queue=QUEUE,
        project=PROJECT,
        resources={"anthropic_api": 1},
        # The repo and venv belong to root and are read-only for tco.
        environment={"TCO_SPOOL_DIR": str(spool), "TCO_CAMPAIGN_ID": campaign_id,
                     "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1"},
        working_directory=str(spool),
        output_path=f"{spool}/logs/{campaign_id}.$TASK_ID.out",
        error_path=f"{spool}/logs/{campaign_id}.$TASK_ID.err",
    )
    fields.update(overrides)
    return ArrayJobSpec(**fields)


def active_job_numbers(engine: GridEngine) -> set[int]:
    root = ET.fromstring(engine._run(["qstat", "-xml", "-u", "*"]))
    return {int(el.text) for el in root.iter("JB_job_number")}


def qstat_states(engine: GridEngine, job_number: int) -> list[str]:
    root = ET.fromstring(engine._run(["qstat", "-xml", "-u", "*"]))
    return [job.findtext("state") for job in root.iter("job_list")
            if job.findtext("JB_job_number") == str(job_number)]


def accounting_rows(path: str, job_number: int) -> list[dict]:
    """Minimal accounting reader: SGE 8 colon lines (fields 1-39 are safe from the left;
    accounting(5)) and OCS 9 JSON lines. Where schedulers.gridengine.parsers.accounting.parse_line
    exists it must agree on every line of this job."""
    try:
        from schedulers.gridengine.parsers.accounting import parse_line
    except ImportError:
        parse_line = None
    rows = []
    with open(path, "rb") as fh:
        for raw in fh:
            line = raw.rstrip(b"\n").decode("utf-8", "replace")
            if len(line) <= 1 or line.startswith("#"):
                continue
            if line.startswith("{"):
                d = json.loads(line)
                row = {"job_number": d["job_number"], "queue": d["qname"], "task_number": d["task_number"],
                       "project": d.get("project"), "failed": d["failed"],
                       "exit_status": d["exit_status"], "owner": d["owner"]}
            else:
                f = line.split(":")
                row = {"job_number": int(f[5]), "queue": f[0], "task_number": int(f[35]), "project": f[31],
                       "failed": int(f[11]), "exit_status": int(f[12]), "owner": f[3]}
            if row["job_number"] != job_number:
                continue
            if parse_line is not None:
                rec = parse_line(raw)
                assert (rec.job_number, rec.task_number, rec.queue, rec.project, rec.failed,
                        rec.exit_status, rec.owner) == (
                    row["job_number"], row["task_number"] or None, row["queue"], row["project"],
                    row["failed"], row["exit_status"], row["owner"]), line
            rows.append(row)
    return rows


wait_until = functools.partial(helpers.wait_until, step=0.2)


def test_a_five_task_array_runs_the_runner_and_is_accounted(engine, submitted, sge_cluster, tmp_path,
                                                             record_property):
    spool = tmp_path / "spool"
    campaign = "it5"
    make_campaign(spool, campaign, [{"task": n, "duration_s": 2} for n in range(1, 6)])

    t_submit = time.monotonic()
    job_number, tasks = engine.submit_array(make_spec(spool, campaign, 5))
    t_submitted = time.monotonic()
    submitted.append(job_number)
    assert tasks == [1, 2, 3, 4, 5]

    wait_until(lambda: job_number not in active_job_numbers(engine), 180, f"job {job_number} to leave qstat")
    t_gone = time.monotonic()
    rows = wait_until(lambda: (lambda r: r if len(r) >= 5 else None)(
        accounting_rows(sge_cluster["accounting_path"], job_number)), 120,
        f"5 accounting records of job {job_number}")
    t_accounted = time.monotonic()

    timings = {"submit_s": t_submitted - t_submit, "submit_to_qstat_gone_s": t_gone - t_submit,
               "submit_to_accounting_s": t_accounted - t_submit}
    for key, value in timings.items():
        record_property(key, round(value, 3))
    print(f"\njob {job_number}: " + ", ".join(f"{k}={v:.2f}" for k, v in timings.items()))

    records_dir = spool / "records" / campaign
    records = {n: json.loads((records_dir / f"{n}.json").read_text()) for n in range(1, 6)}
    for n, record in records.items():
        assert record["version"] == 2 and record["campaign_id"] == campaign
        assert record["sandbox"]["runtime"] == "bubblewrap"
        assert (record["task_number"], record["job_number"]) == (n, job_number)
        assert (record["exit_status"], record["signal"], record["flags"], record["error"]) == (0, None, [], None)
        values = [record["stages"][s] for s in STAGES]
        assert all(values) and values == sorted(values), record["stages"]
        assert Path(record["stdout_path"]).read_text().startswith(f"demo agent (stand-in): task {n} ")
        assert json.loads((spool / "work" / campaign / str(n) / "result.json").read_text())["task"] == n

    assert sorted(r["task_number"] for r in rows) == [1, 2, 3, 4, 5]
    for row in rows:
        assert (row["queue"], row["project"], row["exit_status"], row["failed"]) == (QUEUE, PROJECT, 0, 0)
        assert row["owner"] == os.environ.get("USER", row["owner"])
    # The job's own stdout/stderr went where output_path said ($TASK_ID expanded).
    assert sorted(p.name for p in (spool / "logs").iterdir()) == sorted(
        [f"{campaign}.{n}.out" for n in range(1, 6)] + [f"{campaign}.{n}.err" for n in range(1, 6)])


def test_a_held_array_can_be_controlled_per_task(engine, submitted, tmp_path):
    spool = tmp_path / "spool"
    campaign = "ithold"
    make_campaign(spool, campaign, [{"task": n, "duration_s": 1} for n in range(1, 5)])
    job_number, _ = engine.submit_array(make_spec(spool, campaign, 4, hold=True, priority=-5))
    submitted.append(job_number)
    assert qstat_states(engine, job_number) == ["hqw"]  # one pending range, held

    engine.control("priority", job_number, priority=10)
    # Separate ids, never "N.1,3": a comma would name job 3.
    engine.control("delete", job_number, [1, 3])
    wait_until(lambda: _pending_tasks(engine, job_number) == {2, 4}, 20, "only tasks 2 and 4 to remain")
    engine.control("delete", job_number)
    wait_until(lambda: job_number not in active_job_numbers(engine), 30, "the job to go")


def _pending_tasks(engine: GridEngine, job_number: int) -> set[int]:
    """Task numbers of the job's pending ranges (``tasks`` is like ``2-4:2`` or ``1,3``)."""
    root = ET.fromstring(engine._run(["qstat", "-xml", "-u", "*"]))
    numbers: set[int] = set()
    for job in root.iter("job_list"):
        if job.findtext("JB_job_number") != str(job_number):
            continue
        for part in (job.findtext("tasks") or "").split(","):
            if not part:
                continue
            span, _, step = part.partition(":")
            first, _, last = span.partition("-")
            numbers.update(range(int(first), int(last or first) + 1, int(step or 1)))
    return numbers


def test_an_unschedulable_request_is_refused_at_submit(engine, tmp_path):
    spool = tmp_path / "spool"
    make_campaign(spool, "itbig", [{"task": 1}])
    # More API seats than the cluster has: libdrmaa's -w e refuses it at submit.
    with pytest.raises(SchedulerCommandError) as excinfo:
        engine.submit_array(make_spec(spool, "itbig", 1, resources={"anthropic_api": 100000}))
    assert excinfo.value.stderr


def test_an_unreachable_qmaster_is_unavailable_not_an_empty_queue(sge_cluster):
    with pytest.raises(SchedulerUnavailable):
        run_command(["qstat", "-xml", "-u", "*"], timeout=10,
                    env_extra={"SGE_ROOT": sge_cluster["sge_root"], "SGE_CELL": sge_cluster["sge_cell"],
                               "SGE_QMASTER_PORT": "1"})


def _agent_states(campaign: str) -> list[bytes]:
    """/proc states of the live demo agents of ``campaign`` (each in its sandbox, which
    shows its environment to the host's /proc, not its paths)."""
    states = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{name}/cmdline").read_bytes()
            environ = Path(f"/proc/{name}/environ").read_bytes().split(b"\0")
            state = Path(f"/proc/{name}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        # The relay's command line holds the agent's too: it is not the agent.
        if b"demo.demo_agent" in cmdline and b"tco-relay" not in cmdline \
                and f"TCO_CAMPAIGN_ID={campaign}".encode() in environ:
            states.append(state)
    return states


def test_suspending_a_task_stops_its_agent_too(engine, submitted, tmp_path):
    # The shepherd stops the job's process group; the sandbox is in its own session,
    # and its relay (PID 1) stops and continues the agent with the runner.
    spool = tmp_path / "spool"
    make_campaign(spool, "itsusp", [{"task": 1, "duration_s": 60}])
    job_number, _ = engine.submit_array(make_spec(spool, "itsusp", 1))
    submitted.append(job_number)
    marker = "itsusp"
    wait_until(lambda: _agent_states(marker), 60, "the agent to start")
    run_command(["qmod", "-sj", f"{job_number}.1"])
    wait_until(lambda: _agent_states(marker) == [b"T"], 20, "the agent to be stopped")
    run_command(["qmod", "-usj", f"{job_number}.1"])
    wait_until(lambda: _agent_states(marker) and b"T" not in _agent_states(marker), 20, "the agent to continue")
    engine.control("delete", job_number)
    wait_until(lambda: not _agent_states(marker), 30, "qdel to kill the agent with its runner")


def test_with_notify_qdel_leaves_a_runner_record(sge_cluster, submitted, tmp_path):
    engine = GridEngine(queues=[QUEUE], projects=[PROJECT], resources=["anthropic_api"], notify=True,
                        sge_root=sge_cluster["sge_root"], sge_cell=sge_cluster["sge_cell"])
    spool = tmp_path / "spool"
    make_campaign(spool, "itnotify", [{"task": 1, "duration_s": 60}], kill_grace_s=2)
    job_number, _ = engine.submit_array(make_spec(spool, "itnotify", 1))
    submitted.append(job_number)
    wait_until(lambda: (spool / "records" / "itnotify" / "1.stdout").exists(), 60, "the agent to start")
    engine.control("delete", job_number)
    record_path = spool / "records" / "itnotify" / "1.json"
    wait_until(record_path.exists, 30, "the runner record after qdel")
    record = json.loads(record_path.read_text())
    # SIGUSR2 by default; SIGTERM where execd_params NOTIFY_KILL=TERM.
    assert record["runner_signal"] in (signal.SIGUSR2, signal.SIGTERM)
    assert record["job_number"] == job_number and record["flags"] == ["runner_signalled"]
    assert record["stages"]["agent_started_at"] and record["stages"]["agent_exited_at"] is None
