"""Accounting ingest into SQLite: records/s and peak RSS, beside a plain split-and-insert loop.

Goal (issue 3): >= 100,000 records/s into SQLite, so 1,000,000 records in
<= 10 s, with flat memory. The baseline, measured in the same run, is the
naive loop: ``line.split(b':')`` and one ``executemany`` into a bare table
(no quarantine, no identity, no checkpoint).

    .venv/bin/python bench/bench_accounting_ingest.py [--records 1000000]
"""
from __future__ import annotations

import argparse
import resource
import sqlite3
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from _django import setup_temp_django  # noqa: E402


def make_file(path: Path, n: int) -> None:
    start = 1764417600
    with open(path, "wb") as fh:
        fh.write(b"# Version: 8.1.9\n#\n# DO NOT MODIFY THIS FILE MANUALLY!\n#\n")
        for i in range(n):
            job = 1000 + i // 100
            task = i % 100 + 1
            s = start + i // 50
            fh.write(
                f"agent.q:vm:tco:tco:tco-inst1-c1-demo:{job}:admin:0:{s - 3}:{s}:{s + 7}:0:0:7:0.5:0.1:2048.000000:0:0:0:0:"
                f"100:0:0:0:8:0:0:0:30:2:research:defaultdepartment:NONE:1:{task}:0.6:0.01:0.0001:"
                f"-q agent.q -l anthropic_api=1:0.0:NONE:104857600.000000:0:0\n".encode()
            )


def baseline(path: Path, db: Path) -> float:
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE acct (f0,f1,f2,f3,f4,f5,f6,f7,f8,f9,f10,f11,f12,f13,f14,f15,f16,f17,f18,f19,f20,"
                "f21,f22,f23,f24,f25,f26,f27,f28,f29,f30,f31,f32,f33,f34,f35,f36,f37,f38,f39,f40,f41,f42,f43,f44)")
    t0 = time.perf_counter()
    rows = []
    with open(path, "rb") as fh:
        for line in fh:
            if line.startswith(b"#"):
                continue
            rows.append(line.rstrip(b"\n").split(b":"))
            if len(rows) == 50_000:
                con.executemany(f"INSERT INTO acct VALUES ({','.join('?' * 45)})", rows)
                rows.clear()
    if rows:
        con.executemany(f"INSERT INTO acct VALUES ({','.join('?' * 45)})", rows)
    con.commit()
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=1_000_000)
    args = parser.parse_args()
    tmp = setup_temp_django("tco-bench-acct-")
    from dashboards.models import AccountingRecord
    from dashboards.core.clusters import cluster_get_default
    from dashboards.ingest.accounting import ingest_accounting

    acct = tmp / "accounting"
    make_file(acct, args.records)
    size_mb = acct.stat().st_size / 1e6
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    cluster = cluster_get_default()
    t0 = time.perf_counter()
    result = ingest_accounting(cluster, path=str(acct), time_budget_s=3600)
    ours = time.perf_counter() - t0
    rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    stored = AccountingRecord.objects.count()
    base = baseline(acct, tmp / "baseline.sqlite3")
    n = args.records
    print(f"records: {n:,} ({size_mb:.0f} MB file), stored {stored:,}, batches {result.batches}")
    print(f"tco ingest:            {ours:7.2f} s  {n / ours:10,.0f} records/s  (goal >= 100,000/s)")
    print(f"baseline split+insert: {base:7.2f} s  {n / base:10,.0f} records/s")
    print(f"ratio tco/baseline:    {base / ours:7.2f} (rate)")
    print(f"peak RSS: {rss1 / 1024:.0f} MiB (before ingest {rss0 / 1024:.0f} MiB)")
    assert stored == n, "not every record was stored"


if __name__ == "__main__":
    main()
