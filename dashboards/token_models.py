"""API tokens, stored hashed.

A token's key (40 hex digits, 160 random bits) is shown to its user once,
when it is made; the database keeps only its SHA-256 (FIPS 180-4) digest and
the first 8 characters (to tell tokens apart). A copy of the database
therefore holds no usable token. Random keys of this length need no salt or
slow hash: the digest cannot be reversed by guessing.

A token is bound to the password its user had when it was made
(``password_stamp``: an HMAC of the stored password hash, keyed by the
site's secret key, as Django's session auth hash is): a password change
(a new hash, even for the same password) ends every token made before it,
as it ends the user's sessions (issue 23, finding 4).
"""
from __future__ import annotations

import hashlib

from django.conf import settings
from django.db import models
from django.utils.crypto import constant_time_compare, salted_hmac

_STAMP_SALT = "dashboards.token_models.password_stamp"


def token_digest(key: str) -> str:
    """The stored form of an API token's key: 64 lowercase hex digits of SHA-256 over its UTF-8 bytes."""
    return hashlib.sha256(key.encode()).hexdigest()


def password_stamp(password_hash: str) -> str:
    """What a token keeps of its user's password: 64 hex digits of HMAC-SHA256 over the stored
    password hash (``User.password``), keyed by ``SECRET_KEY``. Not the hash itself: a copy of the
    token table tells nothing of the password."""
    return salted_hmac(_STAMP_SALT, password_hash or "", algorithm="sha256").hexdigest()


def stamp_matches(stamp: str, password_hash: str) -> bool:
    """Whether ``stamp`` was made from ``password_hash`` (constant time)."""
    return bool(stamp) and constant_time_compare(stamp, password_stamp(password_hash))


class ApiToken(models.Model):
    """One user's API token (``Authorization: Token <key>``); at most one per user."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_token")
    digest = models.CharField(max_length=64, unique=True, help_text="SHA-256 of the key, hex")
    prefix = models.CharField(max_length=8, help_text="the key's first 8 characters")
    created = models.DateTimeField(auto_now_add=True)
    password_stamp = models.CharField(max_length=64, blank=True, default="",
                                      help_text="HMAC of the user's password hash when the token was made")

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.user})"
