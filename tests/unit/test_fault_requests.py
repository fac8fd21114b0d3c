"""scripts/cluster-faults reads whole request lines from its FIFO.

The CI run of stop 28 lost a request: the browser calendar test asked for
"ID window none", the queue was removed, but the test never saw ID answered.
The reader used ``read -t 1``, which keeps the part of a line it had read when
its timeout fired; the loop then dropped that part, so the rest ran under a
shortened id. Here a writer sends a line in two parts, 0.75 s apart (three
times the reader's timeout, shortened from 1 s to 0.25 s through
REQUEST_TIMEOUT_S), and the reader must give the line back whole.
"""
from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
#: The reader's timeout here (scripts/cluster-faults reads with 1 s) and the writer's gap between two parts.
READ_TIMEOUT_S = 0.25
GAP_S = 3 * READ_TIMEOUT_S
READER = r"""
set -euo pipefail
source "$1"
exec 3<>"$2"
n=0
while (( n < $3 )); do
    next_request 3 || continue
    printf '%s\n' "$REQUEST"
    n=$((n + 1))
done
"""


def read_requests(tmp_path: Path, parts: list[bytes], gap_s: float, lines: int) -> list[str]:
    """Write ``parts`` to a FIFO ``gap_s`` apart; return the lines the reader gave back."""
    fifo = tmp_path / "faults.fifo"
    os.mkfifo(fifo)
    reader = subprocess.Popen(["bash", "-c", READER, "reader", str(REPO / "scripts/request-lines.sh"),
                               str(fifo), str(lines)], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "REQUEST_TIMEOUT_S": str(READ_TIMEOUT_S)})
    fd = os.open(fifo, os.O_WRONLY)
    try:
        for i, part in enumerate(parts):
            if i:
                time.sleep(gap_s)
            os.write(fd, part)
    finally:
        os.close(fd)
    out, _ = reader.communicate(timeout=30)
    assert reader.returncode == 0
    return out.splitlines()


def test_a_line_split_across_the_read_timeout_comes_back_whole(tmp_path):
    request = "4f0c2a9d8b7e6f5a4c3b2a1908f7e6d5 window none"
    head, tail = request[:20].encode(), (request[20:] + "\n").encode()
    assert read_requests(tmp_path, [head, tail], GAP_S, 1) == [request]


def test_a_split_line_is_kept_apart_from_the_next_and_leading_blanks_survive(tmp_path):
    parts = [b"a1 up sge-exe", b"c1\n b2 down sge-exec2\n"]
    assert read_requests(tmp_path, parts, GAP_S, 2) == ["a1 up sge-exec1", " b2 down sge-exec2"]


def test_a_line_longer_than_4096_bytes_is_dropped_and_the_next_is_read(tmp_path):
    parts = [b"x" * 5000, b"y" * 10 + b"\nc3 up sge-exec3\n"]
    assert read_requests(tmp_path, parts, GAP_S, 1) == ["c3 up sge-exec3"]
