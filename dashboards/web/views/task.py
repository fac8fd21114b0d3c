"""The task (agent) page, its live log tail and its output files."""
from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render

from dashboards.core import scope, spool_files
from dashboards.live import task
from dashboards.models import Task


@login_required
def task_page(request: HttpRequest, task_id: int) -> HttpResponse:
    try:
        detail = task.task_detail(request.user, task_id)
    except Task.DoesNotExist:
        raise Http404("no such task") from None
    return render(request, "dashboards/agent.html", {"detail": detail})


@login_required
def task_logs(request: HttpRequest, task_id: int) -> JsonResponse:
    """The live tail of a task's stdout and stderr (JSON, ``selectors.task_logs``), polled by the agent page."""
    try:
        return JsonResponse(task.task_logs(request.user, task_id))
    except Task.DoesNotExist:
        raise Http404("no such task") from None


@login_required
def task_output(request: HttpRequest, task_id: int, name: str) -> HttpResponse:
    """One file of the agent's work directory, as text (the last ``TCO_LOG_VIEW_CAP`` bytes)."""
    try:
        found = spool_files.task_output_file(scope.task_for(request.user, task_id), name)
    except Task.DoesNotExist:
        raise Http404("no such task") from None
    if found["error"]:
        raise Http404(found["error"])
    response = HttpResponse(found["text"], content_type="text/plain; charset=utf-8")
    if found["truncated"]:
        response["X-TCO-Truncated"] = f"last {len(found['text'].encode())} of {found['size']} bytes"
    return response
