"""STAND-IN model API: a local server that speaks the Anthropic Messages API. Not a real model.

Bundled so the pipeline (agent -> metering proxy -> model API) runs end to
end and in tests without an account or the internet. Everything it sends is
labelled: reply text starts with ``[stand-in]``, message ids with
``msg_standin_``, and every response has the header ``x-tco-stand-in: true``.
A real endpoint is configured instead by base URL and credential name (the
policy's endpoint and ``credential_binding``; see execution/metering/proxy.py).

Run: ``python -m demo.demo_model --port N --api-key-file F [--latency-ms 50]
[--event-delay-ms 0] [--script echo|review] [--host 127.0.0.1]``.

Routes:

- ``POST /v1/messages``: Anthropic Messages, JSON or ``"stream": true``
  (server-sent events: ``message_start``, ``content_block_*``, ``ping``,
  ``message_delta`` with CUMULATIVE usage, ``message_stop``). Requires the
  header ``x-api-key`` equal to the configured key, else 401
  ``authentication_error``: so a test can prove the agent never had the key
  and the proxy added it.
- ``POST /v1/messages/count_tokens``: ``{"input_tokens": N}`` (free, as in the API).
- ``POST /v1/chat/completions``: a small OpenAI-compatible twin (key in
  ``Authorization: Bearer``); streams carry usage only when the request set
  ``stream_options.include_usage``, as OpenAI's do.
- ``GET /_stand_in/served``: what it served (per request and totals) as
  JSON, so an end-to-end test can compare the proxy's totals with the model's.
  ``POST /_stand_in/reset`` clears it and the prompt cache.

Tokens are counted deterministically: ceil(UTF-8 bytes / 4) per text.
Prompt caching is simulated: blocks up to each ``cache_control`` breakpoint
form a prefix; a prefix seen before is read from the cache, a new one is
written with its breakpoint's TTL (``"ttl": "1h"`` or the default 5m), so
``usage.cache_creation`` carries the 5m/1h split. The OpenAI twin reports a
repeated conversation prefix (all messages but the last) as
``cached_tokens`` inside ``prompt_tokens``, and 16 reasoning tokens inside
``completion_tokens`` when the request sets ``reasoning_effort``.

Scripts choose the reply from the request, deterministically:
``echo`` (default) describes what it received; ``review`` answers
``verdict: bad`` when the user messages contain ``diverged`` or ``crashed``
(any case), else ``verdict: ok``.

Test controls (request headers; it is a stand-in): ``x-stand-in-status: 429``
(or 500, 529) answers that error the way the API does (429 with
``retry-after``); ``x-stand-in-event-delay-ms`` sleeps between stream
events; ``x-stand-in-latency-ms`` overrides the latency before the first byte.
"""
from __future__ import annotations

import argparse
import asyncio
import hashlib
import hmac
import itertools
import json
import math
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from execution.spool.contract import TOKEN_FIELDS

LABEL = "tco stand-in model API (not a real model)"
STAND_IN_HEADER = {"x-tco-stand-in": "true"}
BYTES_PER_TOKEN = 4
SCRIPTS = ("echo", "review")


def count_tokens(text: str) -> int:
    """The stand-in's tokenizer: ceil(UTF-8 bytes / 4)."""
    return math.ceil(len(text.encode("utf-8")) / BYTES_PER_TOKEN)


@dataclass
class StandInConfig:
    """``api_key``: the key callers must send; ``latency_ms``: delay before the
    first byte; ``event_delay_ms``: delay between stream events; ``script``:
    one of :data:`SCRIPTS`; ``model_id``: the model the responses name (None:
    the requested one)."""

    api_key: str
    latency_ms: float = 0.0
    event_delay_ms: float = 0.0
    script: str = "echo"
    model_id: str | None = None


@dataclass
class Ledger:
    """What the stand-in served. ``requests``: one dict per answered request
    (tokens it billed, whether the stream was cut); ``rejected``: counts of
    refused requests by reason."""

    requests: list[dict] = field(default_factory=list)
    rejected: dict[str, int] = field(default_factory=dict)
    cache: set[str] = field(default_factory=set)

    def totals(self) -> dict:
        """Token fields summed over the requests served, with ``requests``, ``disconnected`` and
        ``total_tokens`` (the disjoint buckets; reasoning is inside output)."""
        keys = TOKEN_FIELDS
        out = {k: sum(r.get(k, 0) for r in self.requests) for k in keys}
        out["requests"] = len(self.requests)
        out["disconnected"] = sum(1 for r in self.requests if r.get("disconnected"))
        out["total_tokens"] = sum(out[k] for k in keys if k != "reasoning_tokens")
        return out

    def reject(self, reason: str) -> None:
        """Count one refused request for ``reason``."""
        self.rejected[reason] = self.rejected.get(reason, 0) + 1


# ------------------------------------------------------------------ requests


def _text_of(content: Any) -> str:
    """All text of a message content (a string or a list of blocks)."""
    if isinstance(content, str):
        return content
    parts = []
    if isinstance(content, list):
        for block in content:
            if isinstance(block, dict):
                if isinstance(block.get("text"), str):
                    parts.append(block["text"])
                elif block.get("type") == "tool_result":
                    parts.append(_text_of(block.get("content")))
                elif block.get("type") == "tool_use":
                    parts.append(json.dumps(block.get("input"), sort_keys=True))
            elif isinstance(block, str):
                parts.append(block)
    return "\n".join(parts)


def _blocks(body: dict) -> list[tuple[str, dict | None]]:
    """The prompt in cache order (tools, system, messages) as (text, cache_control)."""
    out: list[tuple[str, dict | None]] = []
    for tool in body.get("tools") or []:
        if isinstance(tool, dict):
            out.append((json.dumps(tool, sort_keys=True), tool.get("cache_control")))
    system = body.get("system")
    if isinstance(system, str):
        out.append((system, None))
    elif isinstance(system, list):
        out.extend((_text_of([b]), b.get("cache_control") if isinstance(b, dict) else None) for b in system)
    for message in body.get("messages") or []:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):
            out.extend((_text_of([b]), b.get("cache_control") if isinstance(b, dict) else None) for b in content)
        else:
            out.append((_text_of(content), None))
    return out


def anthropic_prompt_usage(body: dict, cache: set[str]) -> dict:
    """Input-side usage of a Messages request, simulating prompt caching
    (module doc); updates ``cache``. Returns ``input_tokens``,
    ``cache_read_input_tokens``, ``cache_creation_input_tokens`` and the
    ``cache_creation`` 5m/1h split."""
    blocks = _blocks(body)
    digest = hashlib.sha256()
    tokens_so_far = 0
    read = 0
    write = {"5m": 0, "1h": 0}
    last_read_tokens = 0
    segment_start = 0
    total = sum(count_tokens(t) for t, _ in blocks)
    for text, cache_control in blocks:
        digest.update(text.encode("utf-8") + b"\0")
        tokens_so_far += count_tokens(text)
        if not isinstance(cache_control, dict):
            continue
        key = digest.hexdigest()
        if key in cache:
            last_read_tokens = tokens_so_far
            write = {"5m": 0, "1h": 0}  # a longer cached prefix supersedes writes before it
        else:
            ttl = "1h" if cache_control.get("ttl") == "1h" else "5m"
            write[ttl] += tokens_so_far - max(segment_start, last_read_tokens)
            cache.add(key)
        segment_start = tokens_so_far
    read = last_read_tokens
    written = write["5m"] + write["1h"]
    return {
        "input_tokens": total - read - written,
        "cache_creation_input_tokens": written,
        "cache_read_input_tokens": read,
        "cache_creation": {"ephemeral_5m_input_tokens": write["5m"], "ephemeral_1h_input_tokens": write["1h"]},
    }


def reply_text(body: dict, script: str) -> str:
    """The scripted reply to a request (module doc)."""
    messages = body.get("messages") or []
    user_text = "\n".join(_text_of(m.get("content")) for m in messages
                          if isinstance(m, dict) and m.get("role") == "user")
    if script == "review":
        lowered = user_text.lower()
        return "verdict: bad" if ("diverged" in lowered or "crashed" in lowered) else "verdict: ok"
    return (f"[stand-in] Not a real model. Received {len(messages)} message(s), "
            f"{len(user_text)} characters of user text.")


def _truncate(text: str, max_tokens: int) -> tuple[str, bool]:
    data = text.encode("utf-8")
    limit = max(0, max_tokens) * BYTES_PER_TOKEN
    if len(data) <= limit:
        return text, False
    return data[:limit].decode("utf-8", "ignore"), True


def _pieces(text: str) -> list[str]:
    """Split the reply into stream deltas (words with their spaces)."""
    words = text.split(" ")
    return [w + (" " if i < len(words) - 1 else "") for i, w in enumerate(words)] or [""]


# ------------------------------------------------------------------ the app


def _error(status: int, kind: str, message: str, headers: dict | None = None) -> web.Response:
    return web.json_response({"type": "error", "error": {"type": kind, "message": f"{message} ({LABEL})"}},
                             status=status, headers={**STAND_IN_HEADER, **(headers or {})})


def _forced(request: web.Request, ledger: Ledger) -> web.Response | None:
    status = request.headers.get("x-stand-in-status")
    if not status:
        return None
    ledger.reject(f"forced_{status}")
    if status == "429":
        return _error(429, "rate_limit_error", "stand-in rate limit", {
            "retry-after": "1", "anthropic-ratelimit-requests-remaining": "0"})
    if status == "529":
        return _error(529, "overloaded_error", "stand-in overloaded")
    return _error(500, "api_error", "stand-in internal error")


def _ms(request: web.Request, name: str, default: float) -> float:
    try:
        return float(request.headers.get(name, default))
    except ValueError:
        return default


class StandInModel:
    """The stand-in server's handlers and state (one :class:`Ledger`)."""

    def __init__(self, config: StandInConfig) -> None:
        if config.script not in SCRIPTS:
            raise ValueError(f"unknown script {config.script!r}; one of {', '.join(SCRIPTS)}")
        self.config = config
        self.ledger = Ledger()
        self._ids = itertools.count(1)

    def app(self) -> web.Application:
        """The aiohttp application."""
        app = web.Application(client_max_size=64 << 20)
        app.router.add_post("/v1/messages", self.messages)
        app.router.add_post("/v1/messages/count_tokens", self.count_tokens)
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        app.router.add_get("/_stand_in/served", self.served)
        app.router.add_post("/_stand_in/reset", self.reset)
        return app

    async def served(self, request: web.Request) -> web.Response:
        """``GET /_stand_in/served``: the ledger (totals, refusals, every request) as JSON."""
        return web.json_response({"stand_in": True, "label": LABEL, "totals": self.ledger.totals(),
                                  "rejected": self.ledger.rejected, "per_request": self.ledger.requests},
                                 headers=STAND_IN_HEADER)

    async def reset(self, request: web.Request) -> web.Response:
        """``POST /_stand_in/reset``: start a new ledger."""
        self.ledger = Ledger()
        return web.json_response({"stand_in": True, "reset": True}, headers=STAND_IN_HEADER)

    def _key_ok(self, presented: str | None) -> bool:
        return presented is not None and hmac.compare_digest(presented.encode(), self.config.api_key.encode())

    async def _body(self, request: web.Request) -> dict | web.Response:
        try:
            body = await request.json()
        except ValueError:
            return _error(400, "invalid_request_error", "body is not JSON")
        if not isinstance(body, dict) or not isinstance(body.get("model"), str) \
                or not isinstance(body.get("messages"), list):
            return _error(400, "invalid_request_error", "model and messages are required")
        return body

    async def _forced_or_body(self, request: web.Request) -> dict | web.Response:
        """A forced error (``x-stand-in-status``, counted as rejected) or else :meth:`_body`."""
        forced = _forced(request, self.ledger)
        if forced is not None:
            return forced
        return await self._body(request)

    def _entry(self, request: web.Request, api: str, body: dict, stream: bool) -> dict:
        return {"n": next(self._ids), "api": api, "model": self.config.model_id or body["model"], "stream": stream,
                "credential_headers": sorted(h for h in ("x-api-key", "authorization") if h in request.headers),
                "started": time.time(), "disconnected": False}

    async def messages(self, request: web.Request) -> web.StreamResponse:
        """``POST /v1/messages`` (Anthropic Messages API)."""
        if not self._key_ok(request.headers.get("x-api-key")):
            self.ledger.reject("auth")
            return _error(401, "authentication_error", "invalid x-api-key")
        body = await self._forced_or_body(request)
        if isinstance(body, web.Response):
            return body
        if not isinstance(body.get("max_tokens"), int):
            return _error(400, "invalid_request_error", "max_tokens: an integer is required")
        await asyncio.sleep(_ms(request, "x-stand-in-latency-ms", self.config.latency_ms) / 1000)
        stream = bool(body.get("stream"))
        entry = self._entry(request, "messages", body, stream)
        prompt = anthropic_prompt_usage(body, self.ledger.cache)
        text, truncated = _truncate(reply_text(body, self.config.script), body["max_tokens"])
        output_tokens = max(1, count_tokens(text))
        stop_reason = "max_tokens" if truncated else "end_turn"
        entry.update(input_tokens=prompt["input_tokens"], cache_read_tokens=prompt["cache_read_input_tokens"],
                     cache_write_5m_tokens=prompt["cache_creation"]["ephemeral_5m_input_tokens"],
                     cache_write_1h_tokens=prompt["cache_creation"]["ephemeral_1h_input_tokens"],
                     output_tokens=output_tokens, reasoning_tokens=0, text=text)
        message_id = f"msg_standin_{entry['n']:06d}"
        if not stream:
            self.ledger.requests.append(entry)
            return web.json_response({
                "id": message_id, "type": "message", "role": "assistant", "model": entry["model"],
                "content": [{"type": "text", "text": text}], "stop_reason": stop_reason, "stop_sequence": None,
                "usage": {**prompt, "output_tokens": output_tokens},
            }, headers=STAND_IN_HEADER)

        delay = _ms(request, "x-stand-in-event-delay-ms", self.config.event_delay_ms) / 1000
        response = web.StreamResponse(headers={**STAND_IN_HEADER, "content-type": "text/event-stream",
                                               "cache-control": "no-cache"})
        sent_bytes = 0
        self.ledger.requests.append(entry)
        try:
            await response.prepare(request)

            async def send(kind: str, data: dict) -> None:
                await response.write(f"event: {kind}\ndata: {json.dumps(data)}\n\n".encode("utf-8"))
                if delay:
                    await asyncio.sleep(delay)

            await send("message_start", {"type": "message_start", "message": {
                "id": message_id, "type": "message", "role": "assistant", "model": entry["model"], "content": [],
                "stop_reason": None, "stop_sequence": None, "usage": {**prompt, "output_tokens": 1}}})
            await send("content_block_start", {"type": "content_block_start", "index": 0,
                                               "content_block": {"type": "text", "text": ""}})
            await send("ping", {"type": "ping"})
            for piece in _pieces(text):
                await send("content_block_delta", {"type": "content_block_delta", "index": 0,
                                                   "delta": {"type": "text_delta", "text": piece}})
                sent_bytes += len(piece.encode("utf-8"))
            await send("content_block_stop", {"type": "content_block_stop", "index": 0})
            # Cumulative, repeating the input side as the current API does: a reader that adds
            # message_start and message_delta counts the input twice.
            await send("message_delta", {"type": "message_delta",
                                         "delta": {"stop_reason": stop_reason, "stop_sequence": None},
                                         "usage": {**prompt, "output_tokens": output_tokens}})
            await send("message_stop", {"type": "message_stop"})
            await response.write_eof()
        except (asyncio.CancelledError, ConnectionResetError, ConnectionError):
            # The client went away mid-stream: "generation stops"; bill what was produced.
            entry["disconnected"] = True
            entry["output_tokens"] = max(1, math.ceil(sent_bytes / BYTES_PER_TOKEN))
            entry["ended"] = time.time()
            raise
        entry["ended"] = time.time()
        return response

    async def count_tokens(self, request: web.Request) -> web.Response:
        """``POST /v1/messages/count_tokens``: ``{"input_tokens": N}``, free (not in the ledger)."""
        if not self._key_ok(request.headers.get("x-api-key")):
            self.ledger.reject("auth")
            return _error(401, "authentication_error", "invalid x-api-key")
        body = await self._body(request)
        if isinstance(body, web.Response):
            return body
        return web.json_response({"input_tokens": sum(count_tokens(t) for t, _ in _blocks(body))},
                                 headers=STAND_IN_HEADER)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        """``POST /v1/chat/completions`` (OpenAI-compatible twin)."""
        auth = request.headers.get("authorization", "")
        if not (auth.startswith("Bearer ") and self._key_ok(auth[len("Bearer "):])):
            self.ledger.reject("auth")
            return web.json_response({"error": {"type": "invalid_request_error", "code": "invalid_api_key",
                                                "message": f"invalid key ({LABEL})"}},
                                     status=401, headers=STAND_IN_HEADER)
        body = await self._forced_or_body(request)
        if isinstance(body, web.Response):
            return body
        await asyncio.sleep(_ms(request, "x-stand-in-latency-ms", self.config.latency_ms) / 1000)
        stream = bool(body.get("stream"))
        entry = self._entry(request, "chat.completions", body, stream)
        messages = body["messages"]
        texts = [_text_of(m.get("content")) if isinstance(m, dict) else "" for m in messages]
        prompt_tokens = sum(count_tokens(t) for t in texts)
        prefix_key = "chat:" + hashlib.sha256(json.dumps(messages[:-1], sort_keys=True).encode()).hexdigest()
        cached = sum(count_tokens(t) for t in texts[:-1]) if prefix_key in self.ledger.cache else 0
        if len(messages) > 1:
            self.ledger.cache.add(prefix_key)
        text = reply_text(body, self.config.script)
        reasoning = 16 if body.get("reasoning_effort") else 0
        completion = max(1, count_tokens(text)) + reasoning
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion,
                 "total_tokens": prompt_tokens + completion,
                 "prompt_tokens_details": {"cached_tokens": cached, "audio_tokens": 0},
                 "completion_tokens_details": {"reasoning_tokens": reasoning, "audio_tokens": 0}}
        entry.update(input_tokens=prompt_tokens - cached, cache_read_tokens=cached, cache_write_5m_tokens=0,
                     cache_write_1h_tokens=0, output_tokens=completion, reasoning_tokens=reasoning, text=text)
        chat_id = f"chatcmpl-standin-{entry['n']:06d}"
        base = {"id": chat_id, "created": int(time.time()), "model": entry["model"], "system_fingerprint": "stand-in"}
        self.ledger.requests.append(entry)
        if not stream:
            return web.json_response({**base, "object": "chat.completion", "choices": [
                {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
                "usage": usage}, headers=STAND_IN_HEADER)
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        entry["include_usage"] = include_usage
        if not include_usage:
            entry["usage_sent"] = False
        response = web.StreamResponse(headers={**STAND_IN_HEADER, "content-type": "text/event-stream"})
        await response.prepare(request)
        extra = {"usage": None} if include_usage else {}
        chunk = {**base, "object": "chat.completion.chunk"}
        for piece in [""] + _pieces(text):
            delta = {"content": piece} if piece else {"role": "assistant", "content": ""}
            await response.write(b"data: " + json.dumps({**chunk, "choices": [
                {"index": 0, "delta": delta, "finish_reason": None}], **extra}).encode() + b"\n\n")
        await response.write(b"data: " + json.dumps({**chunk, "choices": [
            {"index": 0, "delta": {}, "finish_reason": "stop"}], **extra}).encode() + b"\n\n")
        if include_usage:
            await response.write(b"data: " + json.dumps({**chunk, "choices": [], "usage": usage}).encode() + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


async def start_stand_in(config: StandInConfig, host: str = "127.0.0.1", port: int = 0,
                         sock: Any = None) -> tuple[web.AppRunner, StandInModel, int]:
    """Start the stand-in on ``host:port`` (0: any free port) in the running
    loop, or on ``sock``, a listening socket made by someone else (e.g. bound
    by root to a privileged port, scripts/listen-as). Returns ``(runner,
    model, port)``; ``await runner.cleanup()`` stops it."""
    model = StandInModel(config)
    # handler_cancellation: a client that disconnects stops the "generation" at once.
    runner = web.AppRunner(model.app(), handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.SockSite(runner, sock) if sock is not None else web.TCPSite(runner, host, port)
    await site.start()
    bound = runner.addresses[0][1]
    return runner, model, bound


def spawn(*, port: int, api_key_file: str, script: str = "echo", cwd: str, stdout: Any = None,
          new_session: bool = False, wait_s: float = 20.0, host: str = "127.0.0.1",
          listen_fd: int | None = None) -> Any:
    """Start ``python -m demo.demo_model`` on ``host``:``port`` in a child process and wait until it listens.

    ``host``: the address to listen on; with execution hosts in their own
    namespaces, the master's address on their bridge
    (``schedulers.hosts.master_address``), which the runners can reach.
    ``listen_fd``: a listening socket already bound to ``host``:``port`` (by
    root on a privileged port, scripts/listen-as), passed on to the child
    instead of binding there (``--fd``).

    ``stdout`` (a file or None for /dev/null) also takes stderr. Returns the
    process. Raises RuntimeError (after killing it) when it does not listen
    within ``wait_s`` seconds.
    """
    import os
    import socket
    import subprocess

    argv = [sys.executable, "-m", "demo.demo_model", "--host", host, "--port", str(port), "--script", script,
            "--api-key-file", str(api_key_file)]
    if listen_fd is not None:
        argv += ["--fd", str(listen_fd)]
    proc = subprocess.Popen(
        argv, cwd=cwd, env={**os.environ, "PYTHONPATH": str(cwd)},
        stdout=stdout if stdout is not None else subprocess.DEVNULL, stderr=subprocess.STDOUT,
        start_new_session=new_session, pass_fds=(listen_fd,) if listen_fd is not None else ())
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            socket.create_connection((host, port), 0.5).close()
            return proc
        except OSError:
            if proc.poll() is not None:
                break
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"the stand-in model did not listen on {host}:{port}")


def main(argv: list[str] | None = None) -> int:
    """Command line entry point (module doc)."""
    parser = argparse.ArgumentParser(prog="python -m demo.demo_model", description=f"{LABEL}.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--api-key-file", required=True, help="file holding the key callers must send")
    parser.add_argument("--latency-ms", type=float, default=0.0, help="delay before the first byte")
    parser.add_argument("--event-delay-ms", type=float, default=0.0, help="delay between stream events")
    parser.add_argument("--script", choices=SCRIPTS, default="echo")
    parser.add_argument("--model-id", default=None, help="model id to answer with (default: the requested one)")
    parser.add_argument("--fd", type=int, default=None,
                        help="serve on this inherited listening socket (bound to --host:--port by its maker)")
    args = parser.parse_args(argv)
    with open(args.api_key_file, encoding="utf-8") as fh:
        key = fh.read().strip()
    if not key:
        parser.error(f"{args.api_key_file} is empty")
    config = StandInConfig(api_key=key, latency_ms=args.latency_ms, event_delay_ms=args.event_delay_ms,
                           script=args.script, model_id=args.model_id)

    sock = None
    if args.fd is not None:
        import socket

        sock = socket.socket(fileno=args.fd)
        if sock.type != socket.SOCK_STREAM or sock.getsockname()[:2] != (args.host, args.port):
            parser.error(f"--fd {args.fd} is not a TCP socket bound to {args.host}:{args.port}")

    async def serve() -> None:
        runner, _, port = await start_stand_in(config, args.host, args.port, sock=sock)
        print(f"{LABEL} listening on http://{args.host}:{port} (script {args.script})", flush=True)
        try:
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()

    try:
        asyncio.run(serve())
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
