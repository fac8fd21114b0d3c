"""Helpers the page views share: the styled refusal page and integer query parameters."""
from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from dashboards.core import audit


def int_param(request: HttpRequest, name: str, default: int = 1) -> int:
    try:
        return max(1, int(request.GET.get(name, default)))
    except ValueError:
        return default


def refused(request: HttpRequest, message: str, *, action: str = "") -> HttpResponse:
    """403 with the reason; a refused POST of a launch or control ``action`` is audited too."""
    if action and request.method == "POST":
        audit.audit(user=request.user, action=action, target="", params={"status": "refused", "path": request.path},
                        ok=False, result=f"refused: {message}")
    return render(request, "dashboards/launch_refused.html", {"message": message}, status=403)
