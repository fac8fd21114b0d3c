"""The demo's web server trusts no X-Forwarded-For (attack review, session 4, finding 5).

scripts/services started uvicorn with its default ``--proxy-headers`` and
``FORWARDED_ALLOW_IPS=127.0.0.1``: any local account, connecting from
127.0.0.1 like everyone on the demo, could set X-Forwarded-For and fail logins
under made-up addresses (never locked out) or a victim's. The test stack
starts uvicorn with the same options as scripts/services (checked below), and
the lockout must count the real address whatever the header says.
"""
from __future__ import annotations

import os
import re
import urllib.error
import urllib.parse
import urllib.request
from http.cookiejar import CookieJar

import pytest
from django.conf import settings

from tests.support.paths import REPO

pytestmark = pytest.mark.integration


def options_between(text: str, start: str, end: str) -> set[str]:
    """The ``--option`` words of ``text`` between the markers ``start`` and ``end``."""
    at = text.index(start)
    return set(re.findall(r"--[a-z][a-z-]+", text[at:text.index(end, at)]))


def test_the_test_stack_starts_uvicorn_as_the_demo_does():
    demo = options_between((REPO / "scripts" / "services").read_text(), "start_one web", "start_one worker")
    stack = options_between((REPO / "tests" / "support" / "stack.py").read_text(), 'self.start("web"', 'self.start("worker"')
    assert "--no-proxy-headers" in demo
    assert demo - {"--host", "--port"} == stack - {"--host", "--port"}


def test_a_forged_forwarded_address_neither_escapes_nor_moves_the_demo_lockout(live_stack):
    jar = CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar),
                                         urllib.request.HTTPErrorProcessor())

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args, **kwargs):
            return None

    opener.add_handler(NoRedirect())

    def attempt(username: str, password: str, forged: str) -> int:
        opener.open(live_stack.url + "/login/", timeout=30).read()
        csrf = next(c.value for c in jar if c.name == "csrftoken")
        body = urllib.parse.urlencode({"username": username, "password": password, "csrfmiddlewaretoken": csrf,
                                       "next": "/"}).encode()
        request = urllib.request.Request(live_stack.url + "/login/", data=body, headers={
            "X-Forwarded-For": forged, "Referer": live_stack.url + "/login/"})
        try:
            return opener.open(request, timeout=30).status
        except urllib.error.HTTPError as exc:
            return exc.code

    limit = settings.AXES_FAILURE_LIMIT
    statuses = [attempt(f"nobody-{n}", "wrong", f"203.0.113.{n}") for n in range(1, limit + 1)]
    assert statuses[-1] == 429 and set(statuses[:-1]) == {200}, statuses
    # The right password under yet another forged address: the real address (127.0.0.1) is locked.
    assert attempt("admin", os.environ["TCO_ADMIN_PASSWORD"], "203.0.113.250") == 429
    from axes.models import AccessAttempt

    assert set(AccessAttempt.objects.values_list("ip_address", flat=True)) == {"127.0.0.1"}
