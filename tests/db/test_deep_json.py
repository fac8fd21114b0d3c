"""JSON nested past Python's recursion limit, sent to the API or the urgent launch form, is a 400 (or a
form error) with a message, never a 500 with a RecursionError traceback in the web log (security
finding: 100,000 "[" in ``POST /api/token/``, no login needed, wrote ~70 log lines per 30 ms request)."""
from __future__ import annotations

import logging

import pytest
from django.middleware.csrf import get_token
from django.test import RequestFactory
from rest_framework.test import APIClient

from dashboards.core import limits
from dashboards.models import AgentDefinition, Campaign, Team

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fast_passwords", "locmem_cache")]

#: The attack's body, and one nested just past the limit but within Python's recursion limit (it
#: decodes; the old code then failed on a list where it wanted an object).
DEEP_BODIES = {"100000 [": "[" * 100_000, "limit+1": "[" * (limits.INPUT_MAX_DEPTH + 1) + "]" * (limits.INPUT_MAX_DEPTH + 1)}


def _no_traceback_and_at_most_one_line(caplog) -> None:
    records = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert all(r.exc_info is None for r in records), [r.getMessage() for r in records]
    text = caplog.text
    assert "Traceback" not in text and "RecursionError" not in text, text[:300]
    assert len(records) <= 1, [r.getMessage() for r in records]


@pytest.mark.parametrize("body", DEEP_BODIES.values(), ids=DEEP_BODIES.keys())
def test_an_anonymous_deep_body_to_the_token_endpoint_is_a_400_without_a_traceback(role_users, caplog, body):
    caplog.set_level(logging.INFO)
    api = APIClient(raise_request_exception=False)
    response = api.post("/api/token/", body, content_type="application/json")
    assert response.status_code == 400, response.status_code
    assert f"deeper than {limits.INPUT_MAX_DEPTH} levels" in response.json()["detail"]
    _no_traceback_and_at_most_one_line(caplog)


@pytest.mark.parametrize("body", DEEP_BODIES.values(), ids=DEEP_BODIES.keys())
def test_a_signed_in_users_deep_api_post_is_a_400_without_a_traceback(role_users, caplog, body):
    """A browser session's POST (CSRF cookie and header, as a page's script sends) has its body
    parsed by the session authentication's CSRF check, on every API route."""
    caplog.set_level(logging.INFO)
    api = APIClient(enforce_csrf_checks=True, raise_request_exception=False)
    api.force_login(role_users["viewer"])
    token = get_token(RequestFactory().get("/"))
    api.cookies["csrftoken"] = token
    response = api.post("/api/me/", body, content_type="application/json", HTTP_X_CSRFTOKEN=token)
    assert response.status_code == 400, response.status_code
    assert f"deeper than {limits.INPUT_MAX_DEPTH} levels" in response.json()["detail"]
    _no_traceback_and_at_most_one_line(caplog)


@pytest.mark.parametrize("body", DEEP_BODIES.values(), ids=DEEP_BODIES.keys())
def test_a_token_callers_deep_post_to_the_token_endpoint_is_a_400(role_users, caplog, body):
    from dashboards.core.accounts import api_token_rotate

    caplog.set_level(logging.INFO)
    api = APIClient(raise_request_exception=False)
    api.credentials(HTTP_AUTHORIZATION=f"Token {api_token_rotate(user=role_users['viewer']).key}")
    response = api.post("/api/token/", body, content_type="application/json")
    assert response.status_code == 400, response.status_code
    _no_traceback_and_at_most_one_line(caplog)


@pytest.mark.parametrize("text", DEEP_BODIES.values(), ids=DEEP_BODIES.keys())
def test_a_deep_urgent_input_is_a_form_error_and_no_campaign(as_user, sent, caplog, text):
    caplog.set_level(logging.INFO)
    client = as_user("urgent")
    client.raise_request_exception = False
    response = client.post("/ops/urgent/", {
        "agent_definition": AgentDefinition.objects.get(name="demo-agent").pk,
        "team": Team.objects.get(project="research").pk, "queue": "agent.q", "seats_per_task": "1",
        "model": "", "name": "", "input": text})
    assert response.status_code == 200, response.status_code
    assert f"the input nests deeper than {limits.INPUT_MAX_DEPTH} levels" in response.content.decode()
    assert not Campaign.objects.exists() and sent == []
    _no_traceback_and_at_most_one_line(caplog)


def test_an_urgent_input_at_the_depth_limit_is_still_accepted_by_the_form():
    """The bound refuses only what is deeper than the limit: an object nesting exactly
    ``INPUT_MAX_DEPTH`` levels is the input as typed."""
    from dashboards.web.forms import UrgentForm

    nested = '{"a": ' + "[" * (limits.INPUT_MAX_DEPTH - 1) + "]" * (limits.INPUT_MAX_DEPTH - 1) + "}"
    form = UrgentForm.__new__(UrgentForm)
    form.cleaned_data = {"input": nested}
    value = form.clean_input()
    depth = 1
    item = value["a"]
    while isinstance(item, list):
        depth += 1
        item = item[0] if item else None
    assert depth == limits.INPUT_MAX_DEPTH
