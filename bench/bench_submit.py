"""Submission to the dev cluster: a 10,000-task campaign as one array, and single jobs, DRMAA beside qsub.

Goals (issue 3): a 10,000-task campaign accepted by the qmaster in <= 1 s;
single submissions through DRMAA beside ``qsub``, as a ratio. Every job is
submitted on hold and deleted at once, so nothing runs. Run as the submit
account with libdrmaa's environment (see scripts/env.sh):

    source scripts/env.sh; as_tco env LD_PRELOAD=$TCO_JEMALLOC .venv/bin/python bench/bench_submit.py
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from schedulers.gridengine import drmaa as drmaa_session  # noqa: E402
from schedulers.base import ArrayJobSpec  # noqa: E402
from schedulers.gridengine.adapter import GridEngine  # noqa: E402
from schedulers.gridengine.commands import run_command  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--singles", type=int, default=50)
    args = parser.parse_args()
    ge = GridEngine(queues=["agent.q"], projects=["research"], resources=["anthropic_api"])
    spec = ArrayJobSpec(name="bench_submit", command="/bin/true", args=[], count=args.tasks, queue="agent.q",
                        project="research", resources={"anthropic_api": 1}, environment={},
                        working_directory="/tmp", output_path="/dev/null", error_path="/dev/null", hold=True)
    drmaa_session.open_session()
    t0 = time.perf_counter()
    job, tasks = ge.submit_array(spec)
    array_s = time.perf_counter() - t0
    run_command(["qdel", str(job)])

    drmaa_times, qsub_times, jobs = [], [], []
    session = drmaa_session.open_session()
    drmaa = drmaa_session.load_drmaa()
    native = ge.native_specification(ArrayJobSpec(name="bench_single", command="/bin/true", args=[], count=1,
                                                  queue="agent.q", project="research",
                                                  resources={"anthropic_api": 1}, environment={},
                                                  working_directory="/tmp", output_path="/dev/null",
                                                  error_path="/dev/null"))
    jt = session.createJobTemplate()
    jt.remoteCommand = "/bin/true"
    jt.nativeSpecification = native
    jt.outputPath = ":/dev/null"
    jt.errorPath = ":/dev/null"
    jt.jobSubmissionState = drmaa.JobSubmissionState.HOLD_STATE
    for _ in range(args.singles):
        t0 = time.perf_counter()
        jobs.append(session.runJob(jt))
        drmaa_times.append(time.perf_counter() - t0)
    session.deleteJobTemplate(jt)
    env = {**os.environ, "TZ": "UTC"}
    for _ in range(args.singles):
        t0 = time.perf_counter()
        out = subprocess.run(["qsub", "-terse", "-h", "-b", "y", "-q", "agent.q", "-P", "research",
                              "-l", "anthropic_api=1", "-o", "/dev/null", "-e", "/dev/null", "/bin/true"],
                             capture_output=True, text=True, check=True, env=env)
        qsub_times.append(time.perf_counter() - t0)
        jobs.append(out.stdout.strip())
    run_command(["qdel", *[str(j) for j in jobs]], timeout=60)
    d, q = statistics.median(drmaa_times), statistics.median(qsub_times)
    from bench._hosts import cluster_label

    print(f"cluster: {cluster_label()}")
    print(f"array of {len(tasks):,} tasks through DRMAA runBulkJobs: {array_s:.3f} s (goal <= 1 s)")
    print(f"single job, median of {args.singles}: DRMAA {d * 1000:.1f} ms, qsub {q * 1000:.1f} ms; "
          f"ratio qsub/DRMAA {q / d:.1f}x")
    print(f"source article baseline: 256 qsub submissions in 5.2 s ({5.2 / 256 * 1000:.1f} ms each)")


if __name__ == "__main__":
    main()
