"""Settings for tco, read from the environment with safe defaults.

Every variable is parsed strictly: a malformed value stops start-up with a
message naming the variable, rather than silently falling back. Secrets may be
given as ``NAME_FILE`` (a path whose contents are the value).
"""
from __future__ import annotations

import datetime as dt
import ipaddress
import os
import re
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent


from tco_web.env import env_bool, env_choice, env_float, env_int, env_list, env_number_in, env_str  # noqa: E402


DEBUG = env_bool("DEBUG", False)
# A production deployment behind a TLS-terminating proxy: HSTS, HTTPS redirect,
# secure cookies, the proxy's X-Forwarded-Proto trusted (``check --deploy`` is
# clean). Off: the dev and test setups serve plain http on loopback.
TCO_PRODUCTION = env_bool("TCO_PRODUCTION", False)

# tco's secrets outside the state directory (the Redis and PostgreSQL passwords, the database URL,
# the secret key, the metrics token): the folder /etc/tco that the setup scripts write, and each
# secret file named by a *_FILE setting. Hidden from every agent like the state directory
# (dashboards.launch.spool.sandbox_state_paths -> the runner's TCO_SANDBOX_MASK), whatever its policy
# lists (/etc read-only is usual); a launch that lists one of them is refused.
TCO_SECRET_PATHS = sorted({"/etc/tco", *(
    os.path.normpath(os.environ[name]) for name in (
        "SECRET_KEY_FILE", "DATABASE_URL_FILE", "TCO_REDIS_PASSWORD_FILE", "TCO_METRICS_TOKEN_FILE",
        "TCO_DATABASE_URL_FILE", "TCO_ALERT_WEBHOOK_TOKEN_FILE")
    if os.environ.get(name, "").startswith("/"))})

# State that is not source: the SQLite file, the runner spool, logs. A real
# cluster points TCO_SPOOL_DIR at the shared file system every exec host mounts.
STATE_DIR = Path(env_str("TCO_STATE_DIR", str(BASE_DIR / "var")))
TCO_SPOOL_DIR = Path(env_str("TCO_SPOOL_DIR", str(STATE_DIR / "spool")))

_secret = env_str("SECRET_KEY")
if not _secret:
    if not DEBUG and os.environ.get("TCO_ALLOW_GENERATED_SECRET", "1") != "1":
        raise ImproperlyConfigured("SECRET_KEY (or SECRET_KEY_FILE) must be set")
    # A per-installation key kept in the state directory, so sessions survive
    # restarts without a secret ever being committed.
    key_file = STATE_DIR / "secret_key"
    try:
        _secret = key_file.read_text().strip()
    except OSError:
        from django.core.management.utils import get_random_secret_key

        _secret = get_random_secret_key()
        try:
            STATE_DIR.mkdir(parents=True, exist_ok=True)
            fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(_secret)
        except FileExistsError:
            _secret = key_file.read_text().strip()
        except OSError:
            pass  # read-only state dir: an ephemeral key, sessions end at restart
SECRET_KEY = _secret

ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "channels",
    "rest_framework",
    "axes",
    "drf_spectacular",
    "dashboards",
    "worker",
    "demo",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "tco_web.security.ContentSecurityPolicyMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Last, as django-axes asks: it answers a locked-out login with 429.
    "axes.middleware.AxesMiddleware",
]

# django-axes counts failed logins (the login page and POST /api/token/) in the
# database and refuses further attempts for a user name, and separately for a
# client address, after TCO_LOGIN_FAILURE_LIMIT failures, for
# TCO_LOGIN_COOLOFF_S seconds. The client address is REMOTE_ADDR: behind a
# proxy, run daphne with --proxy-headers so it is the client's, not the proxy's.
AUTHENTICATION_BACKENDS = [
    "tco_web.security.LoginRateLimitBackend",
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT = env_int("TCO_LOGIN_FAILURE_LIMIT", 10)
AXES_COOLOFF_TIME = dt.timedelta(seconds=env_float("TCO_LOGIN_COOLOFF_S", 900.0))
AXES_LOCKOUT_PARAMETERS = ["username", "ip_address"]
# A good login clears only that user's own failures from that address (tco_web.security.
# LoginAttemptsHandler): axes' own reset clears every attempt matching the lockout parameters, so
# one good login of an attacker's own account wiped the failures counted against admin from the
# same address (issue 23, finding 3).
AXES_RESET_ON_SUCCESS = True
AXES_HANDLER = "tco_web.security.LoginAttemptsHandler"
AXES_LOCKOUT_TEMPLATE = "dashboards/locked_out.html"
# JSON {"detail": ...} with Retry-After under /api/, the template elsewhere.
AXES_LOCKOUT_CALLABLE = "tco_web.security.lockout_response"
AXES_ENABLE_ADMIN = True
AXES_VERBOSE = False

ROOT_URLCONF = "tco_web.urls"
ASGI_APPLICATION = "tco_web.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]


def postgres_options(options: dict) -> dict:
    """The PostgreSQL connection options tco adds to the site's (``options``, from ``DATABASE_URL``; a
    new dict, the site's own values kept):

    - ``options``: ``-c jit=off``. PostgreSQL compiles a plan's expressions when its cost estimate is
      high, and over a year of a busy site's history it spent 3.0 s compiling a waste aggregate that
      ran in 0.2 s (bench/bench_history.py, issue 26). tco's queries are index ranges and short aggregates.
    - ``require_auth``: ``TCO_PG_REQUIRE_AUTH``, default ``!password`` (libpq 16+, "Parameter Key
      Words"): libpq never sends the password in clear text. A local account that bound the
      database's port while PostgreSQL was down (after a boot, a restart) asked for it so, and
      received it (fresh attack, 2026-12-03); SCRAM (scripts/postgres, Debian's default) gives such an
      impostor no password. ``scram-sha-256`` is stricter still; a site that needs clear text (LDAP or
      RADIUS authentication in pg_hba.conf, over TLS) sets its own.
    """
    out = dict(options)
    if "jit" not in out.get("options", ""):
        out["options"] = (out.get("options", "") + " -c jit=off").strip()
    out.setdefault("require_auth", env_str("TCO_PG_REQUIRE_AUTH", "!password"))
    return out


_default_db = f"sqlite:///{STATE_DIR / 'tco.sqlite3'}"
DATABASES = {"default": dj_database_url.parse(env_str("DATABASE_URL", _default_db), conn_max_age=60)}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # WAL lets the web process read while a worker writes; IMMEDIATE
    # transactions take the write lock up front, so two writers wait for each
    # other (busy timeout) instead of failing with "database is locked".
    # Connections persist as PostgreSQL's do: opening one (with the PRAGMAs) cost 3.4 ms of the 4.2 ms
    # of a one-row read on a busy host, and a WebSocket's handshake reads twice (session and user,
    # then what it may see): 500 browsers opening their pages paid it 1,000 times on one thread.
    # An idle autocommit connection holds no snapshot, so it delays no WAL checkpoint.
    DATABASES["default"]["CONN_MAX_AGE"] = 60
    DATABASES["default"]["OPTIONS"] = {
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        "transaction_mode": "IMMEDIATE",
        "timeout": 30,
    }
    # A file, not memory: the browser tests' web server and workers are other processes.
    DATABASES["default"]["TEST"] = {"NAME": env_str("TCO_TEST_DB", str(STATE_DIR / "test-tco.sqlite3"))}
elif "postgresql" in DATABASES["default"]["ENGINE"]:
    DATABASES["default"]["OPTIONS"] = postgres_options(DATABASES["default"].get("OPTIONS", {}))

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# A launch form carries its inputs (up to dashboards.core.limits.INPUT_MAX_BYTES, 16 MiB) and policy
# (64 KiB): Django's default 2.5 MB would answer a bare "400 Bad Request" before the form can say
# what is wrong. tests/db/test_launch_service.py keeps this above the form's own limits.
DATA_UPLOAD_MAX_MEMORY_SIZE = 17 * 1024 * 1024

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "queue"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = STATE_DIR / "static"


def _plotly_js_dir() -> Path:
    import plotly

    return Path(plotly.__file__).parent / "package_data"


# plotly.min.js comes from the plotly package itself: no CDN, works air-gapped.
STATICFILES_DIRS = [BASE_DIR / "static", ("plotly", _plotly_js_dir())]
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    # Hashed names + gzip, served with a ten-year immutable cache (tco_web/static_storage.py).
    "staticfiles": {"BACKEND": "tco_web.static_storage.StaticStorage"},
}
WHITENOISE_USE_FINDERS = True
# Files served at the site's root by WhiteNoise: /favicon.ico (tco's own icon; no CDN, no 404 in the console).
WHITENOISE_ROOT = BASE_DIR / "static" / "root"



def redis_url_from_password_file() -> str:
    """``redis://:<password>@127.0.0.1:<TCO_REDIS_PORT>/<TCO_REDIS_DB>``, the password read from
    ``TCO_REDIS_PASSWORD_FILE`` (default ``/etc/tco/redis-password``, written by
    scripts/dev-cluster, readable by tco and root only).

    Built here, in the process that uses it, so the password never appears in
    a command line. A missing or unreadable file gives a URL without a
    password: Redis then answers NOAUTH, which names the problem.
    """
    from urllib.parse import quote

    port = env_int("TCO_REDIS_PORT", 6379)
    db = env_int("TCO_REDIS_DB", 0)
    path = os.environ.get("TCO_REDIS_PASSWORD_FILE") or "/etc/tco/redis-password"
    try:
        password = Path(path).read_text().strip()
    except OSError:
        password = ""
    auth = f":{quote(password, safe='')}@" if password else ""
    return f"redis://{auth}127.0.0.1:{port}/{db}"


# Redis requires a password and listens on loopback only (scripts/dev-cluster).
# REDIS_URL, when set, wins: redis://:PASSWORD@host:port/db.
REDIS_URL = env_str("REDIS_URL") or redis_url_from_password_file()


def redis_prefix(state_dir: Path, explicit: str = "") -> str:
    """The install's namespace in Redis: every key tco writes (cache, channel layer, Celery's
    queues, the live store, the queue-depth history, the workers' locks) starts with it.

    ``explicit`` (``TCO_REDIS_PREFIX``) wins; it must be 1-64 characters of letters, digits and
    ``_.-:`` (a ``:`` is added at its end when missing). Default ``tco:<10 hex>:``, the hex the
    first digits of the SHA-256 of the resolved state directory (``TCO_STATE_DIR``): stable over
    restarts, the same in every process of one install (they share the state directory, on the
    web and worker hosts alike), different for two installs of one host. Raises
    ``ImproperlyConfigured`` for a malformed ``explicit``.
    """
    import hashlib
    import re

    if explicit:
        if not re.fullmatch(r"[A-Za-z0-9_.:-]{1,64}", explicit):
            raise ImproperlyConfigured(f"TCO_REDIS_PREFIX: {explicit!r}: use 1-64 of A-Z a-z 0-9 _ . - :")
        return explicit if explicit.endswith(":") else explicit + ":"
    digest = hashlib.sha256(str(Path(state_dir).resolve()).encode()).hexdigest()[:10]
    return f"tco:{digest}:"


# Two installs (or another tenant) on one Redis never read or overwrite each other's keys
# (docs/settings.md, "Redis namespace"; security.md).
TCO_REDIS_PREFIX = redis_prefix(STATE_DIR, env_str("TCO_REDIS_PREFIX", ""))
CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        # redis-py's asyncio pool allows 100 connections and then raises (MaxConnectionsError): 250
        # sockets opening at once (50 browsers at a run's start) each join 3-4 groups (issue 15 item 5).
        # socket_timeout: redis-py 8 reads with a 5 s timeout by default, and channels_redis waits for a
        # socket's next message with BZPOPMIN for 5 s (brpop_timeout): an idle socket's receive timed out
        # and its consumer crashed (closed 1006/1011) after 5 s without a message. 15 s outlasts the
        # wait; a Redis that went away still fails the read at once (connection closed).
        "CONFIG": {"hosts": [{"address": REDIS_URL, "max_connections": 2000, "socket_timeout": 15}],
                   "capacity": 1000, "expiry": 10, "prefix": TCO_REDIS_PREFIX + "asgi"},
    }
}

# Shared by every web and worker process: cached scheduler answers (qstat -j),
# stage statistics, the queue-depth history. Values are JSON, never pickles:
# whatever sits in Redis is data, not code (tco_web/cache.py).
CACHES = {
    "default": {
        # A miss, not a 500, while Redis is down (dashboards/resilient_cache.py).
        "BACKEND": "dashboards.core.resilient_cache.ResilientRedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": TCO_REDIS_PREFIX.rstrip(":"),  # keys "<prefix>:<version>:<key>"
        "TIMEOUT": 300,
        "OPTIONS": {"serializer": "tco_web.cache.JSONSerializer", "socket_connect_timeout": 1, "socket_timeout": 2},
    }
}

CELERY_BROKER_URL = env_str("CELERY_BROKER_URL", REDIS_URL)
# Every key of the broker (the queues' lists, bindings, unacked messages, the remote-control
# channels) under the install's prefix: another install's workers never take this one's tasks.
CELERY_BROKER_TRANSPORT_OPTIONS = {"global_keyprefix": TCO_REDIS_PREFIX + "celery:"}
CELERY_RESULT_BACKEND = None
CELERY_TASK_IGNORE_RESULT = True
CELERY_TIMEZONE = "UTC"
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TASK_ROUTES = {
    "worker.tasks.poll_*": {"queue": "poll"},
    "worker.tasks.sample_*": {"queue": "poll"},
    "worker.tasks.ingest_*": {"queue": "ingest"},
    "worker.tasks.reconcile_*": {"queue": "ingest"},
    "worker.tasks.alert_*": {"queue": "ingest"},
    "worker.tasks.submit_*": {"queue": "submit"},
    "worker.tasks.control_*": {"queue": "submit"},
}

# --- Grid Engine -----------------------------------------------------------
SGE_ROOT = env_str("SGE_ROOT", "/var/lib/gridengine")
SGE_CELL = env_str("SGE_CELL", "default")
TCO_CLUSTER_NAME = env_str("TCO_CLUSTER_NAME", "dev")
TCO_CLUSTER_TZ = env_str("TCO_CLUSTER_TZ", "UTC")
# The cell's flavour ("sge8", "ocs9"); empty: detected from the installation when the cluster is first
# created (schedulers/gridengine/flavours.py). The accounting file defaults to the flavour's
# ($SGE_ROOT/$SGE_CELL/common/accounting, or common/accounting.jsonl on OCS 9).
TCO_SCHEDULER_FLAVOUR = env_str("TCO_SCHEDULER_FLAVOUR", "")
TCO_ACCOUNTING_FILE = env_str("TCO_ACCOUNTING_FILE", "")
TCO_QUEUES = env_list("TCO_QUEUES", ["agent.q", "classic.q"])
TCO_REQUESTABLE_RESOURCES = env_list("TCO_REQUESTABLE_RESOURCES", ["anthropic_api", "h_rt", "h_vmem"])
TCO_SEAT_RESOURCE = env_str("TCO_SEAT_RESOURCE", "anthropic_api")
TCO_SUBMIT_USER = env_str("TCO_SUBMIT_USER", "tco")


def install_id_setting(explicit: str) -> str:
    """``TCO_INSTALL_ID`` checked: ``explicit`` itself ("" stays "": the database's id is used), or
    ``ImproperlyConfigured`` unless it is 3-12 of ``a-z 0-9`` (Grid Engine takes them in a job name;
    no ``-``, which separates the name's parts) and not ``c`` and digits only (``tco-c12-c3-x`` would
    then also be the old name of campaign 12, ``c3-x``: dashboards/core/install.py)."""
    if explicit and (not re.fullmatch(r"[a-z0-9]{3,12}", explicit) or re.fullmatch(r"c[0-9]+", explicit)):
        raise ImproperlyConfigured(f"TCO_INSTALL_ID: {explicit!r}: use 3-12 of a-z 0-9, not c and digits only")
    return explicit


# This install's id in its Grid Engine job names (tco-<install>-c<campaign>-<name>): 3-12 of a-z 0-9.
# Empty: the id made once and kept in the database (dashboards.core.install). Set it when a database is
# copied to a second install that shares the cell (the copy would carry the first one's id; docs/security.md).
TCO_INSTALL_ID = install_id_setting(env_str("TCO_INSTALL_ID", ""))
TCO_POLL_INTERVAL_S = env_float("TCO_POLL_INTERVAL_S", 1.0)
# The poll loop's interval while tasks change state (worker/poll_loop.py); at most TCO_POLL_INTERVAL_S. Off (1 s)
# by default: 0.5 s showed no gain in the seed replay on 2 cores (docs/live.md).
TCO_POLL_ACTIVE_INTERVAL_S = env_float("TCO_POLL_ACTIVE_INTERVAL_S", 1.0)
# While a poll finds a burst of changes (worker.tasks.BURST_TASKS), the next one comes this much later.
TCO_POLL_BURST_S = env_float("TCO_POLL_BURST_S", 0.25)
# The qstat poll runs in a process of its own (manage.py tco_poll, worker/poll_loop.py) and the beat does
# not queue it (scripts/services sets it; a site that runs tco-poll.service sets it for tco-beat.service).
TCO_POLL_LOOP = env_bool("TCO_POLL_LOOP", False)
TCO_STATUS_INTERVAL_S = env_float("TCO_STATUS_INTERVAL_S", 5.0)
TCO_INGEST_INTERVAL_S = env_float("TCO_INGEST_INTERVAL_S", 1.0)
# A task gone from qstat with no accounting record after this long is "lost"
# (or "deleted" if it never started).
TCO_LOST_GRACE_S = env_float("TCO_LOST_GRACE_S", 120.0)
# A task whose runner finished this long ago while the scheduler still lists it is called out (dashboards/health.py).
TCO_RUNNER_FINISHED_GRACE_S = env_float("TCO_RUNNER_FINISHED_GRACE_S", 90.0)
# A failed task with no runner record this long after its end had its runner killed outright (dashboards/orphans.py).
TCO_RUNNER_RECORD_GRACE_S = env_float("TCO_RUNNER_RECORD_GRACE_S", 60.0)
TCO_DELETED_GRACE_S = env_float("TCO_DELETED_GRACE_S", 10.0)
# Detail rows (tasks, model requests, accounting records) of usage that ended more than this many days
# ago are dropped; bills keep their figures in the hourly rollups (dashboards/ingest/retention.py).
# 0: keep everything. The drop runs every TCO_RETENTION_INTERVAL_S, TCO_RETENTION_BATCH tasks a transaction.
TCO_DETAIL_RETENTION_DAYS = env_float("TCO_DETAIL_RETENTION_DAYS", 0.0)
TCO_RETENTION_INTERVAL_S = env_float("TCO_RETENTION_INTERVAL_S", 600.0)
TCO_RETENTION_BATCH = env_int("TCO_RETENTION_BATCH", 2000)
# Submit with -notify; needs execd_params NOTIFY_KILL=TERM,NOTIFY_SUSP=none on the cluster.
TCO_NOTIFY = env_bool("TCO_NOTIFY", True)
# The interpreter the scheduler starts the runner with (same venv as the workers).
TCO_RUNNER_PYTHON = env_str("TCO_RUNNER_PYTHON", str(BASE_DIR / ".venv" / "bin" / "python"))
# What one launch may take and one team may hold: the sandbox limits of the site, of each queue and
# of each agent, and the advance reservation ceilings (tco_web/limit_settings.py).
from tco_web.limit_settings import *  # noqa: E402,F401,F403
# OpenTelemetry GenAI traces (docs/otel.md): with OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT in the workers'
# environment, the OTEL_* variables (and TCO_OTEL_COST, TCO_OTEL_FLUSH_S) go to every task's runner; the
# headers (a receiver's key) through a private file in the spool, never the job's environment.
TCO_OTEL_ENV = {name: value for name, value in os.environ.items()
                if (name.startswith("OTEL_") and "HEADERS" not in name)
                or name in ("TCO_OTEL_COST", "TCO_OTEL_FLUSH_S")}
TCO_OTEL_HEADERS = (os.environ.get("OTEL_EXPORTER_OTLP_TRACES_HEADERS")
                    or os.environ.get("OTEL_EXPORTER_OTLP_HEADERS", ""))
# A submission or control request claimed longer than this (seconds; more than the submit and
# control tasks' time limits) by a worker that is gone is settled by worker.tasks.reconcile_claims.
TCO_SUBMIT_CLAIM_GRACE_S = env_float("TCO_SUBMIT_CLAIM_GRACE_S", 900.0)
TCO_CONTROL_CLAIM_GRACE_S = env_float("TCO_CONTROL_CLAIM_GRACE_S", 300.0)
# The port of the demo's stand-in model, registered by tco_bootstrap as model endpoint
# "demo-stand-in" (the demo starts the stand-in there). Privileged (< 1024): scripts/demo binds
# it as root (scripts/listen-as) so that no other local account can listen there, also after
# `make stop` (docs/security.md, F4); it was 8793.
TCO_DEMO_MODEL_PORT = env_int("TCO_DEMO_MODEL_PORT", 793)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "INFO")},
    "loggers": {"django.channels.server": {"level": "WARNING"}},
}

# --- API and metrics --------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "dashboards.web.api_auth.HashedTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    # DRF's default parsers, with JSON bounded in depth: a deeply nested body is a 400, never a
    # RecursionError's 500 and traceback in the log (dashboards/web/parsers.py).
    "DEFAULT_PARSER_CLASSES": [
        "dashboards.web.parsers.BoundedJSONParser",
        "rest_framework.parsers.FormParser",
        "rest_framework.parsers.MultiPartParser",
    ],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "tco API",
    "DESCRIPTION": "Queue, campaigns, tasks and usage of tco, scoped to the caller's teams and role.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SERVE_PERMISSIONS": ["rest_framework.permissions.IsAuthenticated"],
}
# /metrics answers a request that carries ``Authorization: Bearer <TCO_METRICS_TOKEN>``
# or that comes from one of TCO_METRICS_ALLOW (addresses or CIDR networks; empty by
# default: every local account shares 127.0.0.1, so an address proves nothing).
TCO_METRICS_TOKEN = env_str("TCO_METRICS_TOKEN") or None
if TCO_METRICS_TOKEN is None:
    try:  # written by scripts/setup, mode 0600
        TCO_METRICS_TOKEN = (STATE_DIR / "metrics-token").read_text().strip() or None
    except OSError:
        pass
TCO_METRICS_ALLOW = env_list("TCO_METRICS_ALLOW", [])
for _net in TCO_METRICS_ALLOW:
    try:
        ipaddress.ip_network(_net, strict=False)
    except ValueError as exc:
        raise ImproperlyConfigured(f"TCO_METRICS_ALLOW: {_net!r} is not an address or network") from exc
# How long a job's ``qstat -j`` answer is reused by the agent page (seconds).
TCO_JOB_DETAIL_CACHE_S = env_float("TCO_JOB_DETAIL_CACHE_S", 5.0)
# How long a campaign's stage statistics are reused (seconds).
TCO_STAGE_CACHE_S = env_float("TCO_STAGE_CACHE_S", 3.0)
# Queue-depth samples (per team and state) for the history chart.
TCO_DEPTH_SAMPLE_S = env_float("TCO_DEPTH_SAMPLE_S", 10.0)
# The live views (docs/live.md): where their snapshots live ("redis"; "memory" for one-process tests),
# how many messages a socket may fall behind before it is resynchronised from the latest snapshot, and
# how long one send may take before a client that stopped reading is closed to reconnect.
TCO_LIVE_BUS = env_str("TCO_LIVE_BUS", "redis")
if TCO_LIVE_BUS not in ("redis", "memory"):
    raise ImproperlyConfigured(f"TCO_LIVE_BUS: {TCO_LIVE_BUS!r}: use redis or memory")
TCO_LIVE_SOCKET_QUEUE = env_int("TCO_LIVE_SOCKET_QUEUE", 16)
TCO_LIVE_SEND_TIMEOUT_S = env_float("TCO_LIVE_SEND_TIMEOUT_S", 10.0)
# Largest part of an agent's stdout, stderr or output file shown on its page (bytes).
TCO_LOG_VIEW_CAP = env_int("TCO_LOG_VIEW_CAP", 65536)
# The waste view (dashboards/billing/waste.py): verdicts that say the agent's own work failed (any case;
# not a review agent's "bad", which is its finding), and the headroom over the most seats in model calls
# at once in the suggested consumable size.
TCO_FAILING_VERDICTS = env_list("TCO_FAILING_VERDICTS", ["fail", "failed", "failure", "error", "incorrect", "wrong",
                                                         "unresolved"])
TCO_SEAT_HEADROOM = env_float("TCO_SEAT_HEADROOM", 0.15)
# The waste view's seat figures read every model request of its range: at most this many tasks (0: no limit).
TCO_WASTE_SEAT_TASKS = env_int("TCO_WASTE_SEAT_TASKS", 1000)
# The bills page adds the waste figures of its range (summed from the detail rows) up to this many tasks.
TCO_BILL_WASTE_TASKS = env_int("TCO_BILL_WASTE_TASKS", 20000)
# The launch forecast widens its ranges by this factor when the history's inputs differ from the
# campaign's (dashboards/launch/forecast.py, widen_for_misfit).
TCO_FORECAST_MISFIT_FACTOR = env_float("TCO_FORECAST_MISFIT_FACTOR", 2.0)
# A "campaign finished" notice is shown for this many minutes after the finish, on at most this many
# pages, and no more once its campaign's page was opened (dashboards/launch/notices.py).
TCO_NOTICE_MINUTES = env_float("TCO_NOTICE_MINUTES", 60.0)
TCO_NOTICE_PAGES = env_int("TCO_NOTICE_PAGES", 3)

SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_HTTPONLY = False
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
# Sent on every answer (tco_web/security.py): scripts, styles and connections
# from this origin only; no inline script. Plotly sets style attributes, hence
# 'unsafe-inline' for styles only.
TCO_CONTENT_SECURITY_POLICY = env_str(
    "TCO_CONTENT_SECURITY_POLICY",
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data: blob:; "
    "font-src 'self' data:; connect-src 'self'; worker-src 'self' blob:; object-src 'none'; "
    "base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
)
if TCO_PRODUCTION:
    # Behind a TLS-terminating proxy that sets X-Forwarded-Proto (and strips it
    # from clients): check --deploy W004, W008, W012, W016.
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", True)
    SECURE_REDIRECT_EXEMPT = [r"^healthz$"]
    SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 31536000)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", True)
    SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", True)
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    if DEBUG:
        raise ImproperlyConfigured("TCO_PRODUCTION=1 with DEBUG=1: production never runs with DEBUG")
else:
    # Dev and tests: plain http on loopback (Django's defaults, said explicitly).
    SECURE_PROXY_SSL_HEADER = None
    SECURE_SSL_REDIRECT = False
    SECURE_HSTS_SECONDS = 0
    SESSION_COOKIE_SECURE = False
    CSRF_COOKIE_SECURE = False

# --- e-mail (budget alerts, finished campaigns): Django's mail settings ---------
# Without TCO_PRODUCTION (make demo, a developer's install) mail is written to files under
# <state dir>/mail (EMAIL_FILE_PATH), never sent: the demo's users have example.org addresses
# (dashboards.core.accounts.demo_users_ensure) and the budget alerts read "e-mailed". A site sets
# TCO_PRODUCTION=1 (SMTP to EMAIL_HOST) or EMAIL_BACKEND itself.
EMAIL_BACKEND = env_str("EMAIL_BACKEND", "django.core.mail.backends.smtp.EmailBackend" if TCO_PRODUCTION
                        else "django.core.mail.backends.filebased.EmailBackend")
EMAIL_FILE_PATH = env_str("EMAIL_FILE_PATH", str(STATE_DIR / "mail"))
EMAIL_HOST = env_str("EMAIL_HOST", "localhost")
EMAIL_PORT = int(env_float("EMAIL_PORT", 25))
EMAIL_HOST_USER = env_str("EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = env_str("EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", False)
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL", "tco@localhost")
# --- FOCUS cost export (dashboards/billing/focus.py, docs/standards.md) -----------
# Who the FOCUS rows name: ProviderName and InvoiceIssuerName (the site that runs tco), and the
# billing account every team's sub-account (its project) belongs to.
TCO_FOCUS_PROVIDER_NAME = env_str("TCO_FOCUS_PROVIDER_NAME", "tco") or "tco"
TCO_FOCUS_BILLING_ACCOUNT_ID = env_str("TCO_FOCUS_BILLING_ACCOUNT_ID", "tco") or "tco"
TCO_FOCUS_BILLING_ACCOUNT_NAME = env_str("TCO_FOCUS_BILLING_ACCOUNT_NAME", TCO_FOCUS_PROVIDER_NAME) or TCO_FOCUS_PROVIDER_NAME

# --- anomaly alerts (dashboards/alerts, docs/standards.md "Alert thresholds") ----------------
# A periodic check (worker.tasks.alert_anomalies, every TCO_ALERT_INTERVAL_S) records each anomaly
# once, shows it to the team's leads and the admins, e-mails them and posts it to the webhook.
TCO_ALERT_INTERVAL_S = env_number_in("TCO_ALERT_INTERVAL_S", 60.0, low=5, high=86400)
# A campaign's tasks pending (running) longer than TCO_ALERT_SLOW_FACTOR x the TCO_ALERT_SLOW_PERCENTILE
# percentile of the queue waits (run times) of the last TCO_ALERT_HISTORY_TASKS tasks of the same queue
# and agent, and longer than TCO_ALERT_SLOW_MIN_S; no alert with fewer than TCO_ALERT_MIN_HISTORY such tasks.
TCO_ALERT_SLOW_PERCENTILE = env_number_in("TCO_ALERT_SLOW_PERCENTILE", 95.0, low=50, high=100)
TCO_ALERT_SLOW_FACTOR = env_number_in("TCO_ALERT_SLOW_FACTOR", 3.0, low=1, high=1000)
TCO_ALERT_SLOW_MIN_S = env_number_in("TCO_ALERT_SLOW_MIN_S", 300.0, low=0, high=30 * 86400)
TCO_ALERT_HISTORY_TASKS = env_number_in("TCO_ALERT_HISTORY_TASKS", 500, low=1, high=100_000, integer=True)
TCO_ALERT_MIN_HISTORY = env_number_in("TCO_ALERT_MIN_HISTORY", 20, low=1, high=100_000, integer=True)
# A burst: at least TCO_ALERT_FAILURE_BURST tasks of one campaign failed (or were lost) within
# TCO_ALERT_FAILURE_WINDOW_S, and they are at least TCO_ALERT_FAILURE_FRACTION of the tasks that ended then.
TCO_ALERT_FAILURE_BURST = env_number_in("TCO_ALERT_FAILURE_BURST", 5, low=1, high=1_000_000, integer=True)
TCO_ALERT_FAILURE_WINDOW_S = env_number_in("TCO_ALERT_FAILURE_WINDOW_S", 600.0, low=10, high=7 * 86400)
TCO_ALERT_FAILURE_FRACTION = env_number_in("TCO_ALERT_FAILURE_FRACTION", 0.5, low=0.01, high=1)
# A budget burns when its spend rate since the period began would exhaust it before the period ends;
# judged once TCO_ALERT_BURN_MIN_ELAPSED of the period (0..1) is gone (a period's first hour says little).
TCO_ALERT_BURN_MIN_ELAPSED = env_number_in("TCO_ALERT_BURN_MIN_ELAPSED", 0.1, low=0, high=0.99)
# How long an alert stays on the pages of the team's leads and the admins (hours).
TCO_ALERT_NOTICE_HOURS = env_number_in("TCO_ALERT_NOTICE_HOURS", 24.0, low=0, high=24 * 90)
TCO_ALERT_EMAIL = env_bool("TCO_ALERT_EMAIL", True)
# Alerts are POSTed as JSON to this URL (empty: none): Alertmanager's webhook payload ("webhook", what an
# Alertmanager receiver gets) or the list Alertmanager's own POST /api/v2/alerts takes ("alertmanager").
TCO_ALERT_WEBHOOK_URL = env_str("TCO_ALERT_WEBHOOK_URL", "") or ""
if TCO_ALERT_WEBHOOK_URL and not TCO_ALERT_WEBHOOK_URL.startswith(("http://", "https://")):
    raise ImproperlyConfigured(f"TCO_ALERT_WEBHOOK_URL={TCO_ALERT_WEBHOOK_URL!r} is not an http(s) URL")
TCO_ALERT_WEBHOOK_FORMAT = env_choice("TCO_ALERT_WEBHOOK_FORMAT", "webhook", ("webhook", "alertmanager"))
# Sent as "Authorization: Bearer <token>" when set (or TCO_ALERT_WEBHOOK_TOKEN_FILE).
TCO_ALERT_WEBHOOK_TOKEN = env_str("TCO_ALERT_WEBHOOK_TOKEN", "") or ""
TCO_ALERT_WEBHOOK_TIMEOUT_S = env_number_in("TCO_ALERT_WEBHOOK_TIMEOUT_S", 5.0, low=0.1, high=60)
# The address users reach tco at (https://tco.example.org), for links in alert e-mails and webhooks;
# empty: the links are paths.
TCO_SITE_URL = (env_str("TCO_SITE_URL", "") or "").rstrip("/")

# Root of "files in a directory" campaign inputs; nothing outside it is read.
TCO_INPUTS_ROOT = env_str("TCO_INPUTS_ROOT", str(STATE_DIR / "inputs"))

# LDAP logins, active when TCO_LDAP_URI is set (tco_web/ldap_settings.py).
from tco_web.ldap_settings import *  # noqa: E402,F401,F403
