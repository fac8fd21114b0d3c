"""The one CSV writer of tco's exports (bills, a campaign's costliest tasks, the audit log).

A spreadsheet opening a CSV runs a cell that starts with ``=``, ``+``, ``-``, ``@``, a tab or a
carriage return as a formula (``=HYPERLINK(...)``, DDE). Cells come from agents (verdicts),
users (names) and other cluster users (job names), so every text cell that starts so gets a
leading ``'`` and is read as text (OWASP, "CSV Injection":
https://owasp.org/www-community/attacks/CSV_Injection). A cell that is a plain number
(``-0.5``, ``+3``, ``-1e3``) is left as it is: it is data, not a formula.
"""
from __future__ import annotations

import csv
import re
from typing import Any, Iterable

#: The first characters that make a spreadsheet read a cell as a formula.
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
_PLAIN_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?\Z")


def safe_cell(value: Any) -> Any:
    """``value`` as written to a CSV export: a text that a spreadsheet would run as a formula
    with ``'`` before it; numbers (and texts that are plain decimal numbers) unchanged."""
    if isinstance(value, str) and value.startswith(FORMULA_STARTS) and not _PLAIN_NUMBER.match(value):
        return "'" + value
    return value


class SafeWriter:
    """``csv.writer``'s ``writerow``/``writerows`` with every cell through :func:`safe_cell`."""

    def __init__(self, stream: Any, **options: Any) -> None:
        self._writer = csv.writer(stream, **options)

    def writerow(self, row: Iterable[Any]) -> Any:
        """Write one row; returns what the stream's ``write`` returned (the line, for streaming)."""
        return self._writer.writerow([safe_cell(v) for v in row])

    def writerows(self, rows: Iterable[Iterable[Any]]) -> None:
        for row in rows:
            self.writerow(row)


def writer(stream: Any, **options: Any) -> SafeWriter:
    """A CSV writer on ``stream`` (anything with ``write(str)``; ``options`` as ``csv.writer``'s)
    that makes formula cells text. Every CSV export of tco writes through one."""
    return SafeWriter(stream, **options)


class _Echo:
    """A stream whose ``write`` returns the line: lets a writer feed a streaming response."""

    def write(self, value: str) -> str:
        return value


def csv_response(filename: str, header: Iterable[Any], rows: Iterable[Iterable[Any]], *, stream: bool = False):
    """A ``text/csv; charset=utf-8`` download of ``header`` then ``rows``, every cell through
    :func:`safe_cell`. ``stream=True``: a ``StreamingHttpResponse`` that consumes ``rows``
    lazily (a query's ``iterator()`` keeps memory flat for any number of rows); else one
    ``HttpResponse``. ``filename``: the attachment's name (no quotes)."""
    from django.http import HttpResponse, StreamingHttpResponse

    out = SafeWriter(_Echo())

    def lines():
        yield out.writerow(header)
        for row in rows:
            yield out.writerow(row)

    content_type = "text/csv; charset=utf-8"
    response = (StreamingHttpResponse(lines(), content_type=content_type) if stream
                else HttpResponse("".join(lines()), content_type=content_type))
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response


__all__ = ["FORMULA_STARTS", "safe_cell", "SafeWriter", "writer", "csv_response"]
