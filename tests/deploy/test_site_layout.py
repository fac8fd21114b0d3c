"""The production layout of deploy/, started on loopback the way its units start it.

No systemd here: each unit's ``Environment=`` and ``ExecStart=`` are read
from deploy/systemd/*.service and run as they are, with the install prefix
/opt/tco replaced by this checkout and ``${VAR}`` taken from the site's
environment file (deploy/tco.env.example, with this machine's values). In
front, Debian's nginx runs deploy/nginx/tco.conf (ports, certificate and
static paths moved to the test's), with a self-signed certificate made here.

Through the proxy, over https only: a login and the queue page, a WebSocket
update pushed by a worker task, and plotly.min.js by its hashed name, gzip
from collectstatic's precompressed copy with a one-year cache. uvicorn gets
its Unix socket the way tco-web.socket hands it over (an inherited file
descriptor; systemd's is 3, the test's its own number) and listens on no TCP
port; a client's forged ``X-Forwarded-For`` moves no login lockout.
"""
from __future__ import annotations

import asyncio
import gzip
import json
import os
import re
import shlex
import shutil
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.conf import settings

from demo.watch.samplers import descendants
from tests.support.paths import REPO
from tests.support.stack import free_port, Stack, TEST_OUTPUT

pytestmark = pytest.mark.integration
DEPLOY = REPO / "deploy"
PREFIX = "/opt/tco"


def read_unit(name: str, section_name: str = "Service") -> dict[str, list[str]]:
    """The ``[Service]`` (or ``section_name``) keys of deploy/systemd/``name`` (systemd.unit(5) syntax):
    key -> values in order."""
    keys: dict[str, list[str]] = {}
    section = None
    for raw in (DEPLOY / "systemd" / name).read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        if section == section_name:
            key, _, value = line.partition("=")
            keys.setdefault(key.strip(), []).append(value.strip())
    return keys


def read_env_file(path: Path) -> dict[str, str]:
    """``NAME=value`` lines of an ``EnvironmentFile=`` (comments and blanks skipped)."""
    env = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
                value = value[1:-1]  # systemd.exec(5): one level of quotes is removed
            env[key] = value
    return env


def unit_command(name: str, site_env: dict[str, str]) -> tuple[list[str], dict[str, str], str]:
    """(argv, the unit's own Environment= values, working directory) as systemd would run ``name``.

    ``${VAR}`` comes from ``site_env`` (a missing one is a KeyError: the unit
    needs a setting the site file lacks); ``%%`` is systemd's literal ``%``.
    """
    unit = read_unit(name)
    own = {}
    for assignments in unit.get("Environment", []):
        for item in shlex.split(assignments):
            key, _, value = item.partition("=")
            own[key] = value
    env = {**site_env, **own}
    (exec_start,) = unit["ExecStart"]
    expanded = re.sub(r"\$\{(\w+)\}", lambda m: env[m.group(1)], exec_start).replace("%%", "%")
    argv = [word.replace(PREFIX, str(REPO), 1) if word.startswith(PREFIX) else word for word in shlex.split(expanded)]
    (workdir,) = unit["WorkingDirectory"]
    assert unit["User"] == ["tco"] and unit["EnvironmentFile"] == ["/etc/tco/tco.env"]
    return argv, own, workdir.replace(PREFIX, str(REPO), 1)


def nginx_config(tmp: Path, *, https_port: int, http_port: int, web_socket: Path, tls: Path, static: Path) -> Path:
    """deploy/nginx/tco.conf with the test's ports and paths, inside a main config runnable unprivileged."""
    site = (DEPLOY / "nginx" / "tco.conf").read_text()
    replacements = {
        "server unix:/run/tco/web.sock;": f"server unix:{web_socket};",
        "listen 80;": f"listen 127.0.0.1:{http_port};",
        "listen 443 ssl http2;": f"listen 127.0.0.1:{https_port} ssl http2;",
        "/etc/tco/tls/": f"{tls}/",
        "/var/lib/tco/static/": f"{static}/",
        "/etc/nginx/snippets/tco-headers.conf": str(DEPLOY / "nginx" / "tco-headers.conf"),
    }
    for old, new in replacements.items():
        assert old in site, f"deploy/nginx/tco.conf no longer has {old!r}: update this test"
        site = site.replace(old, new)
    site = "\n".join(line for line in site.splitlines() if "[::]" not in line)  # no IPv6 on the test host
    (tmp / "tco.conf").write_text(site)
    for d in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
        (tmp / d).mkdir(exist_ok=True)
    main = tmp / "nginx.conf"
    main.write_text(f"""
daemon off;
worker_processes 1;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log;
events {{ worker_connections 128; }}
http {{
    include /etc/nginx/mime.types;
    default_type application/octet-stream;
    access_log {tmp}/access.log;
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    include {tmp}/tco.conf;
}}
""")
    return main


def self_signed(tls: Path) -> Path:
    """A key and a certificate for 127.0.0.1 (subjectAltName IP), made by openssl for this test."""
    tls.mkdir(parents=True, exist_ok=True)
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-keyout", str(tls / "tco.key"), "-out", str(tls / "tco.crt"),
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True, timeout=60)
    return tls / "tco.crt"


def web_socket(path: Path) -> socket.socket:
    """The listening Unix socket deploy/systemd/tco-web.socket describes, made at ``path`` (its
    ``ListenStream`` is /run/tco/web.sock) with the unit's ``SocketMode``, as systemd makes it before
    starting tco-web.service with it as fd 3 (sd_listen_fds(3))."""
    unit = read_unit("tco-web.socket", "Socket")
    assert unit["ListenStream"] == ["/run/tco/web.sock"]
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    os.chmod(path, int(unit["SocketMode"][0], 8))
    sock.listen(128)
    return sock


def tcp_listeners(pids: list[int]) -> list[str]:
    """The TCP sockets in LISTEN state that any of ``pids`` holds (``/proc/<pid>/fd`` against
    ``/proc/net/tcp`` and ``tcp6``, proc(5)), as ``local address:port`` in the kernel's hex."""
    inodes = set()
    for pid in pids:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[len("socket:["):-1])
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # st 0A: TCP_LISTEN
                found.append(fields[1])
    return found


def site_environment(tmp: Path, *, database_url: str, https_port: int) -> dict[str, str]:
    """deploy/tco.env.example with this machine's values: what /etc/tco/tco.env would say here."""
    env = read_env_file(DEPLOY / "tco.env.example")
    # The cell, queues and paths of the dev cluster, not the example's.
    for key in ("SGE_ROOT", "SGE_CELL", "DRMAA_LIBRARY_PATH", "TCO_CLUSTER_NAME", "TCO_CLUSTER_TZ", "TCO_QUEUES",
                "TCO_SEAT_RESOURCE", "TCO_SUBMIT_USER", "TCO_RUNNER_PYTHON", "DATABASE_URL_FILE", "SECRET_KEY_FILE"):
        env.pop(key, None)
    secret = tmp / "secret-key"
    secret.write_text(os.urandom(32).hex())
    env.update({
        "ALLOWED_HOSTS": "127.0.0.1",
        "CSRF_TRUSTED_ORIGINS": f"https://127.0.0.1:{https_port}",
        "SECRET_KEY_FILE": str(secret),
        "DATABASE_URL": database_url,
        "TCO_STATE_DIR": str(tmp / "state"),
        "TCO_SPOOL_DIR": str(tmp / "spool"),
        "TCO_STATIC_ROOT": str(tmp / "static"),
        "TCO_WEB_WORKERS": "2",
        # Low, so that the forged-address test reaches the lockout in a few attempts.
        "TCO_LOGIN_FAILURE_LIMIT": "3",
        # The site's Redis namespace is this test process's (its own state directory would give it
        # another, docs/settings.md): the test sends the site's worker a task through the broker.
        "TCO_REDIS_PREFIX": settings.TCO_REDIS_PREFIX,
    })
    # The test's Redis: its URL if the run set one, else the one settings.py builds from the
    # password file (TCO_REDIS_PORT, TCO_REDIS_DB, TCO_REDIS_PASSWORD_FILE, inherited).
    env.pop("REDIS_URL", None)
    if os.environ.get("REDIS_URL"):
        env["REDIS_URL"] = os.environ["REDIS_URL"]
    # DATABASE_URL_FILE would win over DATABASE_URL; DJANGO_ALLOW_ASYNC_UNSAFE (set by the browser
    # tests for Playwright) is never set at a site, and check --deploy rightly refuses it.
    inherited = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL_FILE", "DJANGO_ALLOW_ASYNC_UNSAFE")}
    return {**inherited, **env, "PYTHONDONTWRITEBYTECODE": "1"}


def wait_https(url: str, ctx: ssl.SSLContext, timeout: float = 60.0) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2, context=ctx) as resp:
                if resp.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise RuntimeError(f"{url} did not answer through nginx")


@pytest.fixture
def site(transactional_db, bootstrap, tmp_path):
    """nginx + tco-web (uvicorn, 2 workers) + tco-live + tco-worker-poll on loopback, on the test database."""
    from django.db import connection

    from tests.support.stack import database_url_for as test_database_url

    if not shutil.which("nginx"):
        pytest.fail("nginx is not installed: run scripts/setup (it installs Debian's nginx)")
    https_port, http_port = free_port(), free_port()
    env = site_environment(tmp_path, database_url=test_database_url(connection.settings_dict["NAME"]),
                           https_port=https_port)
    cert = self_signed(tmp_path / "tls")
    log_dir = TEST_OUTPUT / "site-logs"
    shutil.rmtree(log_dir, ignore_errors=True)
    log_dir.mkdir(parents=True)
    # What a site runs on install and upgrade (docs/deployment.md): collectstatic with the deploy settings.
    subprocess.run([sys.executable, "manage.py", "collectstatic", "--noinput", "-v", "0"], cwd=REPO, env=env,
                   check=True, timeout=300)
    stack = Stack(connection.settings_dict["NAME"], tmp_path / "spool", log_dir)
    stack.env = env
    subprocess.run([sys.executable, "-m", "celery", "-A", "tco_web", "purge", "-f"], cwd=REPO, env=env,
                   check=True, capture_output=True, timeout=60)
    (tmp_path / "nginx").mkdir()
    listener = web_socket(tmp_path / "web.sock")
    main_conf = nginx_config(tmp_path / "nginx", https_port=https_port, http_port=http_port,
                             web_socket=tmp_path / "web.sock", tls=tmp_path / "tls", static=tmp_path / "static")
    try:
        for unit, name in (("tco-web.service", "web"), ("tco-live.service", "live"),
                           ("tco-worker-poll.service", "worker")):
            argv, own_env, workdir = unit_command(unit, env)
            assert workdir == str(REPO)
            fds: tuple[int, ...] = ()
            if name == "web":  # systemd's fd 3 is the test's listener.fileno()
                at = argv.index("--fd")
                assert argv[at + 1] == "3", argv
                argv[at + 1] = str(listener.fileno())
                fds = (listener.fileno(),)
            stack.start(name, argv, pass_fds=fds, **own_env)
        stack.start("nginx", ["nginx", "-e", str(tmp_path / "nginx" / "error-early.log"),
                              "-p", str(tmp_path / "nginx"), "-c", str(main_conf)])
        ctx = ssl.create_default_context(cafile=str(cert))
        wait_https(f"https://127.0.0.1:{https_port}/healthz", ctx)
        yield {"https": f"https://127.0.0.1:{https_port}", "http": f"http://127.0.0.1:{http_port}",
               "ssl": ctx, "env": env, "static": tmp_path / "static",
               "web_pids": descendants(dict(stack.procs)["web"].pid), "web_socket": tmp_path / "web.sock"}
    finally:
        stack.stop()
        listener.close()


def test_page_websocket_and_static_through_nginx(site, bootstrap):
    import aiohttp

    base, ctx = site["https"], site["ssl"]
    plotly_src = Path(__import__("plotly").__file__).parent / "package_data" / "plotly.min.js"
    expected_plotly = plotly_src.read_bytes()

    async def scenario() -> None:
        jar = aiohttp.CookieJar(unsafe=True)  # cookies for an IP address host
        async with aiohttp.ClientSession(cookie_jar=jar, connector=aiohttp.TCPConnector(ssl=ctx)) as http:
            # Plain HTTP only redirects to HTTPS.
            async with http.get(site["http"] + "/login/", allow_redirects=False) as resp:
                assert resp.status == 301
                assert resp.headers["Location"].startswith("https://")

            # The login page, with the security headers set once, by nginx.
            async with http.get(base + "/login/") as resp:
                assert resp.status == 200
                assert resp.headers.getall("Strict-Transport-Security") == [
                    "max-age=31536000; includeSubDomains; preload"]
                assert resp.headers.getall("X-Frame-Options") == ["DENY"]
                assert resp.headers.getall("X-Content-Type-Options") == ["nosniff"]
                assert "frame-ancestors 'none'" in resp.headers["Content-Security-Policy"]
                assert "Server" not in resp.headers or "nginx/" not in resp.headers["Server"]
                assert "; secure" in resp.headers["Set-Cookie"].lower()  # the CSRF cookie: HTTPS only
            csrf = next(c.value for c in jar if c.key == "csrftoken")
            async with http.post(base + "/login/", data={
                "username": "admin", "password": os.environ["TCO_ADMIN_PASSWORD"], "csrfmiddlewaretoken": csrf,
                "next": "/"}, headers={"Referer": base + "/login/"}, allow_redirects=False) as resp:
                assert resp.status == 302, await resp.text()
                assert "; secure" in resp.headers["Set-Cookie"].lower()
            async with http.get(base + "/") as resp:
                assert resp.status == 200
                page = await resp.text()
            assert 'id="login-submit"' not in page  # the queue page, not the login form again
            hashed = re.search(r'src="(/static/plotly/plotly\.min\.[0-9a-f]{12}\.js)"', page)
            assert hashed, "the queue page does not load plotly by its hashed name"

            # plotly.min.js: the precompressed copy, cached for a year, same bytes as the package's.
            async with http.get(base + hashed.group(1), headers={"Accept-Encoding": "gzip"},
                                auto_decompress=False) as resp:
                assert resp.status == 200
                assert resp.headers["Content-Encoding"] == "gzip"
                assert resp.headers.getall("Cache-Control") == ["public, max-age=31536000, immutable"]
                assert resp.headers.getall("X-Content-Type-Options") == ["nosniff"]
                body = await resp.read()
            assert len(body) < len(expected_plotly) / 3
            assert gzip.decompress(body) == expected_plotly
            gz_on_disk = (site["static"] / hashed.group(1).removeprefix("/static/")).with_suffix(".js.gz")
            assert body == gz_on_disk.read_bytes()  # served from collectstatic's file, not compressed again

            # The live queue over wss: the first snapshot, then an update pushed by a task the worker runs.
            async with http.ws_connect(base.replace("https", "wss") + "/ws/queue/",
                                       origin=base, heartbeat=None) as ws:
                first = json.loads((await ws.receive(timeout=30)).data)
                assert first["kind"] == "queue.snapshot"
                from tco_web.celery import app

                await asyncio.to_thread(app.send_task, "worker.tasks.sample_queue_depth")
                deadline = time.monotonic() + 60
                kinds = []
                while time.monotonic() < deadline:
                    msg = await ws.receive(timeout=deadline - time.monotonic())
                    assert msg.type == aiohttp.WSMsgType.TEXT, msg
                    kinds.append(json.loads(msg.data)["kind"])
                    if kinds[-1] == "queue.depth":
                        break
                assert kinds and kinds[-1] == "queue.depth", kinds

    asyncio.run(scenario())


def test_the_deploy_settings_pass_check_deploy_without_a_warning(tmp_path):
    env = site_environment(tmp_path, database_url=f"sqlite:///{tmp_path / 'check.sqlite3'}", https_port=443)
    env["ALLOWED_HOSTS"] = "tco.example.org"
    done = subprocess.run([sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "System check identified no issues" in done.stdout
    # And the same check does warn about the base settings (so this test can fail).
    base = subprocess.run([sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"], cwd=REPO,
                          env={**env, "DJANGO_SETTINGS_MODULE": "tco_web.settings"}, capture_output=True, text=True,
                          timeout=120)
    assert base.returncode != 0 and "security.W004" in base.stderr + base.stdout


def test_the_web_server_has_no_tcp_port_and_a_forged_forwarded_address_moves_no_lockout(site):
    """The attack (docs/security.md, login lockout): a local user of the web host connected to uvicorn's
    loopback port and set ``X-Forwarded-For``, which uvicorn trusted from 127.0.0.1, to fail logins
    under made-up addresses (never locked out) or under a victim's (locking it out). Now uvicorn
    listens on the socket tco-web.socket hands it (0660 tco:www-data) and on no TCP port, and nginx
    replaces a client's ``X-Forwarded-For`` with the client's address: failures with a different
    forged address each still lock the real address out."""
    import aiohttp

    unit = read_unit("tco-web.socket", "Socket")
    assert (unit["SocketUser"], unit["SocketGroup"], unit["SocketMode"]) == (["tco"], ["www-data"], ["0660"])
    assert oct(os.stat(site["web_socket"]).st_mode & 0o777) == "0o660"
    assert tcp_listeners(site["web_pids"]) == [], "uvicorn listens on a TCP port a local user could reach"
    base, ctx = site["https"], site["ssl"]

    async def attempt(http, username: str, password: str, forged: str) -> int:
        async with http.get(base + "/login/") as resp:
            assert resp.status in (200, 429)
        csrf = next(c.value for c in http.cookie_jar if c.key == "csrftoken")
        async with http.post(base + "/login/", data={"username": username, "password": password,
                                                     "csrfmiddlewaretoken": csrf, "next": "/"},
                             headers={"Referer": base + "/login/", "X-Forwarded-For": forged},
                             allow_redirects=False) as resp:
            return resp.status

    async def scenario() -> list[int]:
        jar = aiohttp.CookieJar(unsafe=True)
        async with aiohttp.ClientSession(cookie_jar=jar, connector=aiohttp.TCPConnector(ssl=ctx)) as http:
            statuses = [await attempt(http, f"nobody-{n}", "wrong", f"203.0.113.{n}") for n in (1, 2, 3)]
            # The right password now, under yet another forged address: the real address is locked out.
            statuses.append(await attempt(http, "admin", os.environ["TCO_ADMIN_PASSWORD"], "203.0.113.4"))
            return statuses

    statuses = asyncio.run(scenario())
    assert statuses[:3] == [200, 200, 429], statuses  # the form again twice, then the third failure locks
    assert statuses[3] == 429, statuses
    from axes.models import AccessAttempt

    addresses = set(AccessAttempt.objects.values_list("ip_address", flat=True))
    assert addresses == {"127.0.0.1"}, addresses
