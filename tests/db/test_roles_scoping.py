"""Every page and WebSocket shows a user only what their teams and role allow; an admin sees all."""
from __future__ import annotations

import datetime as dt
import json
import os

import pytest
from asgiref.sync import async_to_sync
from django.contrib.auth import get_user_model

from dashboards.core import realtime
from dashboards.core import spool_files
from dashboards.live import snapshots
from dashboards.core import scope
from dashboards.live import queue
from dashboards.live import task as live_task
from dashboards.models import Task, Team
from dashboards.core.roles import membership_set

from tests.support.campaigns import DEMO_PASSWORD
from tests.support.sockets import campaign_source, next_of, push, ws_connect

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fast_passwords", "locmem_cache")]

TEAM_MEMBERS = ("viewer", "lead", "launcher", "urgent")


def login(client, username: str) -> None:
    password = "test-admin-pw-1" if username == "admin" else DEMO_PASSWORD
    assert client.login(username=username, password=password)


def summary_of(response) -> dict:
    html = response.content.decode()
    start = html.index('<script id="initial-summary" type="application/json">') + len(
        '<script id="initial-summary" type="application/json">')
    return json.loads(html[start:html.index("</script>", start)])


@pytest.mark.parametrize("username", TEAM_MEMBERS)
def test_each_research_role_sees_research_campaigns_and_nothing_else(client, world, username):
    login(client, username)
    summary = summary_of(client.get("/"))
    assert [c["name"] for c in summary["campaigns"]] == ["alpha"]
    assert summary["other_jobs"] is None and summary["other_job_rows"] is None
    assert [r["project"] for r in summary["by_team"]] == ["research"]
    # alpha's active tasks only: the job tco did not launch is not counted for a team member.
    assert summary["totals"]["pending"] == 1 and summary["totals"]["running"] == 1
    assert client.get(f"/campaigns/{world['alpha'].pk}/").status_code == 200
    assert client.get(f"/campaigns/{world['beta'].pk}/").status_code == 404
    assert client.get(f"/tasks/{world['alpha_task'].pk}/").status_code == 200
    assert client.get(f"/tasks/{world['beta_task'].pk}/").status_code == 404
    assert client.get(f"/tasks/{world['other'].pk}/").status_code == 404
    data = client.get("/queue.json").json()
    assert {c["id"] for c in data["campaigns"]} == {world["alpha"].pk}


def test_a_viewer_of_the_other_team_sees_only_that_team(client, world):
    login(client, "eng-viewer")
    summary = summary_of(client.get("/"))
    assert [c["name"] for c in summary["campaigns"]] == ["beta"]
    assert summary["totals"]["pending"] == 2 and summary["totals"]["running"] == 0
    assert all(t["campaign"] != "alpha" for t in summary["recent_finished"])
    assert client.get(f"/campaigns/{world['alpha'].pk}/").status_code == 404
    assert client.get(f"/tasks/{world['alpha_task'].pk}/").status_code == 404
    assert client.get(f"/campaigns/{world['beta'].pk}/").status_code == 200


def test_the_engineering_lead_reads_engineerings_bill_and_not_researchs(client, world):
    """Fresh-demo trial: the demo's priced usage is engineering's, but no demo login could read its
    bill (only eng-viewer existed). eng-lead is engineering's team lead."""
    from dashboards.billing.bills import teams_billable_by

    login(client, "eng-lead")
    assert [t.project for t in teams_billable_by(world["users"]["eng-lead"])] == ["engineering"]
    page = client.get("/ops/bills/")
    assert page.status_code == 200 and "Bills are for team leads" not in page.content.decode()
    research = Team.objects.get(project="research")
    assert client.get(f"/ops/bills/?team={research.pk}").context["bill"] is None  # not a choice for this lead
    assert client.get(f"/campaigns/{world['alpha'].pk}/").status_code == 404
    assert client.get(f"/campaigns/{world['beta'].pk}/").status_code == 200


def test_an_admin_sees_every_team_and_the_jobs_tco_did_not_launch(client, world):
    login(client, "admin")
    summary = summary_of(client.get("/"))
    assert {c["name"] for c in summary["campaigns"]} == {"alpha", "beta"}
    assert summary["other_jobs"]["pending"] == 1
    assert [r["job_number"] for r in summary["other_job_rows"]] == [2000]
    assert summary["totals"]["pending"] == 4
    for path in (f"/campaigns/{world['beta'].pk}/", f"/tasks/{world['other'].pk}/", f"/tasks/{world['beta_task'].pk}/"):
        assert client.get(path).status_code == 200, path


def test_a_user_in_no_team_sees_an_empty_queue_and_no_campaign(client, world):
    get_user_model().objects.create_user("nobody", password="nobody-pw-123")
    assert client.login(username="nobody", password="nobody-pw-123")
    summary = summary_of(client.get("/"))
    assert summary["campaigns"] == [] and sum(summary["totals"].values()) == 0
    assert summary["recent_finished"] == []
    assert client.get(f"/campaigns/{world['alpha'].pk}/").status_code == 404


def test_membership_of_the_team_group_alone_counts_as_viewer(client, world):
    user = get_user_model().objects.create_user("grouped", password="grouped-pw-123")
    user.groups.add(Team.objects.get(project="engineering").group)
    assert client.login(username="grouped", password="grouped-pw-123")
    assert client.get(f"/campaigns/{world['beta'].pk}/").status_code == 200
    assert client.get(f"/campaigns/{world['alpha'].pk}/").status_code == 404


def test_an_inactive_user_sees_nothing(world):
    user = world["users"]["viewer"]
    user.is_active = False
    user.save()
    assert not scope.campaigns_visible_to(user).exists()
    assert not scope.tasks_visible_to(user).exists()


def test_the_scopes_of_many_users_at_once_are_each_ones_scope_in_two_queries(world, django_assert_max_num_queries):
    """A storm of sockets is checked 64 at a time (live.consumers): ``scopes_of`` gives every user of a batch
    the scope ``scope_of`` gives them alone (roles, the team's group alone, both, admins, inactive users, no
    team) in two queries for all; ``team_ids_with`` gives every capability's teams of ``teams_with``."""
    from dashboards.core.roles import CAPABILITIES, is_admin, team_ids_with, teams_with

    User = get_user_model()
    research, engineering = Team.objects.get(project="research"), Team.objects.get(project="engineering")
    grouped = User.objects.create_user("grouped", password=None)
    grouped.groups.add(engineering.group)
    both = User.objects.create_user("both", password=None)
    membership_set(user=both, team=research, role="viewer")
    both.groups.add(engineering.group)
    superuser = User.objects.create_user("root", password=None, is_superuser=True)
    gone_admin = User.objects.create_user("gone-admin", password=None, is_staff=True, is_active=False)
    gone = User.objects.create_user("gone", password=None, is_active=False)
    membership_set(user=gone, team=research, role="lead")
    nobody = User.objects.create_user("nobody", password=None)
    users = [*world["users"].values(), grouped, both, superuser, gone_admin, gone, nobody]
    expected = {**{name: {research.pk} for name in TEAM_MEMBERS},
                "eng-viewer": {engineering.pk}, "eng-lead": {engineering.pk}, "eng-launcher": {engineering.pk},
                "admin": None, "grouped": {engineering.pk},
                "both": {research.pk, engineering.pk}, "root": None, "gone-admin": set(), "gone": set(), "nobody": set()}
    with django_assert_max_num_queries(2):
        scopes = scope.scopes_of(users)
    assert {u.username: scopes[u.pk] for u in users} == {
        name: scope.Scope(None if ids is None else frozenset(ids)) for name, ids in expected.items()}
    assert scopes == {u.pk: scope.scope_of(u) for u in users}
    for capability in CAPABILITIES:
        assert team_ids_with(users, capability) == {
            u.pk: None if is_admin(u) else set(teams_with(u, capability).values_list("pk", flat=True)) for u in users}
    assert team_ids_with(users, "bill")[world["users"]["lead"].pk] == {research.pk}
    assert team_ids_with(users, "bill")[world["users"]["viewer"].pk] == set()


@pytest.mark.parametrize("path", ["/", "/queue.json", "/campaigns/1/", "/tasks/1/", "/account/token/",
                                  "/tasks/1/outputs/result.json"])
def test_anonymous_requests_are_sent_to_the_login_page(client, world, path):
    response = client.get(path)
    assert response.status_code == 302 and response["Location"].startswith("/login/")


def test_the_share_tree_shows_only_the_users_teams(client, world):
    from dashboards.core.clusters import cluster_get_default

    cluster = cluster_get_default()
    cluster.status = {"share_tree": [
        {"node": "/", "project": None, "user": None, "usage": 2.0},
        {"node": "/research", "project": "research", "user": None, "usage": 1.5, "actual_share": 0.75},
        {"node": "/engineering", "project": "engineering", "user": None, "usage": 0.5, "actual_share": 0.25},
    ]}
    cluster.save()
    login(client, "viewer")
    nodes = summary_of(client.get("/"))["clusters"][0]["share_tree"]
    assert [n["project"] for n in nodes] == ["research"]
    client.logout()
    login(client, "admin")
    assert len(summary_of(client.get("/"))["clusters"][0]["share_tree"]) == 3


# --------------------------------------------------------------------------- spool files

def test_the_agent_page_never_reads_a_log_outside_the_spool(client, world, settings, tmp_path):
    task = world["alpha_task"]
    outside = tmp_path / "secret.txt"
    outside.write_text("top secret")
    task.runner_record = {"stdout_path": str(outside), "stderr_path": "/etc/passwd"}
    task.save()
    login(client, "viewer")
    detail = live_task.task_detail(world["users"]["viewer"], task.pk, with_scheduler=False)
    assert detail["stdout"]["text"] is None and "outside" in detail["stdout"]["error"]
    assert detail["stderr"]["text"] is None and "outside" in detail["stderr"]["error"]
    page = client.get(f"/tasks/{task.pk}/").content.decode()
    assert "top secret" not in page and "root:" not in page


def test_a_symlink_in_the_spool_that_points_out_is_refused(world, settings, tmp_path):
    spool = settings.TCO_SPOOL_DIR
    records = spool / "records" / str(world["alpha"].pk)
    records.mkdir(parents=True)
    outside = tmp_path / "elsewhere.txt"
    outside.write_text("not for you")
    (records / "1.stdout").symlink_to(outside)
    (records / "1.stderr").write_text("x" * 100 + "tail")
    task = world["alpha_task"]
    detail = live_task.task_detail(world["users"]["viewer"], task.pk, with_scheduler=False)
    assert detail["stdout"]["text"] is None and "outside" in detail["stdout"]["error"]
    assert detail["stderr"]["text"].endswith("tail")


def test_a_log_is_capped_to_its_tail(world, settings):
    settings.TCO_LOG_VIEW_CAP = 10
    path = settings.TCO_SPOOL_DIR / "records" / "9" / "1.stdout"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"0123456789abcdefghij")
    found = spool_files.read_spool_file(str(path))
    assert found == {"path": "records/9/1.stdout", "size": 20, "text": "abcdefghij", "truncated": True,
                     "error": None}


def test_a_fifo_in_the_spool_is_not_opened_for_reading(world, settings):
    path = settings.TCO_SPOOL_DIR / "fifo"
    settings.TCO_SPOOL_DIR.mkdir(parents=True, exist_ok=True)
    os.mkfifo(path)
    found = spool_files.read_spool_file(str(path))
    assert found["text"] is None and "regular" in found["error"]


@pytest.mark.parametrize("name", ["..", "../spec.json", "%2e%2e", "sub/x"])
def test_output_files_cannot_leave_the_work_directory(client, world, settings, name):
    work = settings.TCO_SPOOL_DIR / "work" / str(world["alpha"].pk) / "1"
    work.mkdir(parents=True)
    (work / "result.json").write_text('{"answer": 42}')
    (settings.TCO_SPOOL_DIR / "work" / str(world["alpha"].pk) / "spec.json").write_text("no")
    login(client, "viewer")
    assert client.get(f"/tasks/{world['alpha_task'].pk}/outputs/result.json").content == b'{"answer": 42}'
    assert client.get(f"/tasks/{world['alpha_task'].pk}/outputs/{name}").status_code == 404


def test_output_files_of_another_team_are_a_404(client, world, settings):
    work = settings.TCO_SPOOL_DIR / "work" / str(world["beta"].pk) / "1"
    work.mkdir(parents=True)
    (work / "result.json").write_text("beta's")
    login(client, "viewer")
    assert client.get(f"/tasks/{world['beta_task'].pk}/outputs/result.json").status_code == 404


# --------------------------------------------------------------------------- WebSockets
# Each test runs in one event loop (a communicator cannot cross loops); ORM calls
# inside it go through database_sync_to_async, which runs them on this thread.

def test_the_campaign_socket_refuses_a_campaign_of_another_team(world):
    viewer = world["users"]["viewer"]

    async def scenario():
        _, connected, code, _ = await ws_connect(viewer, f"/ws/campaigns/{world['beta'].pk}/")
        assert not connected and code == 4403
        comm, connected, _, first = await ws_connect(viewer, f"/ws/campaigns/{world['alpha'].pk}/")
        assert connected and first["kind"] == "campaign.snapshot" and first["data"]["campaign"]["name"] == "alpha"
        await comm.disconnect()

    async_to_sync(scenario)()


def test_the_task_socket_refuses_tasks_the_user_may_not_see(world):
    viewer, admin = world["users"]["viewer"], world["users"]["admin"]

    async def scenario():
        for task in (world["beta_task"], world["other"]):
            _, connected, code, _ = await ws_connect(viewer, f"/ws/tasks/{task.pk}/")
            assert not connected and code == 4403
        comm, connected, _, first = await ws_connect(admin, f"/ws/tasks/{world['other'].pk}/")
        assert connected and first["data"]["task"]["job_number"] == 2000
        await comm.disconnect()

    async_to_sync(scenario)()


def test_an_anonymous_socket_is_refused(world):
    from django.contrib.auth.models import AnonymousUser

    async def scenario():
        for path in ("/ws/queue/", f"/ws/campaigns/{world['alpha'].pk}/", f"/ws/tasks/{world['alpha_task'].pk}/"):
            _, connected, code, _ = await ws_connect(AnonymousUser(), path)
            assert not connected and code == 4401, path

    async_to_sync(scenario)()


def test_the_queue_socket_pushes_each_user_only_their_teams(world):
    from channels.db import database_sync_to_async

    viewer, eng = world["users"]["viewer"], world["users"]["eng-viewer"]

    async def scenario():
        c1, ok1, _, first1 = await ws_connect(viewer, "/ws/queue/")
        c2, ok2, _, first2 = await ws_connect(eng, "/ws/queue/")
        assert ok1 and ok2
        assert [c["name"] for c in first1["data"]["campaigns"]] == ["alpha"]
        assert [c["name"] for c in first2["data"]["campaigns"]] == ["beta"]
        await database_sync_to_async(
            lambda: Task.objects.filter(campaign=world["beta"]).update(state="running", state_code="r"))()
        await push("queue", campaign_source(world["beta"]))
        again1, again2 = await next_of(c1, "queue.snapshot"), await next_of(c2, "queue.snapshot")
        assert [c["name"] for c in again1["data"]["campaigns"]] == ["alpha"]
        assert again2["data"]["campaigns"][0]["states"]["running"] == 2
        await c1.disconnect()
        await c2.disconnect()

    async_to_sync(scenario)()


def test_a_campaign_socket_closes_when_the_user_loses_access_and_its_reconnect_is_refused(
        world, django_capture_on_commit_callbacks):
    from channels.db import database_sync_to_async

    viewer = world["users"]["viewer"]

    def revoke():
        with django_capture_on_commit_callbacks(execute=True):
            viewer.memberships.all().delete()
            viewer.groups.clear()

    async def scenario():
        comm, connected, _, _ = await ws_connect(viewer, f"/ws/campaigns/{world['alpha'].pk}/")
        assert connected
        await database_sync_to_async(revoke)()
        closed = await comm.receive_output(timeout=5)        # no snapshot after the revocation: the close
        await push(campaign_source(world["alpha"]))          # a change after it reaches nobody there
        after = []
        while not await comm.receive_nothing(timeout=0.3):
            after.append(await comm.receive_output())
        # the membership and the group each close it (twice RECHECK); never a snapshot after the revocation
        assert all(m["type"] == "websocket.close" for m in after), after
        _, reconnected, code, _ = await ws_connect(viewer, f"/ws/campaigns/{world['alpha'].pk}/")
        return closed, reconnected, code

    closed, reconnected, code = async_to_sync(scenario)()
    # closed to reconnect (realtime.RECHECK), and the reconnect is authorized afresh: refused
    assert closed == {"type": "websocket.close", "code": realtime.RECHECK}
    assert not reconnected and code == 4403


def test_the_campaign_socket_follows_the_chosen_page_and_state(world):
    async def scenario():
        comm, connected, _, first = await ws_connect(world["users"]["viewer"], f"/ws/campaigns/{world['alpha'].pk}/")
        assert first["data"]["tasks"][0]["state"] == "failed"  # failures first
        await comm.send_json_to({"state": "pending"})
        again = await comm.receive_json_from(timeout=5)
        await comm.disconnect()
        return again

    again = async_to_sync(scenario)()
    assert set(again["data"]["tasks"]) == {"columns", "rows"}     # the rows travel as a table
    snapshots.unpack(again["data"])
    assert again["data"]["state_filter"] == "pending"
    assert [t["task_number"] for t in again["data"]["tasks"]] == [2]


def test_roles_on_one_team_do_not_reach_another(world):
    lead = world["users"]["lead"]
    membership_set(user=lead, team=Team.objects.get(project="engineering"), role="viewer")
    from dashboards.core.roles import teams_with

    assert set(teams_with(lead, "bill").values_list("project", flat=True)) == {"research"}
    assert set(teams_with(lead, "view").values_list("project", flat=True)) == {"research", "engineering"}
    assert not teams_with(world["users"]["viewer"], "launch").exists()
    assert set(teams_with(world["users"]["urgent"], "urgent").values_list("project", flat=True)) == {"research"}


def test_recent_finished_tasks_link_to_visible_agent_pages_only(world):
    summary = queue.queue_summary(world["users"]["eng-viewer"])
    assert summary["recent_finished"] == []
    summary = queue.queue_summary(world["users"]["viewer"])
    assert {t["id"] for t in summary["recent_finished"]} == set(
        world["alpha"].tasks.filter(state__in=["done", "failed"]).values_list("pk", flat=True))
    assert dt.datetime.fromisoformat(summary["generated_at"].replace("Z", "+00:00")).tzinfo is not None


def test_users_who_see_the_same_teams_share_one_read_per_change_and_no_more(world, monkeypatch):
    calls = []
    real = queue.queue_summary

    def counting(user, **kwargs):
        calls.append(user.key)   # the audience scope it was built for (core.scope.Scope)
        return real(user, **kwargs)

    monkeypatch.setattr("dashboards.live.queue.queue_summary", counting)
    users = [world["users"][name] for name in ("viewer", "lead", "launcher", "eng-viewer")]

    async def scenario():
        comms = []
        for user in users:
            comm, ok, _, _ = await ws_connect(user, "/ws/queue/")
            assert ok
            comms.append(comm)
        calls.clear()
        await push("queue")
        got = [await next_of(c, "queue.snapshot") for c in comms]
        for c in comms:
            await c.disconnect()
        return got

    got = async_to_sync(scenario)()
    # one read for the three research users, one for engineering, each for its audience
    research, engineering = (Team.objects.get(project=p).pk for p in ("research", "engineering"))
    assert sorted(calls) == sorted([f"teams:{research}", f"teams:{engineering}"])
    assert [[c["name"] for c in g["data"]["campaigns"]] for g in got] == [["alpha"], ["alpha"], ["alpha"], ["beta"]]


def test_a_socket_is_sent_to_reauthorize_before_its_user_groups_expire(world, settings):
    """The socket's user and session groups (a logout, deactivation or role change closes it through
    them) are joined once; the channel layer drops them group_expiry seconds later (a day). A socket
    open longer would outlive a logout: it is closed with RECHECK at a quarter of group_expiry and the
    browser reconnects, authorized afresh. 1 s stands for the day."""
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer",
                                           "CONFIG": {"group_expiry": 1}}}
    viewer = world["users"]["viewer"]

    async def scenario():
        comm, connected, _, first = await ws_connect(viewer, "/ws/queue/")
        assert connected and first["kind"] == "queue.snapshot"
        while True:  # snapshots may come first; the close must come, within a few renew intervals
            out = await comm.receive_output(timeout=3)
            if out["type"] == "websocket.close":
                return out["code"]

    assert async_to_sync(scenario)() == realtime.RECHECK
