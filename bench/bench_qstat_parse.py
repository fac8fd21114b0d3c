"""qstat -xml parse + diff with 100,000 tasks, beside an ElementTree baseline.

    .venv/bin/python bench/bench_qstat_parse.py [--tasks 100000] [--runs 3]

Two synthetic ``qstat -xml -u '*'`` documents in SGE 8.1.9's layout:

- array: 100 running tasks plus one pending array row ``101-100000:1``
  (how tco's campaigns look: a few KB of XML, 100,000 tasks);
- individual: 100,000 pending ``<job_list>`` elements (~34 MB of XML; the
  worst case, one job per task).

For each: ``parse_qstat`` (tasks built, ranges expanded, times converted),
then ``diff_tasks`` against the previous poll with 1% of the tasks changed.
The baseline builds the same tasks from ``xml.etree.ElementTree.fromstring``
and a walk over each job_list's children (the standard library's way).
Target: parse well under 0.5 s for 100,000 tasks. Not a test: run by hand.
"""
from __future__ import annotations

import argparse
import sys
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from schedulers.base import diff_tasks  # noqa: E402
from schedulers.gridengine.parsers.qstat import UTC, _tasks_from_rows, parse_qstat  # noqa: E402

HEAD = ("<?xml version='1.0'?>\n<job_info  xmlns:xsd=\"http://arc.liv.ac.uk/repos/darcs/sge/source/dist/util/"
        "resources/schemas/qstat/qstat.xsd\">\n  <queue_info>\n")


def job_list(number: int, state: str, name: str, time_tag: str, when: str, queue: str, tasks: str | None) -> str:
    tasks_el = f"      <tasks>{tasks}</tasks>\n" if tasks else ""
    return (f"    <job_list state=\"{'running' if queue else 'pending'}\">\n"
            f"      <JB_job_number>{number}</JB_job_number>\n      <JAT_prio>0.55500</JAT_prio>\n"
            f"      <JB_name>{name}</JB_name>\n      <JB_owner>tco</JB_owner>\n      <state>{state}</state>\n"
            f"      <{time_tag}>{when}</{time_tag}>\n      <queue_name>{queue}</queue_name>\n"
            f"      <slots>1</slots>\n{tasks_el}    </job_list>\n")


def array_document(total: int, running: int = 100, changed_every: int = 0) -> bytes:
    parts = [HEAD]
    for i in range(1, running + 1):
        parts.append(job_list(5000, "r", "campaign", "JAT_start_time", f"2025-03-10T09:{i // 60 % 60:02d}:{i % 60:02d}",
                              f"agent.q@node{i % 8:02d}", str(i)))
    parts.append("  </queue_info>\n  <job_info>\n")
    parts.append(job_list(5000, "qw", "campaign", "JB_submission_time", "2025-03-10T08:59:50", "",
                          f"{running + 1}-{total}:1"))
    parts.append("  </job_info>\n</job_info>\n")
    return "".join(parts).encode()


def individual_document(total: int, changed_every: int = 0) -> bytes:
    parts = [HEAD, "  </queue_info>\n  <job_info>\n"]
    for i in range(total):
        state = "hqw" if changed_every and i % changed_every == 0 else "qw"
        parts.append(job_list(10000 + i, state, f"single_{i}", "JB_submission_time",
                              f"2025-03-10T09:{i // 60 % 60:02d}:{i % 60:02d}", "", None))
    parts.append("  </job_info>\n</job_info>\n")
    return "".join(parts).encode()


def elementtree_baseline(data: bytes) -> list:
    """The same tasks, from an ElementTree tree walk instead of our readers."""
    root = ElementTree.fromstring(data)
    rows = []
    for job in root.iter("job_list"):
        f = {child.tag: child.text or "" for child in job}
        time_tag = next((t for t in ("JAT_start_time", "JB_submission_time", "JAT_submission_time") if f.get(t)), "")
        rows.append((f["JB_job_number"], f.get("JAT_prio", ""), f["JB_name"], f["JB_owner"], f["state"], time_tag,
                     f.get(time_tag, ""), f.get("queue_name", ""), f["slots"], f.get("tasks", "")))
    return _tasks_from_rows(rows, UTC)


def best_of(runs: int, func, *args):
    best, result = float("inf"), None
    for _ in range(runs):
        start = time.perf_counter()
        result = func(*args)
        best = min(best, time.perf_counter() - start)
    return best, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    n = args.tasks
    cases = [
        ("array", array_document(n), array_document(n)),
        ("individual", individual_document(n), individual_document(n, changed_every=100)),
    ]
    print(f"{n:,} tasks per document, best of {args.runs}")
    for label, previous_doc, current_doc in cases:
        t_base, baseline_tasks = best_of(args.runs, elementtree_baseline, current_doc)
        t_parse, tasks = best_of(args.runs, parse_qstat, current_doc)
        previous = diff_tasks({}, parse_qstat(previous_doc)).current
        t_diff, diff = best_of(args.runs, diff_tasks, previous, tasks)
        assert tasks == baseline_tasks and len(tasks) == n, len(tasks)
        print(f"{label:10s} {len(current_doc) / 2**20:5.1f} MiB  ElementTree baseline {t_base:6.3f} s"
              f"  parse_qstat {t_parse:6.3f} s ({t_parse / t_base:.2f} x baseline)"
              f"  diff_tasks {t_diff:6.3f} s ({len(diff.changed)} changed)"
              f"  parse+diff {t_parse + t_diff:6.3f} s,"
              f" target <0.5 s: {'met' if t_parse + t_diff < 0.5 else 'NOT met'}")


if __name__ == "__main__":
    main()
