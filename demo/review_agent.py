"""Review agent of the sweep-and-review demo: one run's output, one verdict, through the model.

Runs inside the sandbox (standard library only):
``python -m demo.review_agent INPUT_FILE [WORK_DIR]``. The input names one
run of the sweep: ``{"sweep_task": N, "run_output": "/path/run-N.txt"}``
(that path is listed read-only in the review campaign's policy).

1. It calls its tool ``read_run_output`` on the run (logged as a tool call in
   ``transcript.jsonl``). The scripted stand-in model never chooses tools,
   so the agent makes this first call itself and hands the result to the
   model in the Messages API's ``tool_use``/``tool_result`` form; a real
   model that asks for the tool again (``stop_reason: tool_use``) gets it,
   for up to :data:`MAX_TURNS` turns, but only on the assigned run.
2. It POSTs to ``$ANTHROPIC_BASE_URL/v1/messages`` (the relay, then the
   metering proxy, which adds the API key: the agent has none).
3. It reads ``verdict: ok`` or ``verdict: bad`` from the answer and writes
   ``verdict.json`` in the work directory.

Exit status: 0 with a verdict; 2 when the answer held none; 1 when the model
could not be asked.
"""
from __future__ import annotations

import json
import os
import re
import sys
import urllib.error
import urllib.request

MAX_TURNS = 4
MAX_RUN_BYTES = 64 * 1024
DEFAULT_MODEL = "stand-in-review"  # priced by the demo price table (tco_bootstrap)
TOOLS = [{
    "name": "read_run_output",
    "description": "Read the output log of one run of the simulation sweep.",
    "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
}]
SYSTEM = ("You review the output logs of numerical simulation runs. Read the run's log with the "
          "read_run_output tool, then answer with exactly one line: 'verdict: ok' if the run finished "
          "normally and its numbers can be trusted, else 'verdict: bad'.")
_VERDICT_RE = re.compile(r"verdict:\s*(ok|bad)\b", re.IGNORECASE)


class Transcript:
    """The agent's transcript: one JSON line per event appended to ``path``."""
    def __init__(self, path: str) -> None:
        self.path = path

    def add(self, **event) -> None:
        """Append one event (its keyword arguments) as a JSON line. Raises OSError."""
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(event) + "\n")


def read_run_output(path: str, assigned: str) -> str:
    """The tool: the assigned run's log (capped); any other path is refused."""
    if os.path.normpath(path) != os.path.normpath(assigned):
        return f"error: only the assigned run may be read ({assigned})"
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_RUN_BYTES + 1)
    except OSError as exc:
        return f"error: cannot read {path}: {exc.strerror}"
    text = data[:MAX_RUN_BYTES].decode("utf-8", "replace")
    return text + ("\n[truncated]" if len(data) > MAX_RUN_BYTES else "")


def ask_model(base_url: str, body: dict) -> dict:
    """POST ``body`` to the Anthropic Messages API at ``base_url`` (no proxy from the environment;
    the metering proxy adds the key); the answer as a dict. Raises OSError, ValueError."""
    request = urllib.request.Request(
        base_url.rstrip("/") + "/v1/messages", data=json.dumps(body).encode("utf-8"), method="POST",
        headers={"content-type": "application/json", "anthropic-version": "2023-06-01",
                 # Empty on purpose: the metering proxy drops any client key and adds the real one.
                 "x-api-key": os.environ.get("ANTHROPIC_API_KEY", "")})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(request, timeout=120) as response:
        return json.loads(response.read())


def ask_model_streaming(base_url: str, body: dict) -> dict:
    """The same request with ``stream: true``; the server-sent events (Anthropic
    Messages streaming) are folded back into one message dict: text and tool
    calls from the content block events, model and usage from ``message_start``
    and the cumulative ``message_delta``, the stop reason from the latter."""
    request = urllib.request.Request(
        base_url.rstrip("/") + "/v1/messages", data=json.dumps({**body, "stream": True}).encode("utf-8"),
        method="POST", headers={"content-type": "application/json", "anthropic-version": "2023-06-01",
                                "accept": "text/event-stream", "x-api-key": os.environ.get("ANTHROPIC_API_KEY", "")})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    message: dict = {"content": []}
    partial_json: dict[int, str] = {}
    with opener.open(request, timeout=120) as response:
        for raw in response:
            line = raw.decode("utf-8").rstrip("\r\n")
            if not line.startswith("data:"):
                continue
            event = json.loads(line[5:].strip())
            kind = event.get("type")
            if kind == "message_start":
                message.update({k: v for k, v in event["message"].items() if k != "content"})
            elif kind == "content_block_start":
                message["content"].append(dict(event["content_block"]))
            elif kind == "content_block_delta":
                block, delta = message["content"][event["index"]], event["delta"]
                if delta.get("type") == "text_delta":
                    block["text"] = block.get("text", "") + delta["text"]
                elif delta.get("type") == "input_json_delta":
                    partial_json[event["index"]] = partial_json.get(event["index"], "") + delta["partial_json"]
            elif kind == "message_delta":
                message.update(event.get("delta") or {})
                message["usage"] = {**(message.get("usage") or {}), **(event.get("usage") or {})}
    for index, text in partial_json.items():
        message["content"][index]["input"] = json.loads(text) if text else {}
    return message


def review(task: int, run_output: str, model: str, base_url: str, transcript: Transcript,
           stream: bool = False) -> dict:
    """Review sweep run ``task``: let the model read ``run_output`` through the tool (at most
    ``MAX_TURNS`` turns) and take its one-line verdict. Returns the review's record (``verdict``
    ``ok``/``bad``/None, the model's text, counts); every call goes to ``transcript``."""
    messages: list[dict] = [{"role": "user", "content": f"Review run {task} of the parameter sweep."}]
    pending = [{"type": "tool_use", "id": "toolu_tco_1", "name": "read_run_output", "input": {"path": run_output}}]
    requests = tool_calls = 0
    text = ""
    answer: dict = {}
    for _ in range(MAX_TURNS):
        if pending:
            messages.append({"role": "assistant", "content": pending})
            results = []
            for call in pending:
                tool_calls += 1
                output = read_run_output(str((call.get("input") or {}).get("path", "")), run_output) \
                    if call.get("name") == "read_run_output" else f"error: unknown tool {call.get('name')!r}"
                transcript.add(type="tool_call", name=call.get("name"), input=call.get("input"), bytes=len(output))
                results.append({"type": "tool_result", "tool_use_id": call.get("id"), "content": output})
            messages.append({"role": "user", "content": results})
        body = {"model": model, "max_tokens": 64, "system": SYSTEM, "tools": TOOLS, "messages": messages}
        answer = ask_model_streaming(base_url, body) if stream else ask_model(base_url, body)
        requests += 1
        transcript.add(type="model_call", model=answer.get("model"), stop_reason=answer.get("stop_reason"),
                       usage=answer.get("usage"))
        content = answer.get("content") or []
        text = "\n".join(b.get("text", "") for b in content if isinstance(b, dict) and b.get("type") == "text")
        pending = [b for b in content if isinstance(b, dict) and b.get("type") == "tool_use"]
        if answer.get("stop_reason") != "tool_use" or not pending:
            break
    match = _VERDICT_RE.search(text)
    return {"sweep_task": task, "run_output": run_output, "verdict": match.group(1).lower() if match else None,
            "model_text": text[:2000], "model": answer.get("model"), "model_requests": requests,
            "tool_calls": tool_calls, "streamed": stream}


def main(argv: list[str] | None = None) -> int:
    """Entry point (``python -m demo.review_agent INPUT_FILE [WORK_DIR]``): review the run the input
    names and write ``verdict.json`` in the work directory; returns 0 (a verdict), 1 (the model
    could not be reached), 2 (no verdict, or no input named)."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        print("usage: python -m demo.review_agent INPUT_FILE [WORK_DIR]", file=sys.stderr)
        return 2
    work_dir = argv[1] if len(argv) > 1 else os.environ.get("TCO_WORK_DIR", os.getcwd())
    with open(argv[0], encoding="utf-8") as fh:
        data = json.load(fh)
    task, run_output = int(data["sweep_task"]), str(data["run_output"])
    model = data.get("model") or os.environ.get("TCO_MODEL") or DEFAULT_MODEL
    base_url = os.environ.get("ANTHROPIC_BASE_URL", "http://127.0.0.1:8790")
    transcript = Transcript(os.path.join(work_dir, "transcript.jsonl"))
    try:
        result = review(task, run_output, model, base_url, transcript, stream=bool(data.get("stream")))
    except (urllib.error.URLError, OSError, ValueError) as exc:
        result = {"sweep_task": task, "run_output": run_output, "verdict": None,
                  "error": f"{type(exc).__name__}: {exc}"[:500]}
        status = 1
    else:
        status = 0 if result["verdict"] else 2
    tmp = os.path.join(work_dir, "verdict.json.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(result, fh)
    os.replace(tmp, os.path.join(work_dir, "verdict.json"))
    print(f"review agent: run {task}: verdict {result['verdict']}"
          + (f" ({result['error']})" if result.get("error") else ""))
    return status


if __name__ == "__main__":
    sys.exit(main())
