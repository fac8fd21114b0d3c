"""The assistant's answer on tco's own pages: "why is this pending?" for the user signed in.

The same function the MCP tool ``why_pending`` calls (``views.why_pending``), as
the user's session sees it, rendered as HTML: the whole page, or with
``?fragment=1`` the answer alone, which the task page and the triage rows load
in place. The page also says how to ask the same from an MCP client.
"""
from __future__ import annotations

import datetime as dt
import json

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render

from . import views


def _facts(facts: dict) -> list[tuple[str, str]]:
    """The facts as (name, readable JSON) pairs, in the answer's order."""
    return [(name.replace("_", " "), json.dumps(value, indent=1, sort_keys=True, default=str))
            for name, value in facts.items()]


@login_required
def why_pending_page(request: HttpRequest, task_id: int | None = None) -> HttpResponse:
    """Why a task waits: ``task_id`` (tco's id, as in /tasks/<id>/), else ``?task=`` as the pages
    write it (``1128.17``, or a job number: its first waiting task). 404 for a task the user may
    not see, as for one that does not exist."""
    try:
        answer = views.why_pending(request.user, task_id if task_id is not None else request.GET.get("task"))
    except views.Refused:
        raise Http404("no such task") from None
    status_at = answer.get("status_at")
    context = {"answer": answer, "task": answer["task"], "facts": _facts(answer["facts"]),
               "fragment": bool(request.GET.get("fragment")),
               "status_at": dt.datetime.fromisoformat(status_at.replace("Z", "+00:00")) if status_at else None}
    template = "dashboards/why_pending_answer.html" if context["fragment"] else "dashboards/why_pending.html"
    response = render(request, template, context)
    response["Cache-Control"] = "no-store"
    return response
