"""Settings of a production site behind TLS (deploy/, docs/deployment.md).

``DJANGO_SETTINGS_MODULE=tco_web.deploy_settings``: everything of
``tco_web.settings`` (read from the environment as there), plus what serving
over HTTPS behind nginx needs, so that ``manage.py check --deploy`` passes
with no warning:

* the request is secure when nginx says so (``X-Forwarded-Proto: https``),
  plain-HTTP requests are redirected (but ``/healthz``, a probe's), cookies are HTTPS-only, HSTS is sent;
* static files are collected with hashed names and a gzip copy of each
  (whitenoise's ``CompressedManifestStaticFilesStorage``): nginx serves them
  with ``gzip_static`` and a one-year cache;
* mail goes out by SMTP (``EMAIL_BACKEND``'s default here, with or without
  ``TCO_PRODUCTION``; the base settings write it to files without it).

Environment: ``TCO_HSTS_SECONDS`` (default one year; 0 turns HSTS off, and
``check --deploy`` then warns), ``TCO_HSTS_PRELOAD`` (default true),
``TCO_STATIC_ROOT`` (default ``$TCO_STATE_DIR/static``).
"""
from __future__ import annotations

from pathlib import Path

from tco_web.settings import *  # noqa: F401,F403  (the base settings, then the production overrides)
from tco_web.settings import STATE_DIR, STORAGES, env_bool, env_int, env_str

DEBUG = False
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SECURE_SSL_REDIRECT = True
SECURE_REDIRECT_EXEMPT = [r"^healthz$"]  # a load balancer's or systemd's probe asks the app's port over plain http
SESSION_COOKIE_SECURE = True
CSRF_COOKIE_SECURE = True
SECURE_HSTS_SECONDS = env_int("TCO_HSTS_SECONDS", 31536000)
SECURE_HSTS_INCLUDE_SUBDOMAINS = True
SECURE_HSTS_PRELOAD = env_bool("TCO_HSTS_PRELOAD", True)
SECURE_REFERRER_POLICY = "same-origin"

STATIC_ROOT = Path(env_str("TCO_STATIC_ROOT", str(STATE_DIR / "static")))
STORAGES = {**STORAGES, "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"}}
# nginx serves STATIC_ROOT; the app reads only the manifest, never the source folders.
WHITENOISE_USE_FINDERS = False

# A site's mail (budget alerts, finished campaigns) goes out by SMTP (EMAIL_HOST, EMAIL_PORT, ...). The base
# settings write mail to files without TCO_PRODUCTION (make demo), and a site on these settings need not set
# TCO_PRODUCTION (deploy/tco.env.example does not): without this its alerts went into <state dir>/mail while
# the budgets page said "e-mailed". EMAIL_BACKEND still chooses another backend.
EMAIL_BACKEND = env_str("EMAIL_BACKEND", "django.core.mail.backends.smtp.EmailBackend")
