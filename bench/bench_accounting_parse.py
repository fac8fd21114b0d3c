"""Accounting parse rate: our reader beside a naive ``line.split(b':')`` loop.

    .venv/bin/python bench/bench_accounting_parse.py [--lines 1000000] [--batch-mib 1]

Writes N synthetic SGE 8.1.9 colon lines (accounting(5), 45 fields; array
tasks sharing a submission time, a category with colons every tenth line)
to a temporary file, then times, in the same run:

- baseline: read the file and ``split(b":")`` every line, nothing else;
- ours: ``read_accounting`` from offset 0 to the end in ``--batch-mib``
  batches, as the ingester calls it (records built, types checked);
- ours, one pass: the whole file in one call (every record alive at once).

Prints lines/s for each and our rate as a fraction of the baseline. The
target is >= 300,000 lines/s for the batched reader on the dev VM (2 cores).
Not a test: run it by hand.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from schedulers.gridengine.parsers.accounting import read_accounting  # noqa: E402


def synthetic_line(i: int) -> bytes:
    category = b"-q agent.q -l anthropic_api=1,h_rt=01:00:00" if i % 10 == 0 else b"-q agent.q -l anthropic_api=1"
    return (b"agent.q:node%02d.example.org:tco:tco:agent_%d:%d:sge:0:1741620000:%d:%d:0:0:600:590.250000:8.000000:"
            b"512000.000000:0:0:0:0:5000:0:0:0.000000:64:0:0:0:300:20:research:defaultdepartment:NONE:1:%d:"
            b"598.250000:120.500000:0.010000:%s:0.000000:NONE:1073741824.000000:0:0\n"
            % (i % 20, i, 100000 + i // 1000, 1741620010 + i, 1741620610 + i, i % 1000 + 1, category))


def write_file(path: str, count: int) -> None:
    with open(path, "wb") as handle:
        block = []
        for i in range(count):
            block.append(synthetic_line(i))
            if len(block) == 50_000:
                handle.write(b"".join(block))
                block = []
        handle.write(b"".join(block))


def baseline(path: str) -> int:
    with open(path, "rb") as handle:
        data = handle.read()
    count = 0
    for line in data.split(b"\n"):
        if line:
            line.split(b":")
            count += 1
    return count


def ours_batched(path: str, batch_bytes: int) -> int:
    cursor = None
    count = 0
    while True:
        batch = read_accounting(path, cursor, max_bytes=batch_bytes)
        count += len(batch.records)
        if batch.quarantined:
            raise SystemExit(f"synthetic line quarantined: {batch.quarantined[0].reason}")
        if batch.cursor == cursor:
            return count
        cursor = batch.cursor


def ours_one_pass(path: str) -> int:
    return len(read_accounting(path, None).records)


def best_of(runs: int, func, *args) -> tuple[float, int]:
    best = float("inf")
    count = 0
    for _ in range(runs):
        start = time.perf_counter()
        count = func(*args)
        best = min(best, time.perf_counter() - start)
    return best, count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--batch-mib", type=float, default=1.0)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()

    fd, path = tempfile.mkstemp(prefix="bench-accounting-")
    os.close(fd)
    try:
        write_file(path, args.lines)
        size = os.path.getsize(path)
        print(f"{args.lines:,} lines, {size / 2**20:.0f} MiB, best of {args.runs}")
        t_base, n_base = best_of(args.runs, baseline, path)
        t_ours, n_ours = best_of(args.runs, ours_batched, path, int(args.batch_mib * 2**20))
        t_one, n_one = best_of(1, ours_one_pass, path)
        assert n_base == n_ours == n_one == args.lines, (n_base, n_ours, n_one)
        rate_base, rate_ours, rate_one = n_base / t_base, n_ours / t_ours, n_one / t_one
        print(f"baseline line.split(b':')       {rate_base:12,.0f} lines/s")
        print(f"read_accounting, {args.batch_mib:g} MiB batches {rate_ours:12,.0f} lines/s"
              f"   ratio {rate_ours / rate_base:.2f} of baseline"
              f"   target 300,000: {'met' if rate_ours >= 300_000 else 'NOT met'}")
        print(f"read_accounting, one pass       {rate_one:12,.0f} lines/s   ratio {rate_one / rate_base:.2f}")
    finally:
        os.unlink(path)


if __name__ == "__main__":
    main()
