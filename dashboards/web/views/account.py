"""The user's API token page and the health check."""
from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods

from dashboards.core import accounts
from dashboards.models import ApiToken


@login_required
@require_http_methods(["GET", "POST"])
def token_page(request: HttpRequest) -> HttpResponse:
    """The user's API token: shown once, in the answer to the POST that made it; POST ``action=rotate|revoke``.

    The new key is rendered straight into that answer (never kept in the
    session, which the database stores in the clear).
    """
    new_key = None
    if request.method == "POST":
        if request.POST.get("action") == "revoke":
            accounts.api_token_revoke(user=request.user)
            return redirect("token")
        new_key = accounts.api_token_rotate(user=request.user).key
    token = ApiToken.objects.filter(user=request.user).first()
    response = render(request, "dashboards/token.html", {"token": token, "new_key": new_key})
    response["Cache-Control"] = "no-store"
    return response


def healthz(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok", content_type="text/plain")
