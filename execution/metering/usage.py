"""Read token usage from model API responses: JSON bodies and server-sent events.

Standard library only. Everything here is pure: bytes in, :class:`Usage` out.

Formats (sources):

- Anthropic Messages API ("Messages", "Streaming Messages" and "Prompt
  caching" pages of the Anthropic API docs). JSON body: ``{"type":
  "message", "model", "usage": {"input_tokens", "output_tokens",
  "cache_read_input_tokens", "cache_creation_input_tokens",
  "cache_creation": {"ephemeral_5m_input_tokens",
  "ephemeral_1h_input_tokens"}}}``; ``input_tokens`` is already the
  uncached input. Stream: ``message_start`` carries ``message.usage`` (input
  and cache fields, a preliminary ``output_tokens``), ``content_block_delta``
  carries text, ``message_delta`` carries ``usage`` that is CUMULATIVE for
  the message (a field it repeats supersedes the earlier value; never add
  them, BUG-12), ``message_stop`` ends the message.
- OpenAI chat completions (OpenAI API reference, "Chat" and "Streaming").
  JSON: ``{"object": "chat.completion", "model", "usage": {"prompt_tokens",
  "completion_tokens", "prompt_tokens_details": {"cached_tokens"},
  "completion_tokens_details": {"reasoning_tokens"}}}``. ``prompt_tokens``
  INCLUDES ``cached_tokens``; ``reasoning_tokens`` is part of
  ``completion_tokens``. Stream: ``chat.completion.chunk`` objects; with
  ``stream_options.include_usage`` every chunk has ``"usage": null`` and the
  last chunk before ``[DONE]`` has the usage and an EMPTY ``choices`` list
  (BUG-11).
- OpenAI responses (OpenAI API reference, "Responses" and "Streaming
  responses"). JSON: ``{"object": "response", "model", "usage":
  {"input_tokens", "input_tokens_details": {"cached_tokens"},
  "output_tokens", "output_tokens_details": {"reasoning_tokens"}}}``
  (input includes cached, output includes reasoning). Stream: events
  ``response.created`` ... ``response.*.delta`` ... ``response.completed``
  (or ``response.incomplete`` / ``response.failed``) whose ``response``
  carries the usage.
- Server-sent events: the WHATWG HTML standard, "Server-sent events",
  event stream interpretation.

Buckets (DESIGN.md, disjoint): ``input_tokens`` (uncached input),
``cache_read_tokens``, ``cache_write_5m_tokens``, ``cache_write_1h_tokens``,
``output_tokens``; ``reasoning_tokens`` is a PART of ``output_tokens``.

Rules decided here (each has a test):

- Cache writes without a TTL split (only ``cache_creation_input_tokens``)
  count as 5-minute writes and are flagged ``ttl_split_missing``: 5 minutes
  is the API's default TTL and the only one that existed before the split
  was reported, and it is the cheaper rate, so the bill is never inflated by
  a guess. A split that does not add up to ``cache_creation_input_tokens`` is
  flagged ``ttl_split_incomplete``; a missing remainder is counted as 5m
  writes, an excess keeps the split's own numbers.
- OpenAI ``cached_tokens`` greater than ``prompt_tokens`` cannot be a part
  of it; then ``prompt_tokens`` is taken as the uncached input (no negative
  bucket).
- Complete means the terminal event arrived (``message_stop``, ``[DONE]``,
  ``response.completed|incomplete|failed``; for a JSON body: it parsed) and
  the client received the whole response. Otherwise ``complete`` is false and
  the flag ``incomplete`` is set.
- When the final usage did not arrive, output is estimated at
  :data:`BYTES_PER_TOKEN` bytes a token from the UTF-8 bytes of generated
  content received (text, thinking, tool-call arguments, refusals; for an
  unparseable JSON body: all body bytes), never below a count the stream
  already reported, and flagged ``output_estimated``. When no usage arrived
  at all it is also flagged ``usage_missing``; input is then estimated from
  the request's text when the caller passes the request (else 0), so every
  number under ``usage_missing`` is an estimate. No tokenizer is used.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Iterable, Mapping

from execution.spool import TOKEN_BUCKETS, TOKEN_FIELDS

__all__ = [
    "BYTES_PER_TOKEN", "FLAGS", "SSEEvent", "SSEDecoder", "Usage", "StreamUsageReader", "JsonUsageReader",
    "ResponseUsageReader", "usage_from_json", "usage_from_sse", "usage_from_usage_object", "usage_from_bytes",
    "detect_api", "api_for_path", "estimate_tokens", "estimate_request_input_tokens",
    "usage_file_lines", "append_usage_file",
]

BYTES_PER_TOKEN = 4

#: Every flag this module sets (DESIGN.md's list, the part that is about usage).
FLAGS = ("incomplete", "output_estimated", "usage_missing", "ttl_split_missing", "ttl_split_incomplete")

ANTHROPIC = "anthropic"
OPENAI = "openai"
API_MESSAGES = "messages"
API_CHAT = "chat.completions"
API_RESPONSES = "responses"
_PROVIDER_OF_API = {API_MESSAGES: ANTHROPIC, API_CHAT: OPENAI, API_RESPONSES: OPENAI}


def estimate_tokens(nbytes: int) -> int:
    """Tokens for ``nbytes`` bytes of text at :data:`BYTES_PER_TOKEN` bytes a token, rounded up."""
    return math.ceil(max(0, nbytes) / BYTES_PER_TOKEN)


# --------------------------------------------------------------------------- SSE


@dataclass(frozen=True)
class SSEEvent:
    """One dispatched server-sent event: ``event`` type (default ``message``),
    ``data`` (the data lines joined by ``\\n``), last event ``id`` or None."""

    event: str
    data: str
    id: str | None = None


_LINE_BREAK = re.compile(rb"\r\n|\r|\n")
_BOM = b"\xef\xbb\xbf"


class SSEDecoder:
    """Incremental server-sent events decoder (WHATWG "event stream interpretation").

    :meth:`feed` takes raw bytes split anywhere (between CR and LF, inside a
    multi-byte UTF-8 character, inside a field) and returns the events
    completed by them; the result equals parsing the whole stream in one
    piece (BUG-15). Bytes are kept until a line is complete and only whole
    lines are decoded (UTF-8, invalid bytes replaced), which is safe because
    CR and LF never occur inside a multi-byte UTF-8 sequence. Lines end in
    CRLF, LF or CR; a CR at the end of a read waits for the next read, which
    may start with its LF. Comments (``:``) and unknown fields are ignored,
    ``data`` lines are joined with ``\\n``, one leading space after the colon
    is removed, a leading BOM is dropped, and an event with no data is not
    dispatched.

    :meth:`close` ends the stream. Unlike the standard, which drops an event
    not followed by a blank line, it dispatches the pending event: some
    servers omit the last blank line, and a payload that was cut off does not
    parse as JSON anyway.
    """

    def __init__(self) -> None:
        self._buf = bytearray()
        self._scan_from = 0
        self._started = False
        self._data: list[str] = []
        self._event = ""
        self._last_id: str | None = None
        self.bytes_received = 0

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """Add ``chunk`` (bytes); return the events it completed, in order."""
        self.bytes_received += len(chunk)
        self._buf += chunk
        if not self._started:
            if len(self._buf) < len(_BOM) and _BOM.startswith(bytes(self._buf)):
                return []
            if self._buf.startswith(_BOM):
                del self._buf[:len(_BOM)]
            self._started = True
        return self._drain(final=False)

    def close(self) -> list[SSEEvent]:
        """End of stream: return the events still pending (see the class doc)."""
        self._started = True
        events = self._drain(final=True)
        if self._buf:
            self._line(self._buf.decode("utf-8", "replace"), events)
            self._buf.clear()
        self._dispatch(events)
        return events

    def _drain(self, final: bool) -> list[SSEEvent]:
        events: list[SSEEvent] = []
        buf = self._buf
        pos = 0
        # Only a CR left at the end of the previous read can precede _scan_from.
        for match in _LINE_BREAK.finditer(buf, max(0, self._scan_from - 1)):
            if match.group() == b"\r" and match.end() == len(buf) and not final:
                break  # the LF of a CRLF may be in the next read
            self._line(buf[pos:match.start()].decode("utf-8", "replace"), events)
            pos = match.end()
        if pos:
            del buf[:pos]
        self._scan_from = len(buf)
        return events

    def _line(self, line: str, events: list[SSEEvent]) -> None:
        if line == "":
            self._dispatch(events)
            return
        if line.startswith(":"):
            return
        name, sep, value = line.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id" and "\0" not in value:
            self._last_id = value

    def _dispatch(self, events: list[SSEEvent]) -> None:
        if self._data:
            events.append(SSEEvent(self._event or "message", "\n".join(self._data), self._last_id))
        self._data = []
        self._event = ""


# ------------------------------------------------------------------------- Usage


@dataclass
class Usage:
    """Token usage of one model response, in disjoint buckets (tokens).

    ``provider``: ``anthropic`` | ``openai`` | None (not recognised);
    ``api``: ``messages`` | ``chat.completions`` | ``responses`` | None;
    ``model``: the model id the response named (None if it named none).
    ``input_tokens`` is uncached input; ``reasoning_tokens`` is a part of
    ``output_tokens``. ``complete``/``flags``: see the module doc.
    ``estimate_basis_bytes``: bytes the output estimate was made from
    (0 when nothing was estimated).
    """

    provider: str | None = None
    api: str | None = None
    model: str | None = None
    input_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_5m_tokens: int = 0
    cache_write_1h_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0
    complete: bool = True
    flags: list[str] = field(default_factory=list)
    estimate_basis_bytes: int = 0

    BUCKETS = TOKEN_BUCKETS

    def flag(self, name: str) -> None:
        """Add a flag once, keeping the order of first appearance."""
        if name not in self.flags:
            self.flags.append(name)

    @property
    def total_tokens(self) -> int:
        """Sum of the disjoint buckets (reasoning is inside output, not added)."""
        return sum(getattr(self, name) for name in self.BUCKETS)

    def to_dict(self) -> dict:
        """JSON-ready dict of every field plus ``total_tokens``."""
        data = dataclasses.asdict(self)
        data["flags"] = list(self.flags)
        data["total_tokens"] = self.total_tokens
        return data


def _count(value: Any) -> int | None:
    """A token count from JSON: a non-negative integer (an integral float is
    accepted); anything else (None, bool, str, negative) is None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value >= 0 else None
    if isinstance(value, (float, Decimal)) and value >= 0 and value == int(value):
        return int(value)
    return None


def _anthropic_buckets(fields: Mapping[str, Any], usage: Usage) -> None:
    """Fill ``usage`` from an Anthropic ``usage`` object (or the merged fields
    of a stream; the same function for both, so the paths cannot differ)."""
    usage.input_tokens = _count(fields.get("input_tokens")) or 0
    usage.cache_read_tokens = _count(fields.get("cache_read_input_tokens")) or 0
    usage.output_tokens = _count(fields.get("output_tokens")) or 0
    total_write = _count(fields.get("cache_creation_input_tokens"))
    split = fields.get("cache_creation")
    has_split = isinstance(split, Mapping) and (
        "ephemeral_5m_input_tokens" in split or "ephemeral_1h_input_tokens" in split)
    if has_split:
        w5 = _count(split.get("ephemeral_5m_input_tokens")) or 0
        w1 = _count(split.get("ephemeral_1h_input_tokens")) or 0
        if total_write is not None and w5 + w1 != total_write:
            usage.flag("ttl_split_incomplete")
            if total_write > w5 + w1:
                w5 += total_write - (w5 + w1)
        usage.cache_write_5m_tokens, usage.cache_write_1h_tokens = w5, w1
    else:
        usage.cache_write_5m_tokens = total_write or 0
        usage.cache_write_1h_tokens = 0
        if total_write:
            usage.flag("ttl_split_missing")


def _openai_buckets(fields: Mapping[str, Any], usage: Usage) -> None:
    """Fill ``usage`` from an OpenAI ``usage`` object, chat completions
    (``prompt_tokens``...) or responses (``input_tokens``...) naming."""
    if "prompt_tokens" in fields or "completion_tokens" in fields:
        prompt = _count(fields.get("prompt_tokens")) or 0
        output = _count(fields.get("completion_tokens")) or 0
        in_details = fields.get("prompt_tokens_details")
        out_details = fields.get("completion_tokens_details")
    else:
        prompt = _count(fields.get("input_tokens")) or 0
        output = _count(fields.get("output_tokens")) or 0
        in_details = fields.get("input_tokens_details")
        out_details = fields.get("output_tokens_details")
    cached = _count(in_details.get("cached_tokens")) if isinstance(in_details, Mapping) else None
    reasoning = _count(out_details.get("reasoning_tokens")) if isinstance(out_details, Mapping) else None
    cached = cached or 0
    # prompt_tokens includes the cached tokens; counting both would bill them twice.
    usage.input_tokens = prompt - cached if cached <= prompt else prompt
    usage.cache_read_tokens = cached
    usage.cache_write_5m_tokens = 0
    usage.cache_write_1h_tokens = 0
    usage.output_tokens = output
    usage.reasoning_tokens = min(reasoning or 0, output)


def _looks_openai_usage(fields: Mapping[str, Any]) -> str | None:
    if "prompt_tokens" in fields or "completion_tokens" in fields:
        return API_CHAT
    if "input_tokens_details" in fields or "output_tokens_details" in fields:
        return API_RESPONSES
    return None


def usage_from_usage_object(fields: Mapping[str, Any], api: str | None = None, model: str | None = None) -> Usage:
    """A bare ``usage`` object -> :class:`Usage`. ``api`` (``messages``,
    ``chat.completions``, ``responses``) says how to read it; None guesses
    from the keys (``prompt_tokens`` -> chat completions, ``*_details`` ->
    responses, else Anthropic Messages). Never raises on odd values."""
    api = api or _looks_openai_usage(fields) or API_MESSAGES
    usage = Usage(provider=_PROVIDER_OF_API.get(api), api=api, model=model)
    if api == API_MESSAGES:
        _anthropic_buckets(fields, usage)
    else:
        _openai_buckets(fields, usage)
    return usage


def detect_api(obj: Any) -> str | None:
    """Which API a parsed JSON body or stream event belongs to (None if unknown):
    Anthropic ``type`` ``message``/``message_*``/``content_block_*`` ->
    ``messages``; ``object`` ``chat.completion[.chunk]`` -> ``chat.completions``;
    ``object`` ``response`` or ``type`` ``response.*`` -> ``responses``."""
    if not isinstance(obj, Mapping):
        return None
    kind = obj.get("type")
    obj_name = obj.get("object")
    if isinstance(obj_name, str):
        if obj_name.startswith("chat.completion"):
            return API_CHAT
        if obj_name == "response":
            return API_RESPONSES
    if isinstance(kind, str):
        if kind == "message" or kind.startswith("message_") or kind.startswith("content_block_"):
            return API_MESSAGES
        if kind.startswith("response."):
            return API_RESPONSES
    if "choices" in obj:
        return API_CHAT
    usage = obj.get("usage")
    if isinstance(usage, Mapping):
        return _looks_openai_usage(usage) or (API_MESSAGES if "input_tokens" in usage else None)
    return None


def api_for_path(path: str) -> str | None:
    """The API a request path names: ``.../messages`` -> ``messages``,
    ``.../chat/completions`` -> ``chat.completions``, ``.../responses`` ->
    ``responses``; else None (the response then decides)."""
    path = path.split("?", 1)[0].rstrip("/")
    if path.endswith("/messages"):
        return API_MESSAGES
    if path.endswith("/chat/completions"):
        return API_CHAT
    if path.endswith("/responses"):
        return API_RESPONSES
    return None


def _utf8_len(text: Any) -> int:
    return len(text.encode("utf-8")) if isinstance(text, str) else 0


# Keys whose string values are not prompt text: binary payloads (base64 images, files) and
# structural labels.
_SKIPPED_KEYS = frozenset({"data", "file_data", "image_url", "url", "b64_json", "signature", "type", "role",
                           "media_type", "cache_control", "id", "tool_use_id", "tool_call_id"})


def estimate_request_input_tokens(request: Any) -> int:
    """Estimate input tokens of a request body (parsed JSON) from the UTF-8
    bytes of its text: every string under ``system``, ``messages``,
    ``input``, ``instructions``, ``tools`` and ``prompt``, skipping binary
    payloads (``data``, ``url``, ``image_url``, ``file_data`` ...) and labels
    (``type``, ``role``, ids). Used only
    when a response carries no usage (flag ``usage_missing``)."""
    if not isinstance(request, Mapping):
        return 0
    total = 0
    stack = [request.get(k) for k in ("system", "messages", "input", "instructions", "tools", "prompt")]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            total += _utf8_len(item)
        elif isinstance(item, Mapping):
            stack.extend(v for k, v in item.items() if k not in _SKIPPED_KEYS)
        elif isinstance(item, list):
            stack.extend(item)
    return estimate_tokens(total)


class _State:
    """What one response has shown so far, provider-neutral."""

    def __init__(self) -> None:
        self.api: str | None = None
        self.model: str | None = None
        self.fields: dict[str, Any] = {}   # merged usage fields (Anthropic: latest wins per field)
        self.saw_usage = False
        self.usage_final = False           # the final usage has arrived
        self.terminal = False              # the terminal event has arrived
        self.content_bytes = 0             # generated content received (for estimates)


def _anthropic_event(state: _State, obj: Mapping[str, Any]) -> None:
    kind = obj.get("type")
    if kind == "message_start":
        message = obj.get("message")
        if isinstance(message, Mapping):
            if isinstance(message.get("model"), str):
                state.model = message["model"]
            _merge_usage(state, message.get("usage"))
    elif kind == "message_delta":
        _merge_usage(state, obj.get("usage"))
        delta = obj.get("delta")
        if isinstance(delta, Mapping) and delta.get("stop_reason") is not None and state.saw_usage:
            state.usage_final = True
    elif kind == "content_block_delta":
        delta = obj.get("delta")
        if isinstance(delta, Mapping):
            for key in ("text", "partial_json", "thinking"):
                state.content_bytes += _utf8_len(delta.get(key))
    elif kind == "content_block_start":
        block = obj.get("content_block")
        if isinstance(block, Mapping):
            state.content_bytes += _utf8_len(block.get("text")) + _utf8_len(block.get("thinking"))
    elif kind == "message_stop":
        state.terminal = True


def _merge_usage(state: _State, usage: Any) -> None:
    # Cumulative semantics (BUG-12): a field present in a later event replaces
    # the earlier value; a field absent (or null) keeps it. Never a sum.
    if not isinstance(usage, Mapping):
        return
    state.saw_usage = True
    for key, value in usage.items():
        if value is not None:
            state.fields[key] = value


def _chat_chunk(state: _State, obj: Mapping[str, Any]) -> None:
    if isinstance(obj.get("model"), str):
        state.model = obj["model"]
    choices = obj.get("choices")
    if isinstance(choices, list):  # may be empty: the usage chunk (BUG-11)
        for choice in choices:
            if not isinstance(choice, Mapping):
                continue
            delta = choice.get("delta")
            if isinstance(delta, Mapping):
                for key in ("content", "refusal", "reasoning_content", "reasoning"):
                    state.content_bytes += _utf8_len(delta.get(key))
                calls = delta.get("tool_calls")
                if isinstance(calls, list):
                    for call in calls:
                        fn = call.get("function") if isinstance(call, Mapping) else None
                        if isinstance(fn, Mapping):
                            state.content_bytes += _utf8_len(fn.get("arguments")) + _utf8_len(fn.get("name"))
    usage = obj.get("usage")
    if isinstance(usage, Mapping):  # null in every chunk but the last; keep looking
        state.fields = dict(usage)
        state.saw_usage = state.usage_final = True


def _responses_event(state: _State, obj: Mapping[str, Any]) -> None:
    kind = obj.get("type", "")
    response = obj.get("response")
    if isinstance(response, Mapping):
        if isinstance(response.get("model"), str):
            state.model = response["model"]
        if isinstance(response.get("usage"), Mapping):
            state.fields = dict(response["usage"])
            state.saw_usage = True
    if kind.endswith(".delta"):
        state.content_bytes += _utf8_len(obj.get("delta"))
    if kind in ("response.completed", "response.incomplete", "response.failed"):
        state.terminal = True
        state.usage_final = state.saw_usage


def _content_bytes_of_body(obj: Mapping[str, Any], api: str | None) -> int:
    total = 0
    if api == API_MESSAGES:
        for block in obj.get("content") or []:
            if isinstance(block, Mapping):
                total += _utf8_len(block.get("text")) + _utf8_len(block.get("thinking"))
                if "input" in block:
                    total += len(json.dumps(block["input"]))
    elif api == API_CHAT:
        for choice in obj.get("choices") or []:
            message = choice.get("message") if isinstance(choice, Mapping) else None
            if isinstance(message, Mapping):
                total += _utf8_len(message.get("content")) + _utf8_len(message.get("refusal"))
                for call in message.get("tool_calls") or []:
                    fn = call.get("function") if isinstance(call, Mapping) else None
                    if isinstance(fn, Mapping):
                        total += _utf8_len(fn.get("arguments"))
    elif api == API_RESPONSES:
        total += _utf8_len(obj.get("output_text"))
        for item in obj.get("output") or []:
            if isinstance(item, Mapping):
                total += _utf8_len(item.get("arguments"))
                for part in item.get("content") or []:
                    if isinstance(part, Mapping):
                        total += _utf8_len(part.get("text"))
    return total


def _finish(state: _State, api_hint: str | None, transport_complete: bool, fallback_bytes: int,
            request: Any) -> Usage:
    api = state.api or api_hint
    usage = Usage(provider=_PROVIDER_OF_API.get(api) if api else None, api=api, model=state.model)
    if state.saw_usage:
        if api == API_MESSAGES or (api is None and not _looks_openai_usage(state.fields)):
            _anthropic_buckets(state.fields, usage)
        else:
            _openai_buckets(state.fields, usage)
    else:
        usage.flag("usage_missing")
        usage.input_tokens = estimate_request_input_tokens(request)
    if not state.usage_final:
        basis = state.content_bytes if (state.content_bytes or state.api) else fallback_bytes
        estimate = estimate_tokens(basis)
        usage.output_tokens = max(usage.output_tokens, estimate)
        usage.reasoning_tokens = min(usage.reasoning_tokens, usage.output_tokens)
        usage.estimate_basis_bytes = basis
        usage.flag("output_estimated")
    usage.complete = bool(state.terminal and transport_complete)
    if not usage.complete:
        usage.flag("incomplete")
    return usage


class StreamUsageReader:
    """Usage of one server-sent events response, fed as it arrives.

    ``api``: the API the request named (:func:`api_for_path`), or None to
    detect it from the events. ``request``: the parsed request body, used
    only to estimate input when no usage arrives. Call :meth:`feed` with each
    network read (any split), then :meth:`finish` once.
    """

    def __init__(self, api: str | None = None, request: Any = None) -> None:
        self.api_hint = api
        self.request = request
        self.decoder = SSEDecoder()
        self.state = _State()
        self.events = 0

    @property
    def bytes_received(self) -> int:
        """Raw bytes fed so far."""
        return self.decoder.bytes_received

    def feed(self, chunk: bytes) -> None:
        """Take one network read (bytes)."""
        for event in self.decoder.feed(chunk):
            self._event(event)

    def _event(self, event: SSEEvent) -> None:
        self.events += 1
        data = event.data.strip()
        if data == "[DONE]":
            self.state.terminal = True
            return
        try:
            obj = json.loads(data)
        except ValueError:
            return
        if not isinstance(obj, Mapping):
            return
        state = self.state
        if state.api is None:
            state.api = detect_api(obj) or self.api_hint
        if state.api == API_MESSAGES:
            _anthropic_event(state, obj)
        elif state.api == API_CHAT:
            _chat_chunk(state, obj)
        elif state.api == API_RESPONSES:
            _responses_event(state, obj)

    def finish(self, transport_complete: bool = True) -> Usage:
        """End of the response. ``transport_complete``: False when the stream
        was cut (client or upstream disconnected). Returns the :class:`Usage`."""
        for event in self.decoder.close():
            self._event(event)
        return _finish(self.state, self.api_hint, transport_complete, self.bytes_received, self.request)


class JsonUsageReader:
    """Usage of one JSON response body, fed as it arrives (kept whole, up to
    ``max_bytes``; a larger body is not parsed and is metered as cut off).
    Same ``api``/``request`` arguments and methods as :class:`StreamUsageReader`."""

    def __init__(self, api: str | None = None, request: Any = None, max_bytes: int = 64 << 20) -> None:
        self.api_hint = api
        self.request = request
        self.max_bytes = max_bytes
        self.bytes_received = 0
        self._parts: list[bytes] = []
        self._overflow = False

    def feed(self, chunk: bytes) -> None:
        """Take one network read (bytes)."""
        self.bytes_received += len(chunk)
        if self.bytes_received > self.max_bytes:
            self._overflow = True
            self._parts.clear()
        elif not self._overflow:
            self._parts.append(chunk)

    def finish(self, transport_complete: bool = True) -> Usage:
        """End of the body; see :meth:`StreamUsageReader.finish`."""
        state = _State()
        obj = None
        if not self._overflow:
            try:
                obj = json.loads(b"".join(self._parts))
            except ValueError:
                obj = None
        if isinstance(obj, Mapping):
            state.api = detect_api(obj) or self.api_hint
            state.terminal = True
            if isinstance(obj.get("model"), str):
                state.model = obj["model"]
            if isinstance(obj.get("usage"), Mapping):
                state.fields = dict(obj["usage"])
                state.saw_usage = state.usage_final = True
            state.content_bytes = _content_bytes_of_body(obj, state.api)
        return _finish(state, self.api_hint, transport_complete, self.bytes_received, self.request)


class ResponseUsageReader:
    """Pick the reader for a response by its ``Content-Type``:
    ``text/event-stream`` -> :class:`StreamUsageReader`, anything else ->
    :class:`JsonUsageReader`. Same ``feed``/``finish`` methods."""

    def __init__(self, content_type: str | None, api: str | None = None, request: Any = None) -> None:
        is_sse = (content_type or "").split(";", 1)[0].strip().lower() == "text/event-stream"
        self.streaming = is_sse
        self.reader = StreamUsageReader(api, request) if is_sse else JsonUsageReader(api, request)

    @property
    def bytes_received(self) -> int:
        """Raw bytes fed so far."""
        return self.reader.bytes_received

    def feed(self, chunk: bytes) -> None:
        """Take one network read (bytes)."""
        self.reader.feed(chunk)

    def finish(self, transport_complete: bool = True) -> Usage:
        """End of the response; see :meth:`StreamUsageReader.finish`."""
        return self.reader.finish(transport_complete)


def usage_from_json(body: bytes | str, api: str | None = None) -> Usage:
    """A whole JSON response body (bytes or str) -> :class:`Usage`."""
    reader = JsonUsageReader(api)
    reader.feed(body.encode("utf-8") if isinstance(body, str) else body)
    return reader.finish()


def usage_from_sse(chunks: bytes | Iterable[bytes], api: str | None = None, transport_complete: bool = True) -> Usage:
    """A whole SSE stream (bytes, or an iterable of network reads) -> :class:`Usage`."""
    reader = StreamUsageReader(api)
    for chunk in [chunks] if isinstance(chunks, (bytes, bytearray)) else chunks:
        reader.feed(bytes(chunk))
    return reader.finish(transport_complete)


def usage_from_bytes(data: bytes, api: str | None = None) -> Usage:
    """A captured response whose kind is not known: a JSON object body if it
    parses as one, else a server-sent events stream."""
    try:
        obj = json.loads(data)
    except ValueError:
        obj = None
    if isinstance(obj, Mapping):
        return usage_from_json(data, api)
    return usage_from_sse(data, api)


# ---------------------------------------------------- flexible accounting (OCS/GCS 9)

#: Totals keys written to the usage file, in this order, each as ``tco_<key>``.
USAGE_FILE_KEYS = ("requests", "refused", "rate_limited", *TOKEN_FIELDS, "total_tokens", "unpriced_tokens",
                   "cost_usd")


def usage_file_lines(totals: Mapping[str, Any], prefix: str = "tco_") -> list[str]:
    """``key=value`` lines for a Grid Engine job's usage file from the proxy's
    totals (:meth:`execution.metering.proxy.MeteringProxy.totals`).

    OCS/GCS 9 "flexible accounting" (GRIDENGINE.md section 2): lines appended
    to ``$SGE_JOB_SPOOL_DIR/usage`` whose names match the cluster's
    ``reporting_params usage_patterns`` (e.g. ``tco:tco_*``) go into the
    accounting record's ``usage`` and ``qacct -j`` prints them. qacct <= 9.1
    reads them as doubles, so every value written is a plain number: token
    counts as integers, ``cost_usd`` as a fixed-point decimal (omitted when
    the totals have none, i.e. nothing was priced). Keys missing from
    ``totals`` are skipped. Raises ValueError on a non-numeric value.
    """
    lines = []
    for key in USAGE_FILE_KEYS:
        value = totals.get(key)
        if value is None:
            continue
        if isinstance(value, bool):
            raise ValueError(f"{key}: not a number: {value!r}")
        if key == "cost_usd":
            number = Decimal(str(value))
            if not number.is_finite():
                raise ValueError(f"{key}: not a finite number: {value!r}")
            text = format(number, "f")
        elif isinstance(value, int):
            text = str(value)
        else:
            raise ValueError(f"{key}: not an integer: {value!r}")
        lines.append(f"{prefix}{key}={text}")
    return lines


def append_usage_file(path: str | os.PathLike, totals: Mapping[str, Any], prefix: str = "tco_") -> list[str]:
    """Append :func:`usage_file_lines` to the usage file at ``path`` (the
    shepherd's lines already there are kept), one write, then fsync. Returns
    the lines written. Raises OSError if the file cannot be written (it
    belongs to the admin user: call this from an epilog run as that user, or
    give the runner the path of a file the epilog appends)."""
    lines = usage_file_lines(totals, prefix)
    with open(path, "a+b") as fh:
        size = fh.seek(0, os.SEEK_END)
        if size:
            fh.seek(size - 1)
            if fh.read(1) != b"\n":
                fh.write(b"\n")  # append mode: writes always go to the end
        fh.write("".join(line + "\n" for line in lines).encode("ascii"))
        fh.flush()
        os.fsync(fh.fileno())
    return lines
