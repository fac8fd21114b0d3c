"""What the metering proxy changes in a request and its answer on the way through.

Client credential and hop-by-hop headers are dropped, the registered
credential added (execution/metering/proxy.py's module doc, item 2); an OpenAI
chat stream gets ``stream_options.include_usage``, and the usage chunk the
agent did not ask for is removed from what it receives.
"""
from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any, Mapping

from multidict import CIMultiDict

from execution.metering.endpoints import Endpoint
from execution.metering.usage import API_CHAT

if TYPE_CHECKING:
    import aiohttp
    from aiohttp import web

    from execution.metering.usage_readers import ResponseUsageReader

__all__ = ["HOP_BY_HOP", "CLIENT_CREDENTIAL_HEADERS", "UNMETERED_PATH", "UsageChunkHider", "prepare_body",
           "upstream_headers", "downstream_headers", "stream_back"]

HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection",
                        "te", "trailer", "trailers", "transfer-encoding", "upgrade"})
CLIENT_CREDENTIAL_HEADERS = frozenset({"authorization", "x-api-key", "api-key", "x-goog-api-key", "cookie",
                                       "proxy-authorization"})
# Endpoints that generate nothing and bill nothing (Anthropic token counting, model lists): their
# answers carry no usage, and metering them would only add usage_missing estimates to the bill.
UNMETERED_PATH = re.compile(r"/(count_tokens|models)(/[^/]*)?\Z")


class UsageChunkHider:
    """Drop the ``data:`` line of the OpenAI usage chunk (empty ``choices``,
    ``usage`` set) from a stream the agent did not ask usage for; forward every
    other line unchanged. Works on whole lines, so a line split across reads
    is held until complete (events are dispatched at blank lines anyway)."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, chunk: bytes) -> bytes:
        """The complete lines received so far, without the usage chunk's; the rest is held."""
        self._buf += chunk
        # A CR ending this read may be half of a CRLF; forwarding it now is harmless, its LF
        # then comes alone as an empty line, which the agent's decoder joins to it.
        cut = max(self._buf.rfind(b"\n"), self._buf.rfind(b"\r"))
        if cut < 0:
            return b""
        complete = bytes(self._buf[:cut + 1])
        del self._buf[:cut + 1]
        return b"".join(line for line in complete.splitlines(keepends=True) if not self._is_usage_line(line))

    def close(self) -> bytes:
        """What is still held at the end of the stream (unless it is the usage chunk's line)."""
        rest = bytes(self._buf)
        self._buf.clear()
        return b"" if self._is_usage_line(rest) else rest

    @staticmethod
    def _is_usage_line(line: bytes) -> bool:
        if not line.startswith(b"data:") or b'"usage"' not in line:
            return False
        try:
            obj = json.loads(line[5:])
        except ValueError:
            return False
        return isinstance(obj, dict) and obj.get("choices") == [] and isinstance(obj.get("usage"), dict)


def prepare_body(body: bytes, api: str | None, record: dict) -> tuple[Any, bytes, bool]:
    """Parse the request JSON (model, stream) into ``record`` (``model_requested``,
    ``include_usage_added``); add include_usage to an OpenAI chat stream. Returns (parsed or
    None, body to send, whether to hide the usage chunk)."""
    try:
        obj = json.loads(body) if body else None
    except ValueError:
        return None, body, False
    if not isinstance(obj, dict):
        return obj, body, False
    if isinstance(obj.get("model"), str):
        record["model_requested"] = obj["model"]
    if api == API_CHAT and obj.get("stream") is True:
        options = obj.get("stream_options")
        asked = isinstance(options, dict) and options.get("include_usage") is True
        if not asked:
            obj["stream_options"] = {**(options if isinstance(options, dict) else {}), "include_usage": True}
            record["include_usage_added"] = True
            return obj, json.dumps(obj).encode("utf-8"), True
    return obj, body, False


def upstream_headers(incoming: Mapping[str, str], endpoint: Endpoint, secret: str | None,
                     provider: str | None = None) -> CIMultiDict:
    """The headers sent upstream: ``incoming`` without hop-by-hop, connection-named and client
    credential headers, ``accept-encoding: identity``, and ``secret`` (the registered
    credential, if any) in ``endpoint``'s header for ``provider``."""
    headers: CIMultiDict = CIMultiDict()
    connection_named = {t.strip().lower() for t in incoming.get("connection", "").split(",") if t.strip()}
    for name, value in incoming.items():
        low = name.lower()
        if low in HOP_BY_HOP or low in CLIENT_CREDENTIAL_HEADERS or low in connection_named \
                or low in ("host", "content-length", "accept-encoding", "expect"):
            continue
        headers.add(name, value)
    headers["accept-encoding"] = "identity"
    if secret is not None:
        headers.update(endpoint.credential_headers(secret, provider))
    return headers


def downstream_headers(upstream: Mapping[str, str], rewritten: bool) -> CIMultiDict:
    """The headers sent back to the agent: ``upstream``'s without hop-by-hop headers, and
    without content-length/encoding where the body changed (decompressed, or ``rewritten`` by
    the :class:`UsageChunkHider`)."""
    headers: CIMultiDict = CIMultiDict()
    encoded = upstream.get("content-encoding", "identity").lower() not in ("", "identity")
    for name, value in upstream.items():
        low = name.lower()
        if low in HOP_BY_HOP:
            continue
        # aiohttp decompressed the body, or the hider shortened it: the length no longer holds.
        if low == "content-length" and (encoded or rewritten):
            continue
        if low == "content-encoding" and encoded:
            continue
        headers.add(name, value)
    return headers


async def stream_back(upstream: aiohttp.ClientResponse, response: web.StreamResponse,
                      reader: ResponseUsageReader | None, hider: UsageChunkHider | None) -> bool:
    """Copy the ``upstream`` answer to the agent's ``response`` as it arrives, feeding each chunk
    to ``reader`` (the usage reader, or None) and through ``hider`` (or None). Returns True if
    the agent went away. Raises aiohttp's client errors when the upstream cuts its answer."""
    async for chunk in upstream.content.iter_any():
        if reader is not None:
            reader.feed(chunk)
        out = hider.feed(chunk) if hider is not None else chunk
        if not out:
            continue
        try:
            await response.write(out)
        except ConnectionError:
            return True
    if hider is not None:
        rest = hider.close()
        if rest:
            try:
                await response.write(rest)
            except ConnectionError:
                return True
    return False
