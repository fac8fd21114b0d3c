"""The poll as the worker runs it: parse qstat XML with 100,000 tasks, diff, write the changes.

Goal (issue 3): parse + diff against the previous poll <= 1 s for 100,000
tasks. Printed beside the baseline measured in the same run: the first poll,
which reads every active task from the database (what a poll costs without
the previous snapshot), and xml.etree parsing alone.

    .venv/bin/python bench/bench_poll.py [--tasks 100000]

Goal (issue 22): the poll's write <= 0.5 s p95 with 410 running and 10,000 queued, over a series of
polls in which 10 tasks end and 10 start each time (the seed run's shape), printed beside the same
polls applied again without a change (parse and read only) from the same run::

    .venv/bin/python bench/bench_poll.py --series --running 410 --queued 10000 [--polls 40]
"""
from __future__ import annotations

import argparse
import datetime as dt
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from _django import setup_temp_django  # noqa: E402


def qstat_xml(n_pending: int, running: int, *, started: int, first: int = 1) -> bytes:
    """SGE 8.1.9 ``qstat -xml -u '*'`` shape: ``running`` array tasks from task ``first`` on, then one pending
    range after them (the tasks before ``first`` have ended and are no longer listed)."""
    out = ["<?xml version='1.0'?>\n<job_info  xmlns:xsd=\"http://arc.liv.ac.uk/repos/darcs/sge/source/dist/util/"
           "resources/schemas/qstat/qstat.xsd\">\n  <queue_info>\n"]
    for t in range(first, first + running):
        out.append(f"""    <job_list state="running">
      <JB_job_number>500</JB_job_number>
      <JAT_prio>0.55500</JAT_prio>
      <JB_name>tco-bench-c1-bench</JB_name>
      <JB_owner>tco</JB_owner>
      <state>r</state>
      <JAT_start_time>2026-11-29T12:00:{started:02d}</JAT_start_time>
      <queue_name>agent.q@vm</queue_name>
      <slots>1</slots>
      <tasks>{t}</tasks>
    </job_list>
""")
    out.append("  </queue_info>\n  <job_info>\n")
    if n_pending:
        out.append(f"""    <job_list state="pending">
      <JB_job_number>500</JB_job_number>
      <JAT_prio>0.55500</JAT_prio>
      <JB_name>tco-bench-c1-bench</JB_name>
      <JB_owner>tco</JB_owner>
      <state>qw</state>
      <JB_submission_time>2026-11-29T11:59:00</JB_submission_time>
      <queue_name></queue_name>
      <slots>1</slots>
      <tasks>{first + running}-{first + running + n_pending - 1}:1</tasks>
    </job_list>
""")
    out.append("  </job_info>\n</job_info>\n")
    return "".join(out).encode()


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank ``q`` percentile (0-100) of ``values`` (seconds)."""
    ordered = sorted(values)
    return ordered[max(0, -(-int(q) * len(ordered) // 100) - 1)]


def series(args) -> None:
    """``--series``: ``--polls`` polls of ``--running`` running and ``--queued`` queued tasks, ``--step`` ending
    and as many starting between two polls; each timed (diff and write: ``apply_qstat_poll``), then applied
    again unchanged as the same run's baseline."""
    from dashboards.core.clusters import cluster_get_default
    from dashboards.ingest.poll import apply_qstat_poll
    from schedulers.gridengine.parsers.qstat import parse_qstat

    cluster = cluster_get_default()
    now = dt.datetime(2026, 11, 29, 12, 1, tzinfo=dt.timezone.utc)
    if args.polls * args.step > args.queued:
        sys.exit("--polls x --step must not exceed --queued")
    apply_qstat_poll(cluster, parse_qstat(qstat_xml(args.queued, args.running, started=0)), observed_at=now)
    writes, unchanged, parses, changed = [], [], [], []
    for i in range(1, args.polls + 1):
        xml = qstat_xml(args.queued - i * args.step, args.running, started=0, first=1 + i * args.step)
        t0 = time.perf_counter()
        tasks = parse_qstat(xml)
        parses.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        result = apply_qstat_poll(cluster, tasks, observed_at=now + dt.timedelta(seconds=2 * i))
        writes.append(time.perf_counter() - t0)
        changed.append(result.changed)
        t0 = time.perf_counter()
        apply_qstat_poll(cluster, parse_qstat(xml), observed_at=now + dt.timedelta(seconds=2 * i + 1))
        unchanged.append(time.perf_counter() - t0 - parses[-1])
    print(f"{args.polls} polls of {args.running} running + {args.queued:,} queued (first), {args.step} ending and "
          f"{args.step} starting between two; changed rows per poll: median {sorted(changed)[len(changed) // 2]}")
    for label, values in (("diff + write (the poll's write; goal p95 <= 0.5 s)", writes),
                          ("baseline: the same poll again, nothing to write", unchanged),
                          ("parse (qstat -xml, not in the write)", parses)):
        print(f"  {label}: p50 {percentile(values, 50):.3f} s, p95 {percentile(values, 95):.3f} s, "
              f"max {max(values):.3f} s")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument("--series", action="store_true", help="the issue-22 series (module doc)")
    parser.add_argument("--running", type=int, default=410)
    parser.add_argument("--queued", type=int, default=10_000)
    parser.add_argument("--polls", type=int, default=40)
    parser.add_argument("--step", type=int, default=10)
    args = parser.parse_args()
    setup_temp_django("tco-bench-poll-")
    if args.series:
        series(args)
        return
    from dashboards.core.clusters import cluster_get_default
    from dashboards.ingest.poll import apply_qstat_poll
    from schedulers.gridengine.parsers.qstat import parse_qstat

    cluster = cluster_get_default()
    now = dt.datetime(2026, 11, 29, 12, 1, tzinfo=dt.timezone.utc)
    first = qstat_xml(args.tasks - 96, 96, started=0)
    # Next poll: 10 tasks finished, 10 started in their slots.
    second = qstat_xml(args.tasks - 106, 106, started=0)

    t0 = time.perf_counter()
    tasks = parse_qstat(first)
    t_parse = time.perf_counter() - t0
    t0 = time.perf_counter()
    apply_qstat_poll(cluster, tasks, observed_at=now)
    t_first = time.perf_counter() - t0

    t0 = time.perf_counter()
    tasks2 = parse_qstat(second)
    parse2 = time.perf_counter() - t0
    t0 = time.perf_counter()
    changes = apply_qstat_poll(cluster, tasks2, observed_at=now + dt.timedelta(seconds=1))
    diff_write = time.perf_counter() - t0

    t0 = time.perf_counter()
    tasks3 = parse_qstat(second)
    apply_qstat_poll(cluster, tasks3, observed_at=now + dt.timedelta(seconds=2))
    steady = time.perf_counter() - t0

    t0 = time.perf_counter()
    ET.fromstring(first)
    t_et = time.perf_counter() - t0

    # The whole array deleted (qdel of a queued 100,000-task job): every task gone at once.
    t0 = time.perf_counter()
    gone = apply_qstat_poll(cluster, parse_qstat(qstat_xml(0, 0, started=0)), observed_at=now + dt.timedelta(seconds=3))
    t_gone = time.perf_counter() - t0

    print(f"tasks: {len(tasks):,} ({len(first) / 1e3:.0f} kB XML: 96 running, one pending range)")
    print(f"poll with changes ({changes.changed} changed): parse {parse2:.3f} s + diff/write {diff_write:.3f} s "
          f"= {parse2 + diff_write:.3f} s  (goal <= 1 s)")
    print(f"poll without changes: {steady:.3f} s")
    print(f"baseline, first poll (reads every active task, inserts all): parse {t_parse:.3f} s + "
          f"{t_first:.3f} s; ratio {(t_parse + t_first) / (parse2 + diff_write):.1f}x slower")
    print(f"baseline, xml.etree parse alone: {t_et:.3f} s")
    print(f"the whole job deleted ({gone.gone:,} tasks gone at once): {t_gone:.3f} s")


if __name__ == "__main__":
    main()
