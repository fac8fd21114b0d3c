"""The ops pages through Django's test client: who may do what, forms that refuse bad input
and keep what was typed, confirmations, CSV export."""
from __future__ import annotations

import csv
import datetime as dt
import io

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.utils import timezone

from dashboards.core.clusters import cluster_get_default
from dashboards.models import AgentDefinition, AuditEntry, Budget, Campaign, ControlRequest, Task, Team
from dashboards.launch.submit import campaign_submit
from tests.support.history import make_campaign, make_task
from schedulers.fake import FakeScheduler
from tests.support.forms import HOSTILE, launch_data

pytestmark = [pytest.mark.django_db]

GET_PAGES = {
    "/ops/bills/": {"lead", "admin"},
    "/ops/bills.csv": {"lead", "admin"},
    "/ops/budgets/": {"lead", "admin"},
    "/ops/launch/": {"launcher", "urgent", "other", "admin"},
    "/ops/urgent/": {"urgent", "admin"},
    "/ops/triage/": {"admin"},
    "/ops/audit/": {"admin"},
    "/ops/agents/": {"launcher", "urgent", "other", "admin"},
}


@pytest.mark.parametrize("url, allowed", sorted(GET_PAGES.items()))
def test_each_page_is_refused_to_roles_that_must_not_have_it(as_user, url, allowed, monkeypatch):
    monkeypatch.setattr("dashboards.core.clusters.scheduler_for", lambda cluster, **options: FakeScheduler())
    for name in ("viewer", "lead", "launcher", "urgent", "other", "nobody", "admin"):
        response = as_user(name).get(url)
        expected = 200 if name in allowed else 403
        assert response.status_code == expected, (url, name, response.status_code)


def test_pages_need_a_login(client, bootstrap):
    for url in GET_PAGES:
        response = client.get(url)
        assert response.status_code == 302 and "/login/" in response["Location"]


def test_the_nav_shows_only_the_pages_a_role_may_use(as_user):
    html = as_user("lead").get("/").content.decode()
    assert 'href="/ops/bills/"' in html and 'href="/ops/launch/"' not in html and 'href="/ops/triage/"' not in html
    html = as_user("admin").get("/").content.decode()
    assert all(f'href="{u}"' in html for u in ("/ops/bills/", "/ops/launch/", "/ops/triage/", "/ops/audit/"))


def test_a_lead_reads_and_exports_a_bill(as_user, ops_users):
    research = Team.objects.get(project="research")
    campaign = make_campaign(team=research, user=ops_users["launcher"], name="sweep")
    today = timezone.now().date()
    start = dt.datetime.combine(today, dt.time(1), tzinfo=dt.timezone.utc)
    make_task(campaign, started_at=start, wallclock_s=12, cost_usd="0.125", tokens={"output_tokens": 40})
    client = as_user("lead")
    html = client.get("/ops/bills/", {"period": "day", "group_by": "campaign"}).content.decode()
    assert f"sweep (#{campaign.pk})" in html and "$0.1250" in html
    response = client.get("/ops/bills.csv", {"period": "day", "group_by": "campaign"})
    assert response["Content-Type"].startswith("text/csv") and "attachment" in response["Content-Disposition"]
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    assert rows == [rows[0]] and rows[0]["group"] == f"sweep (#{campaign.pk})" and rows[0]["cost_usd"] == "0.125"
    assert rows[0]["wallclock_s"] == "12.000" and rows[0]["output_tokens"] == "40"
    # A lead sees only their team's bill, even when asking for another team.
    engineering = Team.objects.get(project="engineering")
    response = client.get("/ops/bills/", {"team": engineering.pk})
    assert "Select a valid choice" in response.content.decode()
    response = client.get("/ops/bills.csv", {"team": engineering.pk})
    assert response.status_code == 400


def test_bad_bill_queries_say_what_is_wrong(as_user):
    client = as_user("lead")
    html = client.get("/ops/bills/", {"period": "year", "first": "2026-13-01"}).content.decode()
    assert "Select a valid choice" in html and "Enter a valid date" in html
    html = client.get("/ops/bills/", {"first": "2000-01-01", "last": "2026-01-01", "period": "day"}).content.decode()
    assert "at most 400 periods" in html


def test_a_lead_sets_a_budget_and_bad_input_keeps_what_was_typed(as_user, ops_users):
    client = as_user("lead")
    research = Team.objects.get(project="research")
    bad = {"team": research.pk, "period": "month", "amount_usd": "-5", "thresholds": "50, lots",
           "on_exceed": "hold", "alert_emails": "not-an-address"}
    html = client.post("/ops/budgets/", bad).content.decode()
    assert "greater than or equal to 0.01" in html and "not a number" in html and "is not an e-mail address" in html
    assert "50, lots" in html and "not-an-address" in html
    assert not Budget.objects.exists()
    good = {**bad, "amount_usd": "250", "thresholds": "80, 100", "alert_emails": "ops@example.org"}
    assert client.post("/ops/budgets/", good).status_code == 302
    budget = Budget.objects.get()
    assert budget.thresholds == [0.8, 1.0] and budget.on_exceed == "hold" and budget.alert_emails == "ops@example.org"
    assert AuditEntry.objects.filter(action="budget_set", ok=True).count() == 1
    engineering = Team.objects.get(project="engineering")
    html = client.post("/ops/budgets/", {**good, "team": engineering.pk}).content.decode()
    assert "Select a valid choice" in html and Budget.objects.count() == 1




@pytest.mark.parametrize("overrides, field", HOSTILE, ids=[f"{f}:{list(o.values())[0]!r}"[:40] for o, f in HOSTILE])
def test_hostile_launch_input_is_refused_submits_nothing_and_keeps_the_form(as_user, overrides, field):
    if overrides.get("team") == "engineering":
        overrides = {"team": Team.objects.get(project="engineering").pk}
    client = as_user("launcher")
    data = launch_data(**overrides)
    for button in ("preview", "launch"):
        response = client.post("/ops/launch/", {**data, button: "1"})
        html = response.content.decode()
        assert response.status_code == 200
        assert f'id="field-{field}"' in html
        field_html = html.split(f'id="field-{field}"', 1)[1].split('<div class="field"', 1)[0]
        assert "field-error" in field_html, (field, field_html)
        assert 'value="sweep-1"' in html or field == "name"
    assert not Campaign.objects.exists()
    assert not AuditEntry.objects.filter(ok=True).exists()


#: The capabilities each of ``ops_users`` has on some team, from the roles table of dashboards/core/roles.py.
CAPABILITIES_BY_USER = {
    "viewer": {"view"}, "lead": {"view", "bill"}, "launcher": {"view", "launch", "control"},
    "urgent": {"view", "launch", "control", "urgent"}, "other": {"view", "launch", "control"}, "nobody": set(),
    "admin": {"view", "bill", "launch", "control", "urgent", "triage", "audit"},
}


def test_a_users_capabilities_are_read_in_one_query_and_are_those_user_can_gives(ops_users,
                                                                                  django_assert_max_num_queries):
    from django.contrib.auth.models import AnonymousUser

    from dashboards.core.roles import CAPABILITIES, capabilities_of, user_can

    research = Team.objects.get(project="research")
    grouped = type(ops_users["nobody"]).objects.create_user("grouped", password=None)
    grouped.groups.add(research.group)  # in the team's group, no Membership row: a viewer
    inactive = type(ops_users["nobody"]).objects.create_user("inactive", password=None, is_active=False)
    users = {**ops_users, "grouped": grouped, "inactive": inactive, "anonymous": AnonymousUser()}
    expected = {**CAPABILITIES_BY_USER, "grouped": {"view"}, "inactive": set(), "anonymous": set()}
    for name, user in users.items():
        with django_assert_max_num_queries(2 if name in ("nobody", "grouped") else 1):
            found = capabilities_of(user)
        assert found == expected[name], name
        assert found == {c for c in CAPABILITIES if user_can(user, c)}, name


@pytest.mark.parametrize("name", sorted(CAPABILITIES_BY_USER))
def test_the_nav_reads_the_users_roles_once_per_request(ops_users, name, rf, django_assert_num_queries):
    from dashboards.templatetags.ops import ops_nav

    request = rf.get("/")
    request.user = ops_users[name]
    with django_assert_num_queries({"admin": 0, "nobody": 2}.get(name, 1)):  # nobody: roles, then team groups
        links = ops_nav({"request": request})["links"]
    with django_assert_num_queries(0):  # a second ask in the same request: already known
        assert ops_nav({"request": request})["links"] == links
    pages = {"Launch": "launch", "Urgent": "urgent", "Reservations": "launch", "Bills": "bill", "Budgets": "bill",
             "Triage": "triage", "Audit": "audit", "Agents": "launch"}
    assert [label for _, label in links] == [label for label, needs in pages.items()
                                             if needs in CAPABILITIES_BY_USER[name]]


def test_the_launch_page_and_its_forecast_read_each_thing_once(as_user, django_assert_max_num_queries, monkeypatch):
    """The launch form's selects read their choices once (Django's select reads them for its
    ``required`` check and again for its options), the navigation shares the view's own check of the
    user's roles, and the reservations are read on the form's default cluster: the 30 queries of the
    page are 19, the 50 of a forecast 39."""
    monkeypatch.setattr("dashboards.core.clusters.scheduler_for", lambda cluster, **options: FakeScheduler())
    client = as_user("launcher")
    client.get("/ops/launch/")  # the session's first save
    with django_assert_max_num_queries(19):
        html = client.get("/ops/launch/").content.decode()
    agent = AgentDefinition.objects.get(name="demo-agent")
    assert f'<option value="{agent.pk}">demo-agent v1</option>' in html and 'href="/ops/reservations/"' in html
    with django_assert_max_num_queries(39):
        html = client.post("/ops/launch/", {**launch_data(), "preview": "1"}).content.decode()
    assert 'id="forecast"' in html and 'id="launch-submit"' in html


def test_an_uploaded_jsonl_file_is_kept_in_the_form_when_something_else_is_wrong(as_user):
    client = as_user("launcher")
    upload = SimpleUploadedFile("inputs.jsonl", b'{"task": 7}\n{"task": 8}\n')
    html = client.post("/ops/launch/", {**launch_data(name="bad name", input_kind="jsonl"), "input_jsonl_file": upload,
                                        "preview": "1"}).content.decode()
    assert "{&quot;task&quot;: 7}" in html and not Campaign.objects.exists()


def test_a_launcher_sees_a_forecast_then_launches(as_user, ops_users):
    research = Team.objects.get(project="research")
    history = make_campaign(team=research, user=ops_users["launcher"])
    for n in range(1, 6):
        make_task(history, task_number=n, started_at=dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc),
                  cost_usd=str(n), tokens={"output_tokens": 100 * n})
    client = as_user("launcher")
    html = client.post("/ops/launch/", {**launch_data(), "preview": "1"}).content.decode()
    assert 'id="forecast"' in html and 'id="launch-submit"' in html and "$9.00" in html  # median $3 x 3 tasks
    assert not Campaign.objects.filter(name="sweep-1").exists()
    response = client.post("/ops/launch/", {**launch_data(), "launch": "1"})
    campaign = Campaign.objects.get(name="sweep-1")
    assert response.status_code == 302 and response["Location"] == f"/campaigns/{campaign.pk}/"
    assert campaign.task_count == 3 and campaign.launched_by == ops_users["launcher"]


def test_no_history_says_so(as_user):
    html = as_user("launcher").post("/ops/launch/", {**launch_data(), "preview": "1"}).content.decode()
    assert "No history" in html


def test_urgent_page_launches_one_agent_at_top_priority_for_urgent_launchers_only(as_user, ops_users):
    data = {"agent_definition": AgentDefinition.objects.get(name="demo-agent").pk,
            "team": Team.objects.get(project="research").pk, "queue": "agent.q", "seats_per_task": "1",
            "model": "", "name": "", "input": '{"task": 1}'}
    assert as_user("launcher").post("/ops/urgent/", data).status_code == 403
    assert not Campaign.objects.exists()
    assert AuditEntry.objects.get(action="urgent_launch").result.startswith("refused")
    assert as_user("lead").post("/ops/launch/", launch_data()).status_code == 403
    assert AuditEntry.objects.get(action="launch", user=ops_users["lead"]).ok is False
    html = as_user("urgent").post("/ops/urgent/", {**data, "input": "[1, 2]"}).content.decode()
    assert "a JSON object" in html and not Campaign.objects.exists()
    assert as_user("urgent").post("/ops/urgent/", data).status_code == 302
    campaign = Campaign.objects.get()
    assert campaign.urgent and campaign.priority == 1024 and campaign.task_count == 1


def submitted(ops_users, fake):
    research = Team.objects.get(project="research")
    from dashboards.launch.service import LaunchRequest, launch

    campaign = launch(user=ops_users["launcher"], request=LaunchRequest(
        team=research, agent_definition=AgentDefinition.objects.get(name="demo-agent"),
        inputs=[{"task": 1}, {"task": 2}], name="ctl")).campaign
    return campaign_submit(campaign_id=campaign.pk, scheduler=fake)


def test_campaign_control_asks_for_confirmation_then_queues(as_user, ops_users, monkeypatch,
                                                            django_capture_on_commit_callbacks):
    from dashboards.core import enqueue

    queued = []
    monkeypatch.setattr(enqueue, "send", lambda name, request_id: queued.append(request_id))
    campaign = submitted(ops_users, FakeScheduler())
    client = as_user("launcher")
    html = client.get(f"/ops/campaigns/{campaign.pk}/").content.decode()
    assert 'id="control-cancel"' in html
    response = client.post(f"/ops/campaigns/{campaign.pk}/control", {"action": "cancel"})
    assert 'id="confirm"' in response.content.decode() and queued == []
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(f"/ops/campaigns/{campaign.pk}/control", {"action": "cancel", "confirm": "on"})
    assert response.status_code == 302 and len(queued) == 1
    request = ControlRequest.objects.get(pk=queued[0])
    assert request.action == "campaign_cancel" and request.state == "queued" and request.control == "delete"
    assert request.audit.action == "campaign_cancel" and request.audit.params["status"] == "queued"


@pytest.mark.parametrize("role", ["viewer", "lead", "nobody", "other"])
def test_campaign_control_is_refused_on_the_page_to_roles_without_it(as_user, ops_users, role):
    campaign = submitted(ops_users, FakeScheduler())
    client = as_user(role)
    page = client.get(f"/ops/campaigns/{campaign.pk}/")
    if role in ("nobody", "other"):
        assert page.status_code == 404
    else:
        assert page.status_code == 200 and 'id="control-cancel"' not in page.content.decode()
    for action in ("cancel", "pause", "resume", "retry"):
        response = client.post(f"/ops/campaigns/{campaign.pk}/control", {"action": action, "confirm": "on"})
        assert response.status_code in (403, 404)
    assert not AuditEntry.objects.filter(ok=True).exclude(action="launch").exists()
    assert not AuditEntry.objects.filter(params__status="queued").exists()


def test_triage_actions_are_confirmed_and_refused_to_everyone_but_admins(as_user, ops_users, monkeypatch,
                                                                         django_capture_on_commit_callbacks):
    from dashboards.core import enqueue

    queued = []
    monkeypatch.setattr(enqueue, "send", lambda name, request_id: queued.append(request_id))
    Task.objects.create(cluster=cluster_get_default(), job_number=77, task_number=0, state="error",
                        submitted_at=timezone.now())
    post = {"action": "clear_error", "job_number": "77", "tasks": "", "priority": ""}
    for role in ("viewer", "lead", "launcher", "urgent", "nobody"):
        assert as_user(role).post("/ops/triage/action", {**post, "confirm": "True"}).status_code == 403
    assert AuditEntry.objects.filter(result__startswith="refused").count() == 5
    client = as_user("admin")
    html = client.post("/ops/triage/action", post).content.decode()
    assert "Clear error job 77?" in html and queued == []
    bad = client.post("/ops/triage/action", {**post, "action": "priority", "priority": "5000", "tasks": "1-x"})
    assert bad.status_code == 400 and "1024" in bad.content.decode() and "not a task number" in bad.content.decode()
    assert client.post("/ops/triage/action", {**post, "job_number": "-1 -u root"}).status_code == 400
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post("/ops/triage/action", {**post, "confirm": "True"})
    assert response.status_code == 302 and len(queued) == 1
    assert ControlRequest.objects.get(pk=queued[0]).control == "clear_error"


def test_the_audit_page_shows_who_did_what_when_and_the_result(as_user, ops_users):
    research = Team.objects.get(project="research")
    from dashboards.core.errors import ActionRefused
    from dashboards.launch.service import LaunchRequest, launch

    with pytest.raises(ActionRefused):
        launch(user=ops_users["viewer"], request=LaunchRequest(
            team=research, agent_definition=AgentDefinition.objects.get(name="demo-agent"), inputs=[{}],
            name="nope"))
    html = as_user("admin").get("/ops/audit/").content.decode()
    assert "viewer" in html and "launch" in html and "refused: you may not launch" in html


def test_admins_edit_the_agent_registry_with_validated_commands(as_user):
    data = {"name": "solver", "version": "1", "description": "", "command": '["python3", "-m", "x"]',
            "default_model": "", "default_policy": "", "input_kind": "params", "timeout_s": "60"}
    assert as_user("launcher").post("/ops/agents/", data).status_code == 403
    html = as_user("admin").post("/ops/agents/", data).content.decode()
    assert "absolute path" in html and not AgentDefinition.objects.filter(name="solver").exists()
    response = as_user("admin").post("/ops/agents/", {**data, "command": '["/usr/bin/python3", "-m", "x"]'})
    assert response.status_code == 302 and AgentDefinition.objects.filter(name="solver").exists()
