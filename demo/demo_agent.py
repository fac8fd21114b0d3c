"""Demo agent: a STAND-IN for a real AI agent, bundled so the pipeline can run end to end.

``python -m demo.demo_agent INPUT_FILE [WORK_DIR]`` reads one task input
(JSON object), "thinks" (sleeps ``duration_s`` seconds and hashes a little),
and when the input names a ``model`` asks it once about its answer: one
Anthropic Messages request to ``$ANTHROPIC_BASE_URL`` (in tco's sandbox the
relay, then the metering proxy, which adds the key, meters the tokens and
prices them; ``make demo``'s research campaign asks the scripted stand-in).
It writes ``result.json`` into the work directory (default:
``TCO_WORK_DIR``, else the current directory), prints one line and exits 0,
3 when the input says ``"fail": true``, or 1 when the model could not be asked.

Input keys (all optional): ``task`` (int), ``duration_s`` (seconds, default 1),
``fail`` (bool), ``model`` (text: the model to ask; none, no model call). For tests of the runner: ``stdout_bytes``/``stderr_bytes``
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
import urllib.error

EXIT_FAIL = 3
EXIT_NO_MODEL = 1


def think(task: int, rounds: int = 20_000) -> str:
    """A small deterministic computation: ``rounds`` chained SHA-256 of the task number."""
    digest = str(task).encode()
    for _ in range(rounds):
        digest = hashlib.sha256(digest).digest()
    return digest.hex()


def ask(task: int, answer: str, model: str, base_url: str) -> dict:
    """Ask ``model`` once, through the Messages API at ``base_url``, whether task ``task``'s ``answer``
    looks right. Returns ``{"model", "usage", "text"}`` (the reply's model id, its usage as the API
    reports it, the reply's text cut at 500 characters). Raises OSError (urllib's errors), ValueError."""
    from demo.review_agent import ask_model

    reply = ask_model(base_url, {"model": model, "max_tokens": 64, "messages": [{"role": "user", "content": (
        f"Task {task} of the demo campaign computed {answer}. Answer with one line: 'verdict: ok' if a "
        "chained SHA-256 digest of the task number looks like that, else 'verdict: bad'.")}]})
    text = "\n".join(b.get("text", "") for b in reply.get("content") or []
                     if isinstance(b, dict) and b.get("type") == "text")
    return {"model": reply.get("model"), "usage": reply.get("usage"), "text": text[:500]}


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
    status = EXIT_FAIL if data.get("fail") else 0
    if data.get("model"):
        base_url = os.environ.get("ANTHROPIC_BASE_URL", "http://127.0.0.1:8790")
        try:
            result["model_call"] = ask(task, answer, str(data["model"]), base_url)
        except (urllib.error.URLError, OSError, ValueError) as exc:
            result["model_call"] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
            result["ok"] = False
            status = status or EXIT_NO_MODEL
    tmp = os.path.join(work_dir, "result.json.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(result, fh)
    os.replace(tmp, os.path.join(work_dir, "result.json"))
    call = result.get("model_call")
    said = "" if call is None else (f"; the model could not be asked: {call['error']}" if "error" in call
                                    else f"; the model said: {call['text'][:80]}")
    print(f"demo agent (stand-in): task {task} answered {answer[:12]} after {result['thought_s']:.3f} s{said}")
    sys.stdout.flush()
    return status


if __name__ == "__main__":
    sys.exit(main())
