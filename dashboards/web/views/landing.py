"""The landing page's fragment (its tiles and campaign rows) for static/js/landing.js to refresh."""
from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.template import engines


@login_required
def landing_fragment(request: HttpRequest) -> HttpResponse:
    """``{% landing %}`` alone, for the request's user and URL query (HTML)."""
    template = engines["django"].from_string("{% load landing %}{% landing %}")
    return HttpResponse(template.render({}, request))
