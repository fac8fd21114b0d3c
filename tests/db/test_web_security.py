"""Issue 11, the web side: each test replays an attack from the report (or a
regression it listed) and must fail without the fix it names."""
from __future__ import annotations

import importlib
import json
import pickle
import subprocess
from pathlib import Path

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import Client
from rest_framework.test import APIClient

from dashboards.core import realtime
from dashboards.models import ApiToken, Membership, Team
from dashboards.team_models import Role
from dashboards.core.roles import membership_set

from tests.support.campaigns import DEMO_PASSWORD

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fast_passwords", "locmem_cache")]


class Boom:
    """A pickle that runs ``touch <path>`` when it is unpickled."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (subprocess.call, (["touch", str(self.path)],))


def reload_settings(monkeypatch, **env):
    import tco_web.settings as module

    for name, value in env.items():
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    return importlib.reload(module)


@pytest.fixture
def restore_settings_module():
    yield
    import tco_web.settings as module

    importlib.reload(module)


# --- finding 1: no pickles across a trust boundary; /metrics needs its token -------------


def test_a_pickle_placed_in_the_cache_is_never_unpickled(tmp_path, settings):
    """The serializer the configured cache really uses (not locmem) reads a pickle as a miss."""
    from django.core.cache.backends.redis import RedisCache

    from tco_web.settings import CACHES

    backend = RedisCache(CACHES["default"]["LOCATION"], CACHES["default"])
    serializer = backend._cache._serializer  # built from OPTIONS; connects to nothing
    marker = tmp_path / "ran"
    payload = pickle.dumps(Boom(marker))
    assert serializer.loads(payload) is None
    assert not marker.exists()


def test_the_cache_serializer_round_trips_what_tco_caches():
    import datetime as dt
    from decimal import Decimal

    from tco_web.cache import JSONSerializer

    s = JSONSerializer()
    value = {"cost_usd": Decimal("0.00720000"), "n": 3, "at": dt.datetime(2026, 12, 1, tzinfo=dt.timezone.utc),
             "rows": [{"stage": "submit", "median_s": 1.5, "histogram": None}], "ok": True}
    back = s.loads(s.dumps(value))
    assert back == value and isinstance(back["cost_usd"], Decimal)
    assert s.dumps(7) == 7 and s.loads(b"7") == 7  # incr/decr keep working
    assert s.loads(s.dumps("12")) == "12"
    with pytest.raises(TypeError):
        s.dumps({1, 2})


def test_metrics_answer_no_address_by_default(monkeypatch, restore_settings_module, client, role_users, tmp_path):
    module = reload_settings(monkeypatch, TCO_METRICS_ALLOW=None, TCO_METRICS_TOKEN=None, TCO_METRICS_TOKEN_FILE=None,
                             TCO_STATE_DIR=str(tmp_path / "no-token-here"))
    assert module.TCO_METRICS_ALLOW == []
    assert module.TCO_METRICS_TOKEN is None


def test_a_local_client_without_the_token_is_refused(client, settings, role_users):
    settings.TCO_METRICS_ALLOW = []
    settings.TCO_METRICS_TOKEN = "metrics-secret-1"
    assert client.get("/metrics", REMOTE_ADDR="127.0.0.1").status_code == 403
    assert client.get("/metrics", REMOTE_ADDR="127.0.0.1",
                      HTTP_AUTHORIZATION="Bearer metrics-secret-1").status_code == 200


def test_the_metrics_token_is_read_from_the_state_directory(monkeypatch, restore_settings_module, tmp_path):
    (tmp_path / "metrics-token").write_text("from-the-file\n")
    module = reload_settings(monkeypatch, TCO_METRICS_TOKEN=None, TCO_METRICS_TOKEN_FILE=None,
                             TCO_STATE_DIR=str(tmp_path))
    assert module.TCO_METRICS_TOKEN == "from-the-file"


def test_redis_url_is_built_from_the_password_file(monkeypatch, restore_settings_module, tmp_path):
    (tmp_path / "pw").write_text("s3cr/t\n")
    module = reload_settings(monkeypatch, REDIS_URL=None, TCO_REDIS_PASSWORD_FILE=str(tmp_path / "pw"),
                             TCO_REDIS_PORT="6390", TCO_REDIS_DB="4")
    assert module.REDIS_URL == "redis://:s3cr%2Ft@127.0.0.1:6390/4"
    assert module.CACHES["default"]["LOCATION"] == module.REDIS_URL == module.CELERY_BROKER_URL
    assert [h["address"] for h in module.CHANNEL_LAYERS["default"]["CONFIG"]["hosts"]] == [module.REDIS_URL]


# --- finding 3: API tokens stored hashed --------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_the_database_holds_no_usable_token(role_users):
    """A copy of the database files (main file and WAL) holds neither key, nor can a digest log in."""
    from django.db import connection

    api = APIClient()
    key = api.post("/api/token/", {"username": "lead", "password": DEMO_PASSWORD}, format="json").json()["token"]
    browser = Client()
    assert browser.login(username="viewer", password=DEMO_PASSWORD)
    page_key = browser.post("/account/token/", {"action": "rotate"}).context["new_key"]
    for k in (key, page_key):
        api.credentials(HTTP_AUTHORIZATION=f"Token {k}")
        assert api.get("/api/me/").status_code == 200
    if connection.vendor == "sqlite":
        connection.close()
        db = Path(connection.settings_dict["NAME"])
        raw = b"".join(p.read_bytes() for p in (db, Path(f"{db}-wal")) if p.exists())
    else:
        # PostgreSQL: its files are the server's; what a copy of the database holds is every row of
        # every table, as text (a dump).
        tables = connection.introspection.table_names()
        with connection.cursor() as cursor:
            rows = []
            for table in tables:
                cursor.execute(f"SELECT * FROM {connection.ops.quote_name(table)}")
                rows += [repr(row) for row in cursor.fetchall()]
        raw = "\n".join(rows).encode()
    assert raw
    from django.contrib.sessions.models import Session

    sessions = json.dumps([row.get_decoded() for row in Session.objects.all()])  # signed, not encrypted
    for k in (key, page_key):
        assert k.encode() not in raw
        assert k not in sessions
    stored = ApiToken.objects.get(user=role_users["lead"])
    api.credentials(HTTP_AUTHORIZATION=f"Token {stored.digest}")
    assert api.get("/api/me/").status_code == 401


def test_a_deactivated_users_token_stops_working(role_users):
    from dashboards.core.accounts import api_token_rotate

    key = api_token_rotate(user=role_users["viewer"]).key
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    assert api.get("/api/me/").status_code == 200
    role_users["viewer"].is_active = False
    role_users["viewer"].save()
    assert api.get("/api/me/").status_code == 401


# --- finding 6: brute force on /login/ and POST /api/token/ ------------------------------


def wrong_logins(n: int, *, username: str, address: str, api: bool) -> list[int]:
    codes = []
    for _ in range(n):
        if api:
            codes.append(APIClient(REMOTE_ADDR=address).post(
                "/api/token/", {"username": username, "password": "wrong-password"}, format="json").status_code)
        else:
            codes.append(Client(REMOTE_ADDR=address).post(
                "/login/", {"username": username, "password": "wrong-password"}).status_code)
    return codes


def right_login(*, username: str, address: str, api: bool) -> bool:
    if api:
        response = APIClient(REMOTE_ADDR=address).post(
            "/api/token/", {"username": username, "password": DEMO_PASSWORD}, format="json")
        return response.status_code == 200 and "token" in response.json()
    c = Client(REMOTE_ADDR=address)
    response = c.post("/login/", {"username": username, "password": DEMO_PASSWORD})
    return response.status_code == 302 and "_auth_user_id" in c.session


@pytest.mark.parametrize("api", [False, True], ids=["login-page", "api-token"])
def test_eleven_wrong_passwords_lock_the_user_out(role_users, api):
    assert right_login(username="viewer", address="10.1.0.1", api=api)  # the password is right
    codes = wrong_logins(11, username="viewer", address="10.1.0.1", api=api)
    assert codes[-1] in (403, 429)
    # The right password is refused now, from the same address and from another.
    assert not right_login(username="viewer", address="10.1.0.1", api=api)
    assert not right_login(username="viewer", address="10.1.0.2", api=api)
    # Another user from another address is not affected.
    assert right_login(username="lead", address="10.1.0.3", api=api)


@pytest.mark.parametrize("api", [False, True], ids=["login-page", "api-token"])
def test_one_address_trying_many_users_is_locked_out(role_users, api):
    for name in ("u1", "u2", "u3", "u4", "u5", "u6", "u7", "u8", "u9", "u10", "u11"):
        wrong_logins(1, username=name, address="10.2.0.1", api=api)
    assert not right_login(username="lead", address="10.2.0.1", api=api)
    assert right_login(username="lead", address="10.2.0.2", api=api)


def test_the_lockout_page_says_why(role_users):
    wrong_logins(10, username="viewer", address="10.3.0.1", api=False)
    response = Client(REMOTE_ADDR="10.3.0.1").post("/login/", {"username": "viewer", "password": DEMO_PASSWORD})
    assert response.status_code == 429 and b'id="locked-out"' in response.content


def test_the_api_lockout_answers_json_with_retry_after(role_users, settings):
    """F5: a locked-out ``POST /api/token/`` is an API answer, not the login page's HTML."""
    wrong_logins(10, username="viewer", address="10.4.0.1", api=True)
    response = APIClient(REMOTE_ADDR="10.4.0.1").post(
        "/api/token/", {"username": "viewer", "password": DEMO_PASSWORD}, format="json")
    assert response.status_code == 429
    assert response["Content-Type"].startswith("application/json"), response["Content-Type"]
    body = json.loads(response.content)
    assert set(body) == {"detail"} and "too many failed" in body["detail"]
    assert int(response["Retry-After"]) == int(settings.AXES_COOLOFF_TIME.total_seconds())
    # The login page keeps its styled HTML answer.
    page = Client(REMOTE_ADDR="10.4.0.1").post("/login/", {"username": "viewer", "password": DEMO_PASSWORD})
    assert page.status_code == 429 and b'id="locked-out"' in page.content


# --- finding 8: sockets end with the session and the rights that opened them --------------


@pytest.fixture
def channel_layer(settings, monkeypatch):
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    monkeypatch.setattr("channels.db.close_old_connections", lambda: None)
    from channels.layers import channel_layers

    channel_layers.backends.clear()
    yield
    channel_layers.backends.clear()


async def open_socket(client: Client, path: str = "/ws/queue/", origin: str = "http://localhost"):
    from tco_web.asgi import application

    cookie = f"sessionid={client.cookies['sessionid'].value}"
    comm = WebsocketCommunicator(application, path, headers=[(b"cookie", cookie.encode()),
                                                              (b"origin", origin.encode()),
                                                              (b"host", b"localhost")])
    connected, _ = await comm.connect(timeout=5)
    assert connected
    first = await comm.receive_output(timeout=5)
    return comm, first


def logged_in(username: str) -> Client:
    c = Client()
    assert c.login(username=username, password=DEMO_PASSWORD)
    return c


def run_committed(django_capture_on_commit_callbacks, fn):
    with django_capture_on_commit_callbacks(execute=True):
        fn()


def test_logout_closes_the_sessions_sockets(role_users, channel_layer, django_capture_on_commit_callbacks):
    viewer = logged_in("viewer")
    other_session = logged_in("viewer")

    async def scenario():
        comm, first = await open_socket(viewer)
        other, _ = await open_socket(other_session)
        assert first["type"] == "websocket.send"
        await sync_to_async(run_committed)(django_capture_on_commit_callbacks, lambda: viewer.post("/logout/"))
        closed = await comm.receive_output(timeout=5)
        assert closed == {"type": "websocket.close", "code": realtime.SIGNED_OUT}
        assert await other.receive_nothing(timeout=0.3)  # another login of the same user stays
        await other.disconnect()

    async_to_sync(scenario)()


def test_a_logout_between_the_sockets_check_and_its_group_join_still_closes_it(
        role_users, channel_layer, django_capture_on_commit_callbacks, monkeypatch):
    """A reviewer's finding: the socket read its session in its check, then joined its session's group; a
    logout in between went to a group the socket was not yet in, and the socket stayed open, signed out,
    until its renewal (hours). The logout here is made the moment the check returns."""
    from dashboards.live import consumers

    viewer = logged_in("viewer")
    real_run = consumers.CheckBatch.run

    async def check_then_logout(self, consumer):
        views = await real_run(self, consumer)
        await sync_to_async(run_committed)(django_capture_on_commit_callbacks, lambda: viewer.post("/logout/"))
        return views

    monkeypatch.setattr(consumers.CheckBatch, "run", check_then_logout)

    async def scenario():
        from tco_web.asgi import application

        cookie = f"sessionid={viewer.cookies['sessionid'].value}"
        comm = WebsocketCommunicator(application, "/ws/queue/", headers=[
            (b"cookie", cookie.encode()), (b"origin", b"http://localhost"), (b"host", b"localhost")])
        await comm.connect(timeout=5)
        seen = []
        while not seen or seen[-1]["type"] != "websocket.close":
            seen.append(await comm.receive_output(timeout=5))   # times out (fails) if it stays open
        await comm.disconnect()
        return seen[-1]

    assert async_to_sync(scenario)() == {"type": "websocket.close", "code": realtime.SIGNED_OUT}


@pytest.mark.parametrize("change", ["deactivate", "role", "group", "admin-flag"])
def test_a_change_of_rights_closes_the_users_sockets(role_users, channel_layer, change,
                                                    django_capture_on_commit_callbacks):
    name = "lead" if change != "admin-flag" else "viewer"
    user = role_users[name]
    browser = logged_in(name)
    research = Team.objects.get(project="research")

    def apply():
        if change == "deactivate":
            user.is_active = False
            user.save()
        elif change == "role":
            membership_set(user=user, team=research, role=Role.VIEWER)
        elif change == "group":
            user.groups.remove(research.group)
            Membership.objects.filter(user=user).delete()
        else:
            user.is_staff = True
            user.save()

    async def scenario():
        comm, _ = await open_socket(browser)
        await sync_to_async(run_committed)(django_capture_on_commit_callbacks, apply)
        closed = await comm.receive_output(timeout=5)
        assert closed["type"] == "websocket.close" and closed["code"] in (realtime.RECHECK, realtime.SIGNED_OUT)

    async_to_sync(scenario)()


def test_a_login_does_not_close_sockets(role_users, channel_layer, django_capture_on_commit_callbacks):
    browser = logged_in("lead")

    async def scenario():
        comm, _ = await open_socket(browser)
        await sync_to_async(run_committed)(django_capture_on_commit_callbacks, lambda: logged_in("lead"))
        assert await comm.receive_nothing(timeout=0.3)
        await comm.disconnect()

    async_to_sync(scenario)()


def test_a_page_on_another_port_of_the_same_host_cannot_open_the_dashboards_socket(role_users, channel_layer,
                                                                                   settings):
    """Fresh-clone review: a local user's page on http://127.0.0.1:9999 opened
    ws://127.0.0.1:8000/ws/queue/ with the signed-in admin's cookies (browsers send cookies to
    every port) and read the queue; Channels' AllowedHostsOriginValidator compares names only."""
    settings.ALLOWED_HOSTS = ["localhost", "127.0.0.1"]
    browser = logged_in("lead")
    from tco_web.asgi import application

    async def handshake(origin: bytes, host: bytes) -> bool:
        cookie = f"sessionid={browser.cookies['sessionid'].value}".encode()
        comm = WebsocketCommunicator(application, "/ws/queue/", headers=[
            (b"cookie", cookie), (b"origin", origin), (b"host", host)])
        connected, _ = await comm.connect(timeout=5)
        if connected:
            await comm.disconnect()
        return connected

    async def scenario():
        assert not await handshake(b"http://127.0.0.1:9999", b"127.0.0.1:8000")   # the attack
        assert not await handshake(b"http://localhost:31337", b"127.0.0.1:8000")
        assert await handshake(b"http://127.0.0.1:8000", b"127.0.0.1:8000")       # the page's own origin

    async_to_sync(scenario)()


@pytest.mark.parametrize("origin, host, trusted, allowed", [
    (b"http://localhost", b"localhost", [], True),
    (b"http://localhost:80", b"localhost", [], True),          # default port written out
    (b"https://tco.example.org", b"tco.example.org", [], False),  # name not in ALLOWED_HOSTS
    (b"https://tco.site", b"tco.site:443", [], True),
    (b"https://tco.site", b"tco.site:8443", [], False),
    (b"https://tco.site:8443", b"internal:8000", ["https://tco.site:8443"], True),  # a trusted origin
    (b"https://tco.site:8443", b"internal:8000", ["https://tco.site"], False),
    (None, b"localhost", [], False),
    (b"null", b"localhost", [], False),
    (b"file://", b"localhost", [], False),
    (b"http://localhost:x", b"localhost", [], False),
    (b"http://localhost", b"localhost:99999", [], False),
])
def test_websocket_origin_allowed_compares_scheme_host_and_port(settings, origin, host, trusted, allowed):
    from tco_web.security import websocket_origin_allowed

    settings.ALLOWED_HOSTS = ["localhost", "tco.site"]
    settings.CSRF_TRUSTED_ORIGINS = trusted
    assert websocket_origin_allowed(origin, host) is allowed


def test_a_cross_site_socket_is_refused(role_users, channel_layer):
    browser = logged_in("lead")
    from tco_web.asgi import application

    async def scenario():
        cookie = f"sessionid={browser.cookies['sessionid'].value}".encode()
        comm = WebsocketCommunicator(application, "/ws/queue/", headers=[
            (b"cookie", cookie), (b"origin", b"http://evil.example"), (b"host", b"localhost")])
        connected, _ = await comm.connect(timeout=5)
        assert not connected
        ok = WebsocketCommunicator(application, "/ws/queue/", headers=[
            (b"cookie", cookie), (b"origin", b"http://localhost"), (b"host", b"localhost")])
        assert (await ok.connect(timeout=5))[0]
        await ok.disconnect()

    async_to_sync(scenario)()


@pytest.mark.django_db(transaction=True)
def test_existing_plain_tokens_are_hashed_by_the_migration(role_users):
    """DRF's authtoken table (before issue 11) held keys in the clear: the migration keeps them working, hashed."""
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    old_key = "0123456789abcdef0123456789abcdef01234567"
    executor = MigrationExecutor(connection)
    executor.migrate([("dashboards", "0007_launch_states_endpoints_ceilings")])
    with connection.cursor() as cursor:
        # DRF's table as its migration made it (datetime on SQLite, timestamp with time zone on PostgreSQL).
        created = "datetime" if connection.vendor == "sqlite" else "timestamp with time zone"
        cursor.execute("CREATE TABLE IF NOT EXISTS authtoken_token (key varchar(40) PRIMARY KEY, "
                       f"created {created} NOT NULL, user_id integer NOT NULL UNIQUE)")
        cursor.execute("INSERT INTO authtoken_token VALUES (%s, %s, %s)",
                       [old_key, "2026-11-01 00:00:00", role_users["lead"].pk])
    try:
        executor = MigrationExecutor(connection)
        executor.loader.build_graph()
        executor.migrate([("dashboards", "0008_api_token_hashed")])
        with connection.cursor() as cursor:
            cursor.execute("SELECT COUNT(*) FROM authtoken_token")
            assert cursor.fetchone()[0] == 0
        # On through the later migrations (0017 binds each token to its user's password): still working.
        executor = MigrationExecutor(connection)
        executor.loader.build_graph()
        executor.migrate(executor.loader.graph.leaf_nodes())
        token = ApiToken.objects.get(user=role_users["lead"])
        assert token.prefix == old_key[:8] and old_key not in token.digest
        api = APIClient()
        api.credentials(HTTP_AUTHORIZATION=f"Token {old_key}")
        assert api.get("/api/me/").json()["username"] == "lead"
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TABLE IF EXISTS authtoken_token")
        # Back to the newest schema: the tests after this one share the database.
        executor = MigrationExecutor(connection)
        executor.loader.build_graph()
        executor.migrate(executor.loader.graph.leaf_nodes())


def test_no_other_redis_client_accepts_pickles():
    """Celery reads JSON only; channels_redis packs messages with msgpack (data, never code)."""
    from tco_web.celery import app
    from tco_web.settings import CHANNEL_LAYERS

    assert set(app.conf.accept_content) == {"json"} and app.conf.task_serializer == "json"
    assert CHANNEL_LAYERS["default"]["BACKEND"] == "channels_redis.core.RedisChannelLayer"
    assert CHANNEL_LAYERS["default"]["CONFIG"].get("serializer_format", "msgpack") == "msgpack"


@pytest.mark.parametrize("path", ["/ws/campaign/2/", "/ws/", "/ws/tasks/x/", "/nothing"])
def test_a_socket_to_a_path_no_view_serves_is_refused_not_a_server_error(role_users, channel_layer, path):
    """The fresh attack's A5: ``/ws/campaign/2/`` (no such route) answered HTTP 500 with a traceback in the
    log at every try (Channels' URLRouter raises "No route found"). Now the handshake is refused."""
    from tco_web.asgi import application

    viewer = logged_in("viewer")

    async def scenario():
        comm = WebsocketCommunicator(application, path, headers=[
            (b"cookie", f"sessionid={viewer.cookies['sessionid'].value}".encode()),
            (b"origin", b"http://localhost"), (b"host", b"localhost")])
        connected, code = await comm.connect(timeout=5)
        await comm.disconnect()
        return connected, code

    assert async_to_sync(scenario)() == (False, 1000)


def test_the_users_of_many_sockets_sessions_at_once_are_what_channels_get_user_gives_each(
        role_users, django_assert_max_num_queries):
    """The checks of a storm of sockets resolve their sessions' users 64 at a time (live.sessions.users_of),
    each as Channels' ``get_user`` does: a good session its user (two sockets of one session, two sessions of
    one user); an expired, unknown, missing or user-less session, a deactivated user, a backend not
    configured: anonymous; a session whose password hash is stale: anonymous, and the session flushed; a
    malformed user id: that socket's error. One query for the sessions and one for the users."""
    import datetime as dt

    from channels.auth import get_user
    from django.contrib.auth import BACKEND_SESSION_KEY, SESSION_KEY
    from django.contrib.sessions.backends.db import SessionStore
    from django.contrib.sessions.models import Session
    from django.core.exceptions import ValidationError
    from django.utils import timezone
    from django.utils.functional import LazyObject

    from dashboards.live.sessions import users_of

    def key(client: Client) -> str:
        return client.cookies["sessionid"].value

    def edited(username: str, **changes) -> str:
        store = SessionStore(key(logged_in(username)))
        for name, value in changes.items():
            store[name] = value
        store.save()
        return store.session_key

    viewer, lead, admin = logged_in("viewer"), logged_in("lead"), Client()
    admin.force_login(role_users["admin"])
    expired = key(logged_in("launcher"))
    Session.objects.filter(session_key=expired).update(expire_date=timezone.now() - dt.timedelta(seconds=1))
    stale = key(logged_in("urgent"))
    role_users["urgent"].set_password("a-new-password-1")
    role_users["urgent"].save()
    inactive = key(logged_in("eng-viewer"))
    type(role_users["eng-viewer"]).objects.filter(pk=role_users["eng-viewer"].pk).update(is_active=False)
    other_backend = edited("eng-lead", **{BACKEND_SESSION_KEY: "django.contrib.auth.backends.RemoteUserBackend"})
    malformed = edited("eng-lead", **{SESSION_KEY: "not-a-number"})
    anonymous = SessionStore()
    anonymous["seen"] = True
    anonymous.save()
    keys = [key(viewer), key(viewer), key(logged_in("viewer")), key(lead), key(admin), expired, stale, inactive,
            other_backend, anonymous.session_key, None, "no-such-session-key", malformed]

    def scope(session_key):
        session = LazyObject()
        session._wrapped = SessionStore(session_key)      # as channels.sessions.SessionMiddleware sets it
        return {"session": session}

    with django_assert_max_num_queries(4):               # sessions, users; the stale session's flush
        got = users_of([scope(k) for k in keys])
    names = [u if isinstance(u, Exception) else (u.username if u.is_authenticated else None) for u in got]
    assert names[:-1] == ["viewer", "viewer", "viewer", "lead", "admin"] + [None] * 7
    assert isinstance(names[-1], ValidationError)
    assert not Session.objects.filter(session_key=stale).exists()          # flushed, as get_user does
    assert Session.objects.filter(session_key=key(viewer)).exists()
    # Channels' own get_user, one socket at a time, gives the same
    for session_key, user in zip(keys[:-1], got[:-1]):
        assert get_user.func(scope(session_key)) == user
    with pytest.raises(ValidationError):
        get_user.func(scope(malformed))
