"""Sandbox start and integration overhead of real agent tasks on the dev cluster.

Goals (issue 4), from the runner records' stage times (DESIGN.md, "Stages"):

- sandbox start median (``sandbox_ready_at - sandbox_create_at``): <= 0.05 s;
  the article's Podman took 13.0 s. Printed beside bubblewrap's own bare start
  (``bwrap --ro-bind / / true``) measured here in the same run.
- integration overhead median (``(teardown_done_at - task_started_at)`` minus
  sandbox start minus agent work): <= 0.2 s one task at a time, <= 1 s with 96
  at a time on the dev machine's 2 cores; the article: under 2 s with 96
  concurrent agents.

Every task is a real array task on agent.q running tco's runner, which builds
the bubblewrap sandbox from a YAML policy (a model endpoint, the stand-in
model started here) and runs the agent in it. ``--agent true`` runs
``/bin/true``; ``--agent model`` makes one Messages API call through the
relay and the metering proxy (which then starts, on that first request: its
start-up shows in agent work, as the first request's latency, not in the
overhead). Run as the submit account with libdrmaa's environment:

    source scripts/env.sh; as_tco env LD_PRELOAD=$TCO_JEMALLOC .venv/bin/python bench/bench_sandbox.py

Precompile tco once (``python3 -m compileall -q worker``, as root, since the
repository is read-only for tco): the runner and its sandbox modules are then
loaded from bytecode instead of compiled on every task.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from execution.spool.files import write_atomic  # noqa: E402
from execution.spool.layout import SpoolLayout
from execution.spool.record import RunnerRecord
from execution.spool.spec import RunnerSpec
from schedulers.gridengine import drmaa as drmaa_session  # noqa: E402
from schedulers.base import ArrayJobSpec, SchedulerCommandError  # noqa: E402
from schedulers.gridengine.adapter import GridEngine  # noqa: E402
from schedulers.gridengine.commands import run_command  # noqa: E402
from tests.helpers import model_api_policy  # noqa: E402

PYTHON = str(REPO / ".venv" / "bin" / "python")
KEY = "sk-tco-bench-sandbox"
MODEL_AGENT = ("import json, os, urllib.request; "
               "r = urllib.request.Request(os.environ['ANTHROPIC_BASE_URL'] + '/v1/messages', "
               "data=json.dumps({'model': 'claude-bench', 'max_tokens': 8, "
               "'messages': [{'role': 'user', 'content': 'hi'}]}).encode(), "
               "headers={'content-type': 'application/json', 'anthropic-version': '2023-06-01'}); "
               "urllib.request.urlopen(r, timeout=60).read()")


def median_ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:8.1f} ms" if values else "     n/a"


def p90_ms(values: list[float]) -> str:
    if len(values) < 2:
        return "n/a"
    return f"{statistics.quantiles(values, n=10)[-1] * 1000:.1f} ms"


def bare_bwrap(n: int) -> list[float]:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        subprocess.run(["bwrap", "--ro-bind", "/", "/", "true"], check=True)
        times.append(time.perf_counter() - t0)
    return times


def start_model(root: Path, host: str = "127.0.0.1") -> tuple[subprocess.Popen, int]:
    with socket.socket() as s:
        s.bind((host, 0))
        port = s.getsockname()[1]
    (root / "model.key").write_text(KEY + "\n")
    proc = subprocess.Popen([PYTHON, "-m", "demo.demo_model", "--host", host, "--port", str(port), "--api-key-file",
                             str(root / "model.key")], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            socket.create_connection((host, port), 0.5).close()
            return proc, port
        except OSError:
            time.sleep(0.05)
    raise SystemExit("the stand-in model did not start")


def policy(port: int, host: str = "127.0.0.1") -> str:
    return model_api_policy(port, os.path.realpath(sys.executable), host=host)


def run_campaign(ge: GridEngine, spool: Path, campaign: str, count: int, cap: int, command: list[str],
                 policy_text: str, model: str, sleep_s: float, timeout_s: float) -> list[dict]:
    layout = SpoolLayout(spool)
    write_atomic(layout.inputs_path(campaign),
                 "".join(json.dumps({"task": n}) + "\n" for n in range(1, count + 1)).encode())
    if sleep_s:
        command = ["/bin/sh", "-c", f"sleep {sleep_s}; exec \"$@\"", "agent", *command]
    RunnerSpec(campaign_id=campaign, inputs_file="inputs.jsonl", timeout_s=300, command=command, policy=policy_text,
               model_endpoint={"base_url": f"http://{model}", "credential_name": "bench"},
               ).write(layout.spec_path(campaign))
    (spool / "logs").mkdir(exist_ok=True)
    job_spec = ArrayJobSpec(
        name=f"tco-bench-{campaign}", command=PYTHON, args=["-m", "execution.runner"], count=count, queue="agent.q",
        project="research", resources={}, concurrency_cap=cap,
        environment={"TCO_SPOOL_DIR": str(spool), "TCO_CAMPAIGN_ID": campaign, "PYTHONPATH": str(REPO),
                     "PYTHONDONTWRITEBYTECODE": "1"},
        working_directory=str(spool), output_path=str(spool / "logs"), error_path=str(spool / "logs"))
    job, _ = ge.submit_array(job_spec)
    print(f"  job {job}: {count} tasks, at most {cap} at a time", flush=True)
    records_dir = Path(layout.records_dir(campaign))
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            done = len(list(records_dir.glob("*.json"))) if records_dir.exists() else 0
            if done >= count:
                break
            time.sleep(1)
        else:
            raise SystemExit(f"job {job}: only {done} of {count} records after {timeout_s:.0f} s")
    finally:
        if _active(ge, job):
            try:
                run_command(["qdel", str(job)], timeout=30)
            except SchedulerCommandError:
                pass  # it ended between the check and qdel
    return [RunnerRecord.read(p).to_json() for p in sorted(records_dir.glob("*.json"))]


def _active(ge: GridEngine, job: int) -> bool:
    return f"<JB_job_number>{job}</JB_job_number>" in ge._run(["qstat", "-xml", "-u", "*"]).decode()


def _t(value: str) -> float:
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def figures(records: list[dict]) -> dict:
    sandbox, overhead, agent, failed, spans = [], [], [], 0, []
    for r in records:
        s = r["stages"]
        if r["exit_status"] != 0 or not all(s.values()):
            failed += 1
            if failed == 1:
                print(f"  first failed task: exit {r['exit_status']}, flags {r.get('flags')}, error {r.get('error')!r}")
            continue
        start = _t(s["sandbox_ready_at"]) - _t(s["sandbox_create_at"])
        work = _t(s["agent_exited_at"]) - _t(s["agent_started_at"])
        total = _t(s["teardown_done_at"]) - _t(s["task_started_at"])
        sandbox.append(start)
        agent.append(work)
        overhead.append(total - start - work)
        spans.append((_t(s["task_started_at"]), _t(s["teardown_done_at"])))
    events = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans])
    live = peak = 0
    for _, delta in events:
        live += delta
        peak = max(peak, live)
    return {"sandbox": sandbox, "overhead": overhead, "agent": agent, "failed": failed, "peak": peak}


def report(label: str, fig: dict, goal_s: float, article: str) -> None:
    from bench._hosts import cluster_label

    print(f"\n{label} [{cluster_label()}]: {len(fig['sandbox'])} tasks ok, {fig['failed']} failed, "
          f"at most {fig['peak']} at once")
    print(f"  sandbox start median        {median_ms(fig['sandbox'])}  (p90 {p90_ms(fig['sandbox'])}; "
          f"goal <= 50 ms; article's Podman 13.0 s)")
    print(f"  integration overhead median {median_ms(fig['overhead'])}  (p90 {p90_ms(fig['overhead'])}; "
          f"goal <= {goal_s * 1000:.0f} ms; article {article})")
    print(f"  agent work median           {median_ms(fig['agent'])}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serial", type=int, default=100, help="tasks one at a time (0: skip)")
    parser.add_argument("--parallel", type=int, default=192, help="tasks 96 at a time (0: skip)")
    parser.add_argument("--width", type=int, default=96, help="concurrency of the parallel run")
    parser.add_argument("--agent", choices=("true", "model"), default="true")
    parser.add_argument("--agent-sleep-s", type=float, default=3.0,
                        help="agent work in the parallel run, so that the tasks overlap")
    parser.add_argument("--bare", type=int, default=100, help="bare bwrap starts for the baseline")
    args = parser.parse_args()
    if os.getuid() == 0:
        raise SystemExit("run as the submit account (tco), not root")
    root = Path(tempfile.mkdtemp(prefix="tco-bench-sandbox-"))
    spool = root / "spool"
    spool.mkdir()
    write_atomic(SpoolLayout(spool).credentials_path, json.dumps({"bench": KEY}).encode(), mode=0o600)
    # The stand-in model listens on the master's address the execution hosts reach (their network
    # namespaces on the dev cluster; loopback on a single-host cluster).
    from schedulers.hosts import master_address

    host = master_address(os.environ.get("SGE_ROOT", "/var/lib/gridengine"), os.environ.get("SGE_CELL", "default"))
    model, port = start_model(root, host)
    command = ["/bin/true"] if args.agent == "true" else [os.path.realpath(sys.executable), "-c", MODEL_AGENT]
    ge = GridEngine(queues=["agent.q"], projects=["research"], resources=["anthropic_api"])
    drmaa_session.open_session()
    try:
        bare = bare_bwrap(args.bare)
        print(f"bubblewrap's own bare start (bwrap --ro-bind / / true, {len(bare)} runs here): "
              f"median {median_ms(bare).strip()}, p90 {p90_ms(bare)}")
        if args.serial:
            recs = run_campaign(ge, spool, "serial", args.serial, 1, command, policy(port, host), f"{host}:{port}", 0.0,
                                timeout_s=60 + 10 * args.serial)
            report(f"one at a time ({args.agent} agent)", figures(recs), 0.2, "n/a")
        if args.parallel:
            recs = run_campaign(ge, spool, "parallel", args.parallel, args.width, command, policy(port, host), f"{host}:{port}",
                                args.agent_sleep_s, timeout_s=600 + 2 * args.parallel)
            report(f"{args.width} at a time ({args.agent} agent, sleeping {args.agent_sleep_s:g} s)", figures(recs),
                   1.0, "under 2 s with 96 concurrent")
        print(f"\nbubblewrap bare start, same run: median {median_ms(bare).strip()}; load now "
              f"{os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    finally:
        model.terminate()
        model.wait(10)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
