"""API tokens, stored hashed.

A token's key (40 hex digits, 160 random bits) is shown to its user once,
when it is made; the database keeps only its SHA-256 (FIPS 180-4) digest and
the first 8 characters (to tell tokens apart). A copy of the database
therefore holds no usable token. Random keys of this length need no salt or
slow hash: the digest cannot be reversed by guessing.
"""
from __future__ import annotations

import hashlib

from django.conf import settings
from django.db import models


def token_digest(key: str) -> str:
    """The stored form of an API token's key: 64 lowercase hex digits of SHA-256 over its UTF-8 bytes."""
    return hashlib.sha256(key.encode()).hexdigest()


class ApiToken(models.Model):
    """One user's API token (``Authorization: Token <key>``); at most one per user."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_token")
    digest = models.CharField(max_length=64, unique=True, help_text="SHA-256 of the key, hex")
    prefix = models.CharField(max_length=8, help_text="the key's first 8 characters")
    created = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.user})"
