"""Static files storage: hashed, compressed names served with a long cache (issue 16, bug 15).

``collectstatic`` (scripts/setup, so also under ``make demo``) writes each file under a name
with its content hash plus ``.gz`` beside it (whitenoise's
``CompressedManifestStaticFilesStorage``); ``{% static %}`` then gives the hashed name, which
whitenoise serves gzip-compressed (``Content-Encoding: gzip`` to clients that accept it) with
``Cache-Control: max-age=315360000, public, immutable``: plotly.min.js (4.8 MB) travels as
about 1.4 MB, once.

Before ``collectstatic`` has run (unit tests, a fresh checkout) there is no manifest; the
storage then gives the plain name, which whitenoise serves from the finders with its short
cache, instead of failing every page.
"""
from __future__ import annotations

from whitenoise.storage import CompressedManifestStaticFilesStorage


class StaticStorage(CompressedManifestStaticFilesStorage):
    """``CompressedManifestStaticFilesStorage`` that falls back to the plain name for a file the
    manifest does not list (no ``collectstatic`` yet)."""

    manifest_strict = False

    def stored_name(self, name: str) -> str:
        """The hashed name from the manifest, else ``name`` itself (never a ValueError)."""
        try:
            return super().stored_name(name)
        except ValueError:
            return name
