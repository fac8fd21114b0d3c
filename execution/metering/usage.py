"""Token usage of model API responses: :class:`Usage`, its buckets, and which API a body is.

Standard library only. Everything here is pure. The readers that turn a JSON
body or a server-sent events stream into a :class:`Usage` are in
execution/metering/usage_readers.py (events decoded by sse.py); the usage file
for Grid Engine's flexible accounting is usage_file.py.

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
import math
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Mapping

from execution.spool.contract import TOKEN_BUCKETS

__all__ = [
    "BYTES_PER_TOKEN", "FLAGS", "Usage", "usage_from_usage_object", "detect_api", "api_for_path", "estimate_tokens",
    "estimate_request_input_tokens", "anthropic_buckets", "openai_buckets", "openai_usage_api", "utf8_len",
    "ANTHROPIC", "OPENAI", "API_MESSAGES", "API_CHAT", "API_RESPONSES", "PROVIDER_OF_API",
]

BYTES_PER_TOKEN = 4

#: Every flag this module sets (DESIGN.md's list, the part that is about usage).
FLAGS = ("incomplete", "output_estimated", "usage_missing", "ttl_split_missing", "ttl_split_incomplete")

ANTHROPIC = "anthropic"
OPENAI = "openai"
API_MESSAGES = "messages"
API_CHAT = "chat.completions"
API_RESPONSES = "responses"
PROVIDER_OF_API = {API_MESSAGES: ANTHROPIC, API_CHAT: OPENAI, API_RESPONSES: OPENAI}


def estimate_tokens(nbytes: int) -> int:
    """Tokens for ``nbytes`` bytes of text at :data:`BYTES_PER_TOKEN` bytes a token, rounded up."""
    return math.ceil(max(0, nbytes) / BYTES_PER_TOKEN)


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


def anthropic_buckets(fields: Mapping[str, Any], usage: Usage) -> None:
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


def openai_buckets(fields: Mapping[str, Any], usage: Usage) -> None:
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


def openai_usage_api(fields: Mapping[str, Any]) -> str | None:
    """The OpenAI API a bare ``usage`` object's keys name (``prompt_tokens``: chat completions,
    ``*_tokens_details``: responses), or None (Anthropic's, or unknown)."""
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
    api = api or openai_usage_api(fields) or API_MESSAGES
    usage = Usage(provider=PROVIDER_OF_API.get(api), api=api, model=model)
    if api == API_MESSAGES:
        anthropic_buckets(fields, usage)
    else:
        openai_buckets(fields, usage)
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
        return openai_usage_api(usage) or (API_MESSAGES if "input_tokens" in usage else None)
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


def utf8_len(text: Any) -> int:
    """UTF-8 bytes of ``text`` if it is a str, else 0."""
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
            total += utf8_len(item)
        elif isinstance(item, Mapping):
            stack.extend(v for k, v in item.items() if k not in _SKIPPED_KEYS)
        elif isinstance(item, list):
            stack.extend(item)
    return estimate_tokens(total)
