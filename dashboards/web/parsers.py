"""The API's JSON parser: a request body nested too deeply is a 400, not a 500 with a traceback.

DRF's ``JSONParser`` lets ``RecursionError`` out of ``json.load``: a body of
100,000 ``[`` answered 500 and wrote a ~70-line traceback to the web log per
request, so anyone (``POST /api/token/`` needs no login) could grow the log.
Like the launch inputs (``dashboards.launch.inputs.json_loads_bounded``), the
API refuses JSON nested deeper than ``limits.INPUT_MAX_DEPTH`` with a message.
Kept apart from the views: DRF imports it while ``rest_framework.views``
itself loads (``REST_FRAMEWORK["DEFAULT_PARSER_CLASSES"]``).
"""
from __future__ import annotations

from typing import Any

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

from dashboards.core import limits
from dashboards.launch.inputs import json_depth


def _too_deep() -> ParseError:
    return ParseError(f"JSON parse error - the body nests deeper than {limits.INPUT_MAX_DEPTH} levels "
                      "(arrays and objects)")


class BoundedJSONParser(JSONParser):
    """``application/json`` bodies, refusing nesting deeper than ``limits.INPUT_MAX_DEPTH``.

    ``parse`` returns what ``JSONParser.parse`` does (the decoded body: dict,
    list or scalar). Raises ``ParseError`` (DRF answers 400, Django logs one
    "Bad Request" line, no traceback) for a body that is not JSON (as
    ``JSONParser``), that nests so deep the decoder hits Python's recursion
    limit (``RecursionError``), or that nests deeper than the limit.
    """

    def parse(self, stream, media_type=None, parser_context=None) -> Any:
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise _too_deep() from None
        if json_depth(data) > limits.INPUT_MAX_DEPTH:
            raise _too_deep()
        return data
