"""Web-side protections: a Content-Security-Policy header on every answer; login rate limits;
WebSocket handshakes from the page's own origin only.

A locked-out login (django-axes) is answered by ``lockout_response``: JSON
``{"detail": ...}`` with ``Retry-After`` under ``/api/``, the styled page
elsewhere.

Django 5.2 has no CSP support of its own (it arrives in 6.0); the policy is
one setting, ``TCO_CONTENT_SECURITY_POLICY`` (the header's value, as in
https://www.w3.org/TR/CSP3/), and an empty value sends none.
"""
from __future__ import annotations

from typing import Callable

from axes.backends import AxesStandaloneBackend
from axes.handlers.database import AxesDatabaseHandler
from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render


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


class LoginAttemptsHandler(AxesDatabaseHandler):
    """django-axes' database handler, with a reset on success that never clears others' failures.

    Logins are locked per user name and, separately, per client address
    (``AXES_LOCKOUT_PARAMETERS``). axes' own reset on a good login deletes
    every attempt that matches either parameter: all failures from the
    address, whichever account they were against. So an attacker with an
    account of their own could guess admin's password without end, 5 guesses
    then a good login of their own account, over and over (issue 23, finding 3).
    Here a good login deletes only the attempts of that user name from that
    address: the user's own mistakes. Failures against other accounts, and
    this user's failures from other addresses, stay counted until they expire
    (``AXES_COOLOFF_TIME``).
    """

    def reset_user_attempts(self, request: HttpRequest, credentials: dict | None = None) -> int:
        from axes.helpers import get_client_username
        from axes.models import AccessAttempt

        username = get_client_username(request, credentials)
        if not username:
            return 0
        count, _ = AccessAttempt.objects.filter(username=username, ip_address=request.axes_ip_address).delete()
        return count


def lockout_response(request: HttpRequest, original_response: HttpResponse | None = None,
                     credentials: dict | None = None) -> HttpResponse:
    """django-axes' ``AXES_LOCKOUT_CALLABLE``: the answer to a locked-out login attempt.

    Both answers are HTTP 429 with ``Retry-After`` = the cool-off in whole
    seconds (``AXES_COOLOFF_TIME``; axes restarts it at every attempt during
    the lockout, RFC 9110 section 10.2.3). Under ``/api/`` (``POST /api/token/``)
    the body is JSON ``{"detail": "too many failed attempts; ..."}`` as every
    other API error; elsewhere it is the page ``AXES_LOCKOUT_TEMPLATE``.
    """
    from axes.helpers import get_client_username, get_cool_off, get_failure_limit

    cool_off = get_cool_off(request)
    seconds = int(cool_off.total_seconds()) if cool_off else None
    if request.path.startswith("/api/"):
        detail = "too many failed attempts for this user name or from this address; try again later"
        if seconds is not None:
            detail += f" (in {seconds} s)"
        response: HttpResponse = JsonResponse({"detail": detail}, status=429)
    else:
        context = {"failure_limit": get_failure_limit(request, credentials),
                   "username": get_client_username(request, credentials) or "", "cooloff_timedelta": cool_off}
        response = render(request, settings.AXES_LOCKOUT_TEMPLATE, context, status=429)
    if seconds is not None:
        response["Retry-After"] = str(seconds)
    return response


_DEFAULT_PORTS = {"http": 80, "https": 443}


def _origin_key(scheme: str, hostname: str | None, port: int | None) -> tuple[str, str, int] | None:
    if scheme not in _DEFAULT_PORTS or not hostname:
        return None
    return scheme, hostname.lower().rstrip("."), port or _DEFAULT_PORTS[scheme]


def websocket_origin_allowed(origin: bytes | None, host: bytes | None) -> bool:
    """True if a WebSocket handshake's ``Origin`` is the page's own origin: the same scheme,
    host *and port* as the ``Host`` the browser connected to (whose name ``ALLOWED_HOSTS``
    allows), or one of ``CSRF_TRUSTED_ORIGINS`` exactly. No ``Origin`` (not a browser's
    handshake from a page) is refused too.

    Channels' ``AllowedHostsOriginValidator`` compares the host name only, so a page any
    local user serves on another port of the same host (http://127.0.0.1:9999) could open
    the dashboard's sockets with the signed-in user's cookies (cross-site WebSocket
    hijacking); browsers send cookies to every port of a host (RFC 6265 section 8.5).
    The origin tuple is that of RFC 6454 (scheme, host, port; default ports 80/443)."""
    from urllib.parse import urlsplit

    from django.http.request import validate_host

    if not origin or not host:
        return False
    try:
        parsed = urlsplit(origin.decode("ascii"))
        page = _origin_key(parsed.scheme.lower(), parsed.hostname, parsed.port)
        for trusted in settings.CSRF_TRUSTED_ORIGINS:
            t = urlsplit(trusted)
            if page is not None and page == _origin_key(t.scheme.lower(), t.hostname, t.port):
                return True
        served = urlsplit("//" + host.decode("ascii"))
        target = _origin_key(parsed.scheme.lower(), served.hostname, served.port)
    except (UnicodeDecodeError, ValueError):  # a port that is not a number, non-ASCII bytes
        return False
    if page is None or target is None or page != target:
        return False
    return validate_host(target[1], settings.ALLOWED_HOSTS)


class SameOriginWebsocketValidator:
    """ASGI middleware for the ``websocket`` protocol: the handshake goes on only if
    :func:`websocket_origin_allowed`; otherwise it is denied (HTTP 403 to the browser)."""

    def __init__(self, application) -> None:
        self.application = application

    async def __call__(self, scope, receive, send):
        from channels.security.websocket import WebsocketDenier

        headers = dict(scope.get("headers") or [])
        if websocket_origin_allowed(headers.get(b"origin"), headers.get(b"host")):
            return await self.application(scope, receive, send)
        return await WebsocketDenier()(scope, receive, send)
