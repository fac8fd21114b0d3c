"""Server-sent events, decoded incrementally (the WHATWG HTML standard, "Server-sent events",
event stream interpretation). Standard library only; bytes in, :class:`SSEEvent` out.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["SSEEvent", "SSEDecoder"]


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
