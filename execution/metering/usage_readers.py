"""Readers: a model API's JSON body or server-sent events stream, fed as it arrives, to :class:`Usage`.

The formats and the rules (cumulative Anthropic stream usage, the OpenAI usage
chunk, estimates when the usage did not arrive) are in execution/metering/usage.py's
module doc. Standard library only.
"""
from __future__ import annotations

import json
from typing import Any, Iterable, Mapping

from execution.metering.sse import SSEDecoder, SSEEvent
from execution.metering.usage import (API_CHAT, API_MESSAGES, API_RESPONSES, PROVIDER_OF_API, Usage, anthropic_buckets,
                                      detect_api, estimate_request_input_tokens, estimate_tokens, openai_buckets,
                                      openai_usage_api, utf8_len)

__all__ = ["StreamUsageReader", "JsonUsageReader", "ResponseUsageReader", "usage_from_json", "usage_from_sse",
           "usage_from_bytes"]


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
        self.response_id: str | None = None  # the answer's id (OpenTelemetry's gen_ai.response.id)
        self.finish_reasons: list[str] = []  # why generation stopped, per choice (gen_ai.response.finish_reasons)

    def answer(self, obj: Mapping[str, Any]) -> None:
        """Note the answer's ``id`` from a response object or stream chunk (the first one wins)."""
        if self.response_id is None and isinstance(obj.get("id"), str):
            self.response_id = obj["id"][:256]

    def finished_because(self, reason: Any) -> None:
        """Note one finish reason (text; others ignored), each once."""
        if isinstance(reason, str) and reason and reason not in self.finish_reasons and len(self.finish_reasons) < 16:
            self.finish_reasons.append(reason[:64])


def _choice_reasons(state: _State, obj: Mapping[str, Any]) -> None:
    for choice in obj.get("choices") or []:
        if isinstance(choice, Mapping):
            state.finished_because(choice.get("finish_reason"))


def _anthropic_event(state: _State, obj: Mapping[str, Any]) -> None:
    kind = obj.get("type")
    if kind == "message_start":
        message = obj.get("message")
        if isinstance(message, Mapping):
            state.answer(message)
            if isinstance(message.get("model"), str):
                state.model = message["model"]
            _merge_usage(state, message.get("usage"))
    elif kind == "message_delta":
        _merge_usage(state, obj.get("usage"))
        delta = obj.get("delta")
        if isinstance(delta, Mapping) and delta.get("stop_reason") is not None:
            state.finished_because(delta["stop_reason"])
            if state.saw_usage:
                state.usage_final = True
    elif kind == "content_block_delta":
        delta = obj.get("delta")
        if isinstance(delta, Mapping):
            for key in ("text", "partial_json", "thinking"):
                state.content_bytes += utf8_len(delta.get(key))
    elif kind == "content_block_start":
        block = obj.get("content_block")
        if isinstance(block, Mapping):
            state.content_bytes += utf8_len(block.get("text")) + utf8_len(block.get("thinking"))
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
    state.answer(obj)
    _choice_reasons(state, obj)
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
                    state.content_bytes += utf8_len(delta.get(key))
                calls = delta.get("tool_calls")
                if isinstance(calls, list):
                    for call in calls:
                        fn = call.get("function") if isinstance(call, Mapping) else None
                        if isinstance(fn, Mapping):
                            state.content_bytes += utf8_len(fn.get("arguments")) + utf8_len(fn.get("name"))
    usage = obj.get("usage")
    if isinstance(usage, Mapping):  # null in every chunk but the last; keep looking
        state.fields = dict(usage)
        state.saw_usage = state.usage_final = True


def _responses_event(state: _State, obj: Mapping[str, Any]) -> None:
    kind = obj.get("type", "")
    response = obj.get("response")
    if isinstance(response, Mapping):
        state.answer(response)
        if isinstance(response.get("model"), str):
            state.model = response["model"]
        if isinstance(response.get("usage"), Mapping):
            state.fields = dict(response["usage"])
            state.saw_usage = True
    if kind.endswith(".delta"):
        state.content_bytes += utf8_len(obj.get("delta"))
    if kind in ("response.completed", "response.incomplete", "response.failed"):
        state.finished_because(_responses_reason(response))
        state.terminal = True
        state.usage_final = state.saw_usage


def _responses_reason(response: Any) -> str | None:
    """A Responses API answer's finish reason: ``incomplete_details.reason`` if given, else its ``status``."""
    if not isinstance(response, Mapping):
        return None
    details = response.get("incomplete_details")
    if isinstance(details, Mapping) and isinstance(details.get("reason"), str):
        return details["reason"]
    return response.get("status") if isinstance(response.get("status"), str) else None


def _content_bytes_of_body(obj: Mapping[str, Any], api: str | None) -> int:
    total = 0
    if api == API_MESSAGES:
        for block in obj.get("content") or []:
            if isinstance(block, Mapping):
                total += utf8_len(block.get("text")) + utf8_len(block.get("thinking"))
                if "input" in block:
                    total += len(json.dumps(block["input"]))
    elif api == API_CHAT:
        for choice in obj.get("choices") or []:
            message = choice.get("message") if isinstance(choice, Mapping) else None
            if isinstance(message, Mapping):
                total += utf8_len(message.get("content")) + utf8_len(message.get("refusal"))
                for call in message.get("tool_calls") or []:
                    fn = call.get("function") if isinstance(call, Mapping) else None
                    if isinstance(fn, Mapping):
                        total += utf8_len(fn.get("arguments"))
    elif api == API_RESPONSES:
        total += utf8_len(obj.get("output_text"))
        for item in obj.get("output") or []:
            if isinstance(item, Mapping):
                total += utf8_len(item.get("arguments"))
                for part in item.get("content") or []:
                    if isinstance(part, Mapping):
                        total += utf8_len(part.get("text"))
    return total


def _finish(state: _State, api_hint: str | None, transport_complete: bool, fallback_bytes: int,
            request: Any) -> Usage:
    api = state.api or api_hint
    usage = Usage(provider=PROVIDER_OF_API.get(api) if api else None, api=api, model=state.model)
    if state.saw_usage:
        if api == API_MESSAGES or (api is None and not openai_usage_api(state.fields)):
            anthropic_buckets(state.fields, usage)
        else:
            openai_buckets(state.fields, usage)
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
    def response_id(self) -> str | None:
        """The answer's id (``id`` of the message, chunk or response), once seen; else None."""
        return self.state.response_id

    @property
    def finish_reasons(self) -> list[str]:
        """Why generation stopped (``stop_reason``, ``finish_reason`` per choice, a response's
        status), as seen so far."""
        return list(self.state.finish_reasons)

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
        self.response_id: str | None = None  # set by finish(), as StreamUsageReader's
        self.finish_reasons: list[str] = []

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
            state.answer(obj)
            if state.api == API_RESPONSES:
                state.finished_because(_responses_reason(obj))
            else:
                state.finished_because(obj.get("stop_reason"))
                _choice_reasons(state, obj)
            if isinstance(obj.get("model"), str):
                state.model = obj["model"]
            if isinstance(obj.get("usage"), Mapping):
                state.fields = dict(obj["usage"])
                state.saw_usage = state.usage_final = True
            state.content_bytes = _content_bytes_of_body(obj, state.api)
        self.response_id, self.finish_reasons = state.response_id, list(state.finish_reasons)
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

    @property
    def response_id(self) -> str | None:
        """The answer's id (:attr:`StreamUsageReader.response_id`; a JSON body's after :meth:`finish`)."""
        return self.reader.response_id

    @property
    def finish_reasons(self) -> list[str]:
        """Why generation stopped (:attr:`StreamUsageReader.finish_reasons`)."""
        return list(self.reader.finish_reasons)


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
