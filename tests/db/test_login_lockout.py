"""The login lockout (django-axes) holds against an attacker who also has an account of their own:
a good login of one account never wipes the failures counted against another one from the same
address (issue 23, finding 3)."""
from __future__ import annotations

import os

import pytest
from django.test import Client
from rest_framework.test import APIClient

from tests.support.campaigns import DEMO_PASSWORD

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fast_passwords", "locmem_cache")]

ATTACKER = "10.23.3.1"


def _page_login(username: str, password: str, address: str) -> Client | None:
    """Log in on the login page; the client when it worked, else None."""
    client = Client(REMOTE_ADDR=address)
    response = client.post("/login/", {"username": username, "password": password})
    return client if response.status_code == 302 and "_auth_user_id" in client.session else None


def _api_login(username: str, password: str, address: str) -> bool:
    response = APIClient(REMOTE_ADDR=address).post("/api/token/", {"username": username, "password": password},
                                                   format="json")
    return response.status_code in (200, 409)  # 409: the password was right, a token exists already


@pytest.mark.parametrize("api", [False, True], ids=["login-page", "api-token"])
def test_good_logins_of_another_account_do_not_reset_the_failures_against_admin(role_users, api, settings):
    """The attack: 15 wrong passwords for admin in rounds of 5 (on the login page, or POST /api/token/),
    each round followed by a good login of the attacker's own account on the login page from the same
    address, then admin's right password: it must be refused (the limit is 10 failures)."""
    assert settings.AXES_FAILURE_LIMIT == 10
    admin_password = os.environ["TCO_ADMIN_PASSWORD"]
    for _ in range(3):
        for _ in range(5):
            if api:
                assert not _api_login("admin", "wrong-password", ATTACKER)
            else:
                assert _page_login("admin", "wrong-password", ATTACKER) is None
        # The attacker's own account logs in fine until the address has 10 failures.
        own = _page_login("launcher", DEMO_PASSWORD, ATTACKER)
        if own is not None:
            own.post("/logout/")
    right = _api_login("admin", admin_password, ATTACKER) if api else _page_login("admin", admin_password, ATTACKER)
    assert not right
    # From another address too: the user name has its 15 failures.
    elsewhere = (_api_login("admin", admin_password, "10.23.3.2") if api
                 else _page_login("admin", admin_password, "10.23.3.2"))
    assert not elsewhere


def test_a_good_login_clears_the_users_own_failures_from_that_address(role_users):
    """What a reset on success is for: a user who mistyped 9 times and then logs in starts again from 0."""
    for _ in range(9):
        assert _page_login("viewer", "wrong-password", "10.23.3.5") is None
    assert _page_login("viewer", DEMO_PASSWORD, "10.23.3.5")
    for _ in range(9):
        assert _page_login("viewer", "wrong-password", "10.23.3.5") is None
    assert _page_login("viewer", DEMO_PASSWORD, "10.23.3.5")
