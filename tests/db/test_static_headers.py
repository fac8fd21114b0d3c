"""Issue 16, bug 15: plotly.min.js (4.8 MB) is served compressed with a long cache after
``collectstatic`` (what scripts/setup runs, so also under ``make demo``)."""
from __future__ import annotations

import gzip
import re
from pathlib import Path

import pytest
from django.contrib.staticfiles.storage import staticfiles_storage
from django.core.management import call_command
from django.test import Client

from tco_web.settings import _plotly_js_dir

# The database holds the admin's session only: collectstatic's files and WhiteNoise's headers are the
# same on SQLite and PostgreSQL (make test's PostgreSQL pass leaves this out).
pytestmark = [pytest.mark.django_db, pytest.mark.db_independent]

TEN_YEARS_S = 315360000


def test_plotly_is_served_gzipped_under_a_hashed_name_with_an_immutable_cache(settings, tmp_path, role_users):
    settings.STATIC_ROOT = tmp_path / "static"
    call_command("collectstatic", "--noinput", verbosity=0)
    url = staticfiles_storage.url("plotly/plotly.min.js")
    assert re.fullmatch(r"/static/plotly/plotly\.min\.[0-9a-f]{12}\.js", url), url
    client = Client()  # a new handler: whitenoise scans STATIC_ROOT when it starts
    client.force_login(role_users["admin"])
    page = client.get("/").content.decode()
    assert f'src="{url}"' in page  # the pages ask for the hashed name
    original = (Path(_plotly_js_dir()) / "plotly.min.js").read_bytes()
    response = client.get(url, HTTP_ACCEPT_ENCODING="gzip, deflate, br")
    body = b"".join(response.streaming_content)
    assert response.status_code == 200 and response["Content-Encoding"] == "gzip"
    assert "Accept-Encoding" in response["Vary"]
    cache = response["Cache-Control"]
    assert "immutable" in cache and int(re.search(r"max-age=(\d+)", cache).group(1)) >= TEN_YEARS_S
    assert len(body) < len(original) / 2 and gzip.decompress(body) == original
    # A client that does not accept gzip gets the same bytes uncompressed.
    plain = client.get(url)
    assert plain.get("Content-Encoding") is None and b"".join(plain.streaming_content) == original
