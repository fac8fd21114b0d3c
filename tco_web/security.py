"""Web-side protections: a Content-Security-Policy header on every answer; login rate limits.

Django 5.2 has no CSP support of its own (it arrives in 6.0); the policy is
one setting, ``TCO_CONTENT_SECURITY_POLICY`` (the header's value, as in
https://www.w3.org/TR/CSP3/), and an empty value sends none.
"""
from __future__ import annotations

from typing import Callable

from axes.backends import AxesStandaloneBackend
from django.conf import settings
from django.http import HttpRequest, HttpResponse


class ContentSecurityPolicyMiddleware:
    """Adds ``Content-Security-Policy: <TCO_CONTENT_SECURITY_POLICY>`` unless a view set its own."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        policy = getattr(settings, "TCO_CONTENT_SECURITY_POLICY", "")
        if policy and "Content-Security-Policy" not in response:
            response["Content-Security-Policy"] = policy
        return response


class LoginRateLimitBackend(AxesStandaloneBackend):
    """django-axes' lockout check, for logins that come with a web request.

    Every login over HTTP (the login page, the admin's, ``POST /api/token/``)
    passes its request and is counted and refused as axes decides. A call
    without a request (a management command, the test client's ``login``)
    has no address to count and is not a brute-force path: it is left to
    the next backend instead of failing as ``AxesStandaloneBackend`` would.
    """

    def authenticate(self, request, username=None, password=None, **kwargs):
        if request is None:
            return None
        return super().authenticate(request, username=username, password=password, **kwargs)
