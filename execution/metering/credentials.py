"""Credentials for the metering proxy, by name, read outside the sandbox.

The proxy asks only for the ``credential_name`` of a registered model endpoint
(execution/metering/endpoints.py ``RegisteredEndpoint``); a policy's
``credential_binding`` never chooses one (issue 11, finding 2).
"""
from __future__ import annotations

import os
from typing import Mapping

__all__ = ["CredentialError", "CredentialResolver"]

class CredentialError(RuntimeError):
    """A credential is not configured, or its file/variable is missing or empty."""


class CredentialResolver:
    """Credentials by name, read by the proxy (outside the sandbox). The proxy asks only
    for the ``credential_name`` of a :class:`RegisteredEndpoint`.

    ``sources`` maps a credential name (``anthropic-prod``) to ``file:/path`` (the file's
    content, stripped) or ``env:NAME`` (the runner's environment, read at the
    first request; the runner must not pass that variable to the agent).
    Values are cached in memory and never logged or recorded.
    """

    def __init__(self, sources: Mapping[str, str]) -> None:
        for provider, source in sources.items():
            if not (source.startswith("file:") or source.startswith("env:")):
                raise ValueError(f"credential {provider}: expected 'file:/path' or 'env:NAME'")
        self._sources = dict(sources)
        self._cache: dict[str, str] = {}

    def resolve(self, provider: str) -> str:
        """The secret named ``provider`` (a credential name). Raises CredentialError."""
        if provider in self._cache:
            return self._cache[provider]
        source = self._sources.get(provider)
        if source is None:
            raise CredentialError(f"no credential configured for provider {provider!r}")
        kind, _, where = source.partition(":")
        if kind == "file":
            try:
                with open(where, encoding="utf-8") as fh:
                    value = fh.read().strip()
            except OSError as exc:
                raise CredentialError(f"credential {provider}: cannot read its file: {exc.strerror}") from None
        else:
            value = os.environ.get(where, "").strip()
        if not value:
            raise CredentialError(f"credential {provider}: empty or missing")
        self._cache[provider] = value
        return value

