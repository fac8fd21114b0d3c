"""The assistant's MCP server over its real transports (stdio, streamable HTTP on loopback), with the mcp
package's own client: what a token's user sees and is refused, and why_pending on the real dev cluster.

The server runs as a subprocess (``python -m assistant``) on the test database; causes of waiting are made
on purpose by tests/integration/assistant_causes.py.
"""
from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from decimal import Decimal

import anyio
import pytest
from django.db import connection
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from assistant.untrusted import unwrap
from dashboards.core.accounts import api_token_rotate
from dashboards.models import Team
from tests.support.campaigns import make_campaign
from tests.support.paths import REPO
from tests.support.stack import free_port
from tests.support.stack import database_url_for
from tests.support.cluster import qdel_quietly, SGE_ENV
from tests.support.history import make_task

from .assistant_causes import CAUSES, CauseContext

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

T0 = dt.datetime(2026, 11, 2, 9, 0, 0, tzinfo=dt.timezone.utc)


@pytest.fixture
def server_env(bootstrap):
    """The environment of ``python -m assistant`` on this test's database (and the suite's Redis)."""
    env = {**os.environ, "DATABASE_URL": database_url_for(connection.settings_dict["NAME"]),
           "DJANGO_SETTINGS_MODULE": "tco_web.settings", "TCO_SPOOL_DIR": str(bootstrap.TCO_SPOOL_DIR),
           "TCO_JOB_DETAIL_CACHE_S": "0.5", "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("DATABASE_URL_FILE", None)  # it would win over DATABASE_URL
    env.pop("TCO_API_TOKEN", None)
    return env


class Stdio:
    """Sessions with ``python -m assistant`` over stdio, one subprocess per session."""

    name = "stdio"

    def __init__(self, env: dict) -> None:
        self.env = env
        self.stderr = tempfile.TemporaryFile(mode="w+")

    def client(self, key: str | None) -> Client:
        env = {**self.env, **({"TCO_API_TOKEN": key} if key is not None else {})}
        params = StdioServerParameters(command=sys.executable, args=["-m", "assistant"], env=env, cwd=str(REPO))
        return Client(stdio_client(params, errlog=self.stderr), read_timeout_seconds=60)

    def errors(self) -> str:
        self.stderr.seek(0)
        return self.stderr.read()


class Http:
    """``python -m assistant --http`` on a loopback port; a session per token."""

    name = "http"

    def __init__(self, env: dict, log) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.proc = subprocess.Popen([sys.executable, "-m", "assistant", "--http", "--port", str(self.port)],
                                     cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while self.status() is None:
            assert self.proc.poll() is None and time.monotonic() < deadline, "the HTTP server did not start"
            time.sleep(0.2)

    def status(self, headers: dict | None = None) -> int | None:
        """HTTP status of a bare POST to the endpoint (None while nothing listens)."""
        request = urllib.request.Request(self.url, data=b"{}", method="POST", headers={
            "Content-Type": "application/json", "Accept": "application/json, text/event-stream", **(headers or {})})
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                return response.status
        except urllib.error.HTTPError as exc:
            return exc.code
        except OSError:
            return None

    def client(self, key: str | None) -> Client:
        headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
        return Client(streamable_http_client(self.url, http_client=create_mcp_http_client(headers=headers)),
                      read_timeout_seconds=60)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()


@pytest.fixture(params=["stdio", "http"])
def transport(request, server_env, tmp_path):
    if request.param == "stdio":
        yield Stdio(server_env)
        return
    with open(tmp_path / "assistant-http.log", "wb") as log:
        server = Http(server_env, log)
        try:
            yield server
        finally:
            server.stop()


async def calls(client: Client, *requests: tuple[str, dict]) -> list[tuple[bool, object]]:
    """Each ``(tool, arguments)`` in one session: ``[(is_error, structured answer or error text)]``."""
    out = []
    async with client:
        for tool, arguments in requests:
            result = await client.call_tool(tool, arguments)
            out.append((True, result.content[0].text) if result.is_error else (False, result.structured_content))
    return out


def leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions inside (nested) exception groups."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in leaves(inner)]
    return [exc]


def session(transport, key, *requests):
    return anyio.run(calls, transport.client(key), *requests)


@pytest.fixture
def two_teams(bootstrap, ops_users):
    """A finished campaign on research and one on engineering, each with one billed task on T0."""
    research, engineering = Team.objects.get(project="research"), Team.objects.get(project="engineering")
    ours = make_campaign(team=research, user=ops_users["admin"], name="ours", job_number=1201,
                         tasks=[{"state": "done", "active": False}])
    theirs = make_campaign(team=engineering, user=ops_users["admin"], name="theirs", job_number=1202,
                           tasks=[{"state": "done", "active": False}])
    make_task(ours, task_number=2, started_at=T0, wallclock_s=40.0, cost_usd="0.75")
    make_task(theirs, task_number=2, started_at=T0, wallclock_s=50.0, cost_usd="9")
    keys = {name: api_token_rotate(user=ops_users[name]).key for name in ("viewer", "lead", "other")}
    return {"ours": ours, "theirs": theirs, "keys": keys}


def test_a_viewer_gets_their_teams_answers_and_refusals_for_the_others(transport, two_teams):
    ours, theirs = two_teams["ours"], two_teams["theirs"]
    our_task, their_task = ours.tasks.get(task_number=1), theirs.tasks.get(task_number=1)
    day = T0.date().isoformat()
    answers = session(transport, two_teams["keys"]["viewer"],
                      ("queue_summary", {}),
                      ("campaign", {"campaign_id": ours.pk}), ("campaign", {"campaign_id": theirs.pk}),
                      ("task", {"task_id": our_task.pk}), ("task", {"task_id": their_task.pk}),
                      ("why_pending", {"task_id": their_task.pk}),
                      ("team_bill", {"team": "research", "first": day, "last": day}))
    queue, campaign_ok, campaign_no, task_ok, task_no, pending_no, bill_no = answers
    # Names reach the model marked as untrusted data (assistant.untrusted).
    assert queue[0] is False and [unwrap(c["name"]) for c in queue[1]["campaigns"]] == ["ours"]
    assert campaign_ok == (False, campaign_ok[1]) and campaign_ok[1]["campaign"]["id"] == ours.pk
    assert campaign_no == (True, f"Error executing tool campaign: refused: no campaign {theirs.pk} that you may see")
    assert task_ok[0] is False and task_ok[1]["task"]["id"] == our_task.pk
    assert task_no == (True, f"Error executing tool task: refused: no task {their_task.pk} that you may see")
    assert pending_no[0] is True and "refused: no task" in pending_no[1]
    # A viewer reads no bill, not even their own team's (bills are the lead's).
    assert bill_no[0] is True and "refused: no bill of team 'research'" in bill_no[1]

    ours_bill, theirs_bill = session(transport, two_teams["keys"]["lead"],
                                     ("team_bill", {"team": "research", "first": day, "last": day}),
                                     ("team_bill", {"team": "engineering", "first": day, "last": day}))
    assert ours_bill[0] is False
    assert Decimal(ours_bill[1]["totals"]["cost_usd"]) == Decimal("0.75") and ours_bill[1]["totals"]["wallclock_s"] == 40.0
    assert theirs_bill[0] is True and "refused: no bill of team 'engineering'" in theirs_bill[1]

    # The other team's launcher sees theirs, and not ours.
    [(error, text)] = session(transport, two_teams["keys"]["other"], ("campaign", {"campaign_id": ours.pk}))
    assert error is True and "refused: no campaign" in text


@pytest.mark.parametrize("key", [None, "f" * 40])
def test_a_missing_or_invalid_token_is_refused(transport, two_teams, key):
    with pytest.raises(Exception) as caught:
        session(transport, key, ("campaign", {"campaign_id": two_teams["ours"].pk}))
    # The session never opens: the client gets a protocol error (stdio: the server closed; HTTP: 401).
    assert any(isinstance(e, MCPError) for e in leaves(caught.value)), caught.value
    if transport.name == "stdio":
        # The server says why on stderr and exits before serving.
        assert "assistant: refused: " in transport.errors() and "token" in transport.errors()
    else:
        assert transport.status({"Authorization": f"Bearer {key}"} if key else {}) == 401
        # A valid token passes the same check (the refusal is the token's, not the request's).
        assert transport.status({"Authorization": f"Bearer {two_teams['keys']['viewer']}"}) != 401


def test_the_http_server_listens_on_loopback_only(server_env):
    out = subprocess.run([sys.executable, "-m", "assistant", "--http", "--host", "0.0.0.0", "--port", "1"],
                         cwd=REPO, env=server_env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--host must be a loopback address" in out.stderr


@pytest.mark.parametrize("name", list(CAUSES))
def test_why_pending_names_the_cause_made_on_purpose(server_env, ops_users, tmp_path, name):
    """Each cause in assistant_causes.CAUSES on its own, asked over both transports."""
    ctx = CauseContext(launcher=ops_users["launcher"], team=Team.objects.get(project="research"))
    viewer_key = api_token_rotate(user=ops_users["viewer"]).key
    other_key = api_token_rotate(user=ops_users["other"]).key
    log = open(tmp_path / "assistant-http.log", "wb")
    http = Http(server_env, log)
    try:
        made = CAUSES[name](ctx)
        for transport in (Stdio(server_env), http):
            [(error, answer)] = session(transport, viewer_key, ("why_pending", {"task_id": made.task.pk}))
            assert error is False, (transport.name, answer)
            assert answer["waiting"] is True, (transport.name, answer)
            texts = [r["text"] for r in answer["reasons"]]
            for expected in made.expected:
                assert expected in texts, (transport.name, texts)
            made.check_facts(answer["facts"])
            # The other team's user is refused.
            [(error, text)] = session(transport, other_key, ("why_pending", {"task_id": made.task.pk}))
            assert error and "refused: no task" in text, text
    finally:
        http.stop()
        log.close()
        qdel_quietly(*ctx.jobs)
        for ar in ctx.reservations:  # advance reservations a cause booked (issue 17)
            subprocess.run(["qrdel", str(ar)], capture_output=True, env=SGE_ENV)
        for undo in reversed(ctx.undo):
            undo()
