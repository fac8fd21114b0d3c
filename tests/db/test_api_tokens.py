"""API tokens end with the password they were made under, and ``POST /api/token/`` never replaces a
working token without being asked to (issue 23, finding 4)."""
from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from rest_framework.test import APIClient

from dashboards.core.accounts import api_token_rotate

from tests.support.campaigns import DEMO_PASSWORD

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fast_passwords", "locmem_cache")]


def _me(key: str) -> int:
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    return api.get("/api/me/").status_code


def _obtain(username: str, password: str, **extra) -> tuple[int, dict]:
    response = APIClient().post("/api/token/", {"username": username, "password": password, **extra}, format="json")
    return response.status_code, response.json()


def test_a_token_made_before_a_password_change_stops_working_after_it(role_users):
    """The attack: a token leaked (or made by someone who knew the old password) kept working after the
    owner changed the password, though sessions and sockets ended."""
    key = api_token_rotate(user=role_users["viewer"]).key
    assert _me(key) == 200
    user = get_user_model().objects.get(username="viewer")
    user.set_password("a-new-password-23")
    user.save()
    assert _me(key) == 401
    # Setting the same password again makes a new hash (a new salt): the old token stays dead.
    user.set_password(DEMO_PASSWORD)
    user.save()
    assert _me(key) == 401
    fresh = api_token_rotate(user=user).key
    assert _me(fresh) == 200


def test_obtaining_a_token_never_silently_replaces_a_working_one(role_users):
    status, body = _obtain("viewer", DEMO_PASSWORD)
    assert status == 200
    first = body["token"]
    status, body = _obtain("viewer", DEMO_PASSWORD)
    assert status == 409
    assert "rotate" in body["detail"] and body["token_prefix"] == first[:8]
    assert _me(first) == 200  # the first token still works
    status, body = _obtain("viewer", DEMO_PASSWORD, rotate=True)
    assert status == 200 and body["token"] != first
    assert _me(first) == 401 and _me(body["token"]) == 200


def test_a_token_dead_from_a_password_change_is_replaced_without_rotate(role_users):
    status, body = _obtain("urgent", DEMO_PASSWORD)
    assert status == 200
    user = get_user_model().objects.get(username="urgent")
    user.set_password("other-password-23")
    user.save()
    status, body2 = _obtain("urgent", "other-password-23")
    assert status == 200 and body2["token"] != body["token"] and _me(body2["token"]) == 200


def test_a_wrong_password_with_rotate_replaces_nothing(role_users):
    status, body = _obtain("viewer", DEMO_PASSWORD)
    assert status == 200
    status, _ = _obtain("viewer", "wrong", rotate=True)
    assert status == 400
    assert _me(body["token"]) == 200


def test_the_api_schema_documents_the_conflict_and_rotate():
    from drf_spectacular.generators import SchemaGenerator

    schema = SchemaGenerator().get_schema(request=None, public=True)
    post = schema["paths"]["/api/token/"]["post"]
    assert "409" in post["responses"]
    assert "rotate" in str(schema["components"]["schemas"]["TokenRequest"]["properties"])


@pytest.mark.parametrize("value", [1, 1.0, 0, "1", "yes", "True", None, [], {}, [True]])
def test_rotate_takes_only_true_or_false(role_users, value):
    """Fresh attack A7: ``"rotate": 1`` replaced the working token (``1 in (True, ...)`` is true in
    Python). Anything but JSON true/false (or the form's "true"/"false") is refused and the token stays."""
    status, body = _obtain("lead", DEMO_PASSWORD)
    assert status == 200
    first = body["token"]
    status, body = _obtain("lead", DEMO_PASSWORD, rotate=value)
    assert status == 400 and body == {"rotate": "true or false"}, body
    assert _me(first) == 200


def test_rotate_false_keeps_and_true_text_replaces(role_users):
    status, body = _obtain("lead", DEMO_PASSWORD)
    first = body["token"]
    assert _obtain("lead", DEMO_PASSWORD, rotate=False)[0] == 409 and _me(first) == 200
    response = APIClient().post("/api/token/", {"username": "lead", "password": DEMO_PASSWORD, "rotate": "true"})
    assert response.status_code == 200 and _me(first) == 401 and _me(response.json()["token"]) == 200
