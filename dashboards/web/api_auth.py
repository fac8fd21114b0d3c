"""The API's token authentication, apart from the views (DRF imports it while
``rest_framework.views`` itself loads, so it must not import the views)."""
from __future__ import annotations

from rest_framework.authentication import TokenAuthentication
from rest_framework.exceptions import AuthenticationFailed

from dashboards.core import accounts


class HashedTokenAuthentication(TokenAuthentication):
    """``Authorization: Token <key>``, checked against the stored SHA-256 (``token_models``).

    A wrong, revoked or deactivated user's key: 401 ``AuthenticationFailed``.
    """

    def authenticate_credentials(self, key: str):
        user = accounts.api_token_user(key)
        if user is None:
            raise AuthenticationFailed("invalid token")
        return (user, None)
