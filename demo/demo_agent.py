"""Demo agent: a STAND-IN for a real AI agent, bundled so the pipeline can run end to end.

It calls no model. ``python -m demo.demo_agent INPUT_FILE [WORK_DIR]``
reads one task input (JSON object), "thinks" (sleeps ``duration_s`` seconds
and hashes a little), writes ``result.json`` into the work directory
(default: ``TCO_WORK_DIR``, else the current directory), prints one line and
exits 0, or 3 when the input says ``"fail": true``.

Input keys (all optional): ``task`` (int), ``duration_s`` (seconds, default 1),
``fail`` (bool). For tests of the runner: ``stdout_bytes``/``stderr_bytes``
(print that many extra bytes), ``ignore_sigterm`` (bool),
``spawn_child_s`` (start a child in the same process group that sleeps that
many seconds and is not waited for).
"""
from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time

EXIT_FAIL = 3


def think(task: int, rounds: int = 20_000) -> str:
    """A small deterministic computation: ``rounds`` chained SHA-256 of the task number."""
    digest = str(task).encode()
    for _ in range(rounds):
        digest = hashlib.sha256(digest).digest()
    return digest.hex()


def main(argv: list[str] | None = None) -> int:
    """Run the demo agent; returns its exit status."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        print("usage: python -m demo.demo_agent INPUT_FILE [WORK_DIR]", file=sys.stderr)
        return 2
    input_path = argv[0]
    work_dir = argv[1] if len(argv) > 1 else os.environ.get("TCO_WORK_DIR", os.getcwd())
    with open(input_path, encoding="utf-8") as fh:
        data = json.load(fh)
    task = int(data.get("task", 0))
    duration = float(data.get("duration_s", 1))

    if data.get("ignore_sigterm"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if data.get("spawn_child_s"):
        subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({float(data['spawn_child_s'])})"],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if data.get("stdout_bytes"):
        sys.stdout.write("o" * int(data["stdout_bytes"]))
        sys.stdout.write("\n")
    if data.get("stderr_bytes"):
        sys.stderr.write("e" * int(data["stderr_bytes"]))
        sys.stderr.write("\n")

    started = time.monotonic()
    time.sleep(duration)
    answer = think(task)
    result = {"task": task, "answer": answer, "thought_s": round(time.monotonic() - started, 6),
              "ok": not data.get("fail", False), "agent": "tco demo agent (stand-in)"}
    tmp = os.path.join(work_dir, "result.json.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(result, fh)
    os.replace(tmp, os.path.join(work_dir, "result.json"))
    print(f"demo agent (stand-in): task {task} answered {answer[:12]} after {result['thought_s']:.3f} s")
    sys.stdout.flush()
    return EXIT_FAIL if data.get("fail") else 0


if __name__ == "__main__":
    sys.exit(main())
