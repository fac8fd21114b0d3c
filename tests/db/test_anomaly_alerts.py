"""Anomaly alerts (dashboards.alerts): found once each, audited, shown to leads and admins, mailed to a real
SMTP sink and posted to a webhook receiver on loopback in Alertmanager's shape."""
from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import threading
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from django.utils import timezone

from dashboards.alerts import anomalies, delivery
from dashboards.models import AnomalyAlert, AuditEntry, Budget, Task, Team

from tests.support.campaigns import make_campaign
from tests.support.stack import free_port
from tests.support.history import make_campaign as ops_campaign
from tests.support.history import make_task

pytestmark = pytest.mark.django_db

REPO = Path(__file__).resolve().parents[2]


def quantile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks, written out here (numpy's default method)."""
    values = sorted(values)
    pos = (len(values) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (pos - lo)


@pytest.fixture
def alert_settings(settings):
    settings.TCO_ALERT_SLOW_PERCENTILE = 95.0
    settings.TCO_ALERT_SLOW_FACTOR = 3.0
    settings.TCO_ALERT_SLOW_MIN_S = 60.0
    settings.TCO_ALERT_HISTORY_TASKS = 500
    settings.TCO_ALERT_MIN_HISTORY = 20
    settings.TCO_ALERT_FAILURE_BURST = 5
    settings.TCO_ALERT_FAILURE_WINDOW_S = 600.0
    settings.TCO_ALERT_FAILURE_FRACTION = 0.5
    settings.TCO_ALERT_BURN_MIN_ELAPSED = 0.1
    settings.TCO_ALERT_EMAIL = False
    settings.TCO_ALERT_WEBHOOK_URL = ""
    settings.TCO_SITE_URL = "https://tco.example.org"
    return settings


def _history(team, user, waits: list[float], runs: list[float] | None = None, *, now, job: int = 5000):
    """A finished campaign whose tasks waited ``waits`` seconds (and ran ``runs`` seconds)."""
    runs = runs or [100.0] * len(waits)
    tasks = []
    for n, (wait, run) in enumerate(zip(waits, runs)):
        submitted = now - dt.timedelta(days=1, minutes=n)
        started = submitted + dt.timedelta(seconds=wait)
        tasks.append({"state": "done", "queue": "agent.q", "submitted_at": submitted, "started_at": started,
                      "task_started_at": started, "ended_at": started + dt.timedelta(seconds=run)})
    return make_campaign(team=team, user=user, name="history", job_number=job, status="finished", tasks=tasks)


def test_tasks_pending_far_longer_than_their_queue_and_agent_make_one_alert(bootstrap, ops_users, alert_settings):
    research = Team.objects.get(project="research")
    now = timezone.now()
    waits = [10.0 + n for n in range(25)]  # 10..34 s: p95 = 32.8 s, 3 x = 98.4 s
    _history(research, ops_users["launcher"], waits, now=now)
    slow = make_campaign(team=research, user=ops_users["launcher"], name="slowpoke", job_number=6000, tasks=[
        {"state": "pending", "submitted_at": now - dt.timedelta(seconds=500)},
        {"state": "pending", "submitted_at": now - dt.timedelta(seconds=200)},
        {"state": "pending", "submitted_at": now - dt.timedelta(seconds=20)},  # usual
        {"state": "held", "state_code": "hqw", "submitted_at": now - dt.timedelta(seconds=900)},  # held: not slow
    ])
    created = anomalies.anomaly_check(now=now)
    assert [a.kind for a in created] == ["task_pending"]
    alert = created[0]
    assert alert.campaign == slow and alert.team == research
    assert alert.task.task_number == 1
    assert alert.details["tasks"] == 2 and alert.details["history"] == 25
    assert alert.details["usual_s"] == pytest.approx(quantile(waits, 0.95), abs=1e-3)
    assert alert.details["threshold_s"] == pytest.approx(3 * quantile(waits, 0.95), abs=1e-3)
    assert "95th percentile of the last 25 queue waits of agent demo-agent in agent.q is 33 s" in alert.text
    assert "task 1 for 8 min 20 s" in alert.text
    # Once: the next check (or a concurrent one) records nothing more, and the audit says it once.
    assert anomalies.anomaly_check(now=now + dt.timedelta(minutes=5)) == []
    assert AnomalyAlert.objects.count() == 1
    entries = AuditEntry.objects.filter(action=anomalies.ALERT_ACTION)
    assert entries.count() == 1 and entries[0].target == f"anomaly_alert:{alert.pk}"
    assert entries[0].params["kind"] == "task_pending" and entries[0].user is None


def test_no_alert_without_enough_history_or_under_the_floor(bootstrap, ops_users, alert_settings):
    research = Team.objects.get(project="research")
    now = timezone.now()
    _history(research, ops_users["launcher"], [1.0] * 19, now=now)  # one short of TCO_ALERT_MIN_HISTORY
    make_campaign(team=research, user=ops_users["launcher"], name="waiting", job_number=6001,
                  tasks=[{"state": "pending", "submitted_at": now - dt.timedelta(seconds=3000)}])
    assert anomalies.anomaly_check(now=now) == []
    _history(research, ops_users["launcher"], [1.0], now=now, job=5001)  # now 20 waits of 1 s
    alert_settings.TCO_ALERT_SLOW_MIN_S = 3600.0  # but 3,000 s is under the site's floor
    assert anomalies.anomaly_check(now=now) == []
    alert_settings.TCO_ALERT_SLOW_MIN_S = 60.0
    assert [a.kind for a in anomalies.anomaly_check(now=now)] == ["task_pending"]


def test_a_task_running_far_longer_than_its_agents_runs(bootstrap, ops_users, alert_settings):
    research = Team.objects.get(project="research")
    now = timezone.now()
    runs = [60.0 + 2 * n for n in range(30)]  # 60..118 s
    _history(research, ops_users["launcher"], [5.0] * 30, runs, now=now)
    long = make_campaign(team=research, user=ops_users["launcher"], name="long", job_number=6002, tasks=[
        {"state": "running", "queue": "agent.q", "submitted_at": now - dt.timedelta(hours=2),
         "started_at": now - dt.timedelta(hours=1), "task_started_at": now - dt.timedelta(hours=1)},
        {"state": "running", "queue": "agent.q", "submitted_at": now - dt.timedelta(minutes=2),
         "started_at": now - dt.timedelta(seconds=90)}])
    created = anomalies.anomaly_check(now=now)
    assert [(a.kind, a.campaign_id, a.details["tasks"]) for a in created] == [("task_running", long.pk, 1)]
    assert created[0].details["usual_s"] == pytest.approx(quantile(runs, 0.95), abs=1e-3)
    assert "run times" in created[0].text and "for 1 h 00 min" in created[0].text


def test_a_burst_of_failures_alerts_once_per_burst(bootstrap, ops_users, alert_settings):
    research = Team.objects.get(project="research")
    now = timezone.now()
    burst = make_campaign(team=research, user=ops_users["launcher"], name="burst", job_number=7000, tasks=[
        *({"state": "failed", "exit_status": 2, "failed_code": 0, "ended_at": now - dt.timedelta(seconds=30 * n)}
          for n in range(1, 7)),
        {"state": "done", "exit_status": 0, "ended_at": now - dt.timedelta(seconds=10)},
        {"state": "failed", "exit_status": 1, "ended_at": now - dt.timedelta(hours=2)},  # long ago
    ])
    # Another campaign fails as often, but among many that succeed: no burst.
    make_campaign(team=research, user=ops_users["launcher"], name="mostly-fine", job_number=7001, tasks=[
        *({"state": "failed", "exit_status": 2, "ended_at": now - dt.timedelta(seconds=20)} for _ in range(6)),
        *({"state": "done", "exit_status": 0, "ended_at": now - dt.timedelta(seconds=20)} for _ in range(7))])
    created = anomalies.anomaly_check(now=now)
    assert [(a.kind, a.campaign_id, a.severity) for a in created] == [("campaign_failures", burst.pk, "critical")]
    assert (created[0].details["failed"], created[0].details["ended"], created[0].details["infrastructure"]) == (6, 7, 0)
    assert created[0].title.endswith("failed within 10 min")
    assert "6 with exit status 2 failed or" not in created[0].text and "(6 with exit status 2)" in created[0].text
    assert anomalies.anomaly_check(now=now + dt.timedelta(seconds=30)) == []
    # Five new failures after the alert make a new burst; the ones already told are not counted again.
    later = now + dt.timedelta(minutes=3)
    for n in range(5):
        Task.objects.create(cluster=burst.cluster, campaign=burst, job_number=7000, task_number=20 + n,
                            state="failed", active=False, exit_status=3, ended_at=later - dt.timedelta(seconds=n))
    again = anomalies.anomaly_check(now=later + dt.timedelta(seconds=1))
    assert [(a.key, a.details["failed"]) for a in again] == [(f"campaign_failures:{burst.pk}:2", 5)]


def test_a_budget_spent_too_fast_names_the_day_it_runs_out(bootstrap, ops_users, alert_settings):
    research = Team.objects.get(project="research")
    engineering = Team.objects.get(project="engineering")
    Budget.objects.create(team=research, period="month", amount_usd=Decimal("100"), thresholds=[])
    Budget.objects.create(team=engineering, period="month", amount_usd=Decimal("100"), thresholds=[])
    now = dt.datetime(2026, 5, 11, tzinfo=dt.timezone.utc)  # 10 days of May gone (cluster time zone UTC)
    spender = ops_campaign(team=research, user=ops_users["launcher"], name="spender")
    saver = ops_campaign(team=engineering, user=ops_users["other"], name="saver")
    make_task(spender, task_number=1, started_at=dt.datetime(2026, 5, 3, tzinfo=dt.timezone.utc), cost_usd="60")
    make_task(saver, task_number=1, started_at=dt.datetime(2026, 5, 3, tzinfo=dt.timezone.utc), cost_usd="10")
    created = anomalies.anomaly_check(now=now)
    assert [(a.kind, a.team.project) for a in created] == [("budget_burn", "research")]
    # $60 in 10 days is $6 a day; the $40 left last 6.67 days: to May 17th, 16:00.
    exhausted = now + dt.timedelta(seconds=40 / (60 / (10 * 86400)))
    assert exhausted.date() == dt.date(2026, 5, 17)
    alert = created[0]
    assert alert.details["exhausted_on"] == "2026-05-17" and alert.details["period_ends_on"] == "2026-05-31"
    assert "runs out on 2026-05-17" in alert.title and "$6.00 a day" in alert.text
    assert anomalies.anomaly_check(now=now + dt.timedelta(days=1)) == []  # once per budget and period
    # Too early in the period to judge: nothing, even at a rate that would exhaust it.
    alert.delete()
    assert anomalies.budget_burn_alerts(now=dt.datetime(2026, 5, 3, 12, tzinfo=dt.timezone.utc)) == []


# --------------------------------------------------------------------------- delivery

class Sink:
    """A real SMTP server (aiosmtpd) on a free loopback port that keeps what it receives."""

    def __init__(self) -> None:
        from aiosmtpd.controller import Controller

        self.messages: list[dict] = []
        self.port = free_port()
        self.controller = Controller(self, hostname="127.0.0.1", port=self.port)

    async def handle_DATA(self, server, session, envelope):  # aiosmtpd's handler hook
        self.messages.append({"to": list(envelope.rcpt_tos), "data": envelope.content.decode("utf-8", "replace")})
        return "250 OK"


@pytest.fixture
def smtp_sink(settings):
    sink = Sink()
    sink.controller.start()
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT, settings.EMAIL_USE_TLS = "127.0.0.1", sink.port, False
    settings.EMAIL_HOST_USER = settings.EMAIL_HOST_PASSWORD = ""
    yield sink
    sink.controller.stop()


class Receiver:
    """An HTTP receiver on a free loopback port that keeps each POST's JSON and answers ``status``."""

    def __init__(self) -> None:
        self.posts: list[dict] = []
        self.status = 200
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.posts.append({"path": self.path, "headers": dict(self.headers), "json": json.loads(body)})
                self.send_response(receiver.status)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        # shutdown() waits for the loop's next poll: 0.05 s, not the default 0.5 s a test.
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)


@pytest.fixture
def webhook(settings):
    receiver = Receiver()
    receiver.thread.start()
    settings.TCO_ALERT_WEBHOOK_URL = receiver.url
    settings.TCO_ALERT_WEBHOOK_TOKEN = "hook-secret"
    yield receiver
    receiver.server.shutdown()
    receiver.server.server_close()


def _burst(team, user, now, job=8000):
    return make_campaign(team=team, user=user, name="burst", job_number=job, tasks=[
        {"state": "failed", "exit_status": 1, "ended_at": now - dt.timedelta(seconds=n)} for n in range(1, 6)])


def test_an_alert_is_mailed_to_the_leads_and_admins_and_posted_once(bootstrap, ops_users, alert_settings, smtp_sink,
                                                                     webhook, django_capture_on_commit_callbacks):
    alert_settings.TCO_ALERT_EMAIL = True
    admin = ops_users["admin"]
    admin.email = "admin@example.org"
    admin.save()
    research = Team.objects.get(project="research")
    now = timezone.now()
    campaign = _burst(research, ops_users["launcher"], now)
    with django_capture_on_commit_callbacks(execute=True):
        created = anomalies.anomaly_check(now=now)
    assert len(created) == 1
    alert = created[0]
    # The leads of the team (not its launchers or viewers, not other teams) and the admins.
    assert [sorted(m["to"]) for m in smtp_sink.messages] == [["admin@example.org", "lead@example.org"]]
    assert f"Subject: [tco] {alert.title}" in smtp_sink.messages[0]["data"]
    assert f"https://tco.example.org/campaigns/{campaign.pk}/" in smtp_sink.messages[0]["data"]
    # Alertmanager's webhook message, with the token.
    assert len(webhook.posts) == 1
    post = webhook.posts[0]
    assert post["path"] == "/hook" and post["headers"]["Authorization"] == "Bearer hook-secret"
    body = post["json"]
    assert body["version"] == "4" and body["status"] == "firing" and body["receiver"] == "tco"
    assert body["groupLabels"] == {"alertname": "TcoCampaignFailureBurst"}
    item = body["alerts"][0]
    assert item["status"] == "firing" and item["endsAt"] == delivery.NO_END
    assert item["labels"] == {"alertname": "TcoCampaignFailureBurst", "severity": "critical", "team": "research",
                              "project": "research", "kind": "campaign_failures", "source": "tco",
                              "campaign": "burst", "campaign_id": str(campaign.pk)}
    assert item["annotations"]["summary"] == alert.title and item["annotations"]["description"] == alert.text
    assert item["generatorURL"] == f"https://tco.example.org/campaigns/{campaign.pk}/"
    assert dt.datetime.fromisoformat(item["startsAt"].replace("Z", "+00:00")) == alert.starts_at
    assert len(item["fingerprint"]) == 16
    # Each delivery audited; a second check sends nothing more.
    target = f"anomaly_alert:{alert.pk}"
    assert list(AuditEntry.objects.filter(target=target).order_by("id").values_list("action", "ok")) == [
        (anomalies.ALERT_ACTION, True), (delivery.MAIL_ACTION, True), (delivery.WEBHOOK_ACTION, True)]
    with django_capture_on_commit_callbacks(execute=True):
        assert anomalies.anomaly_check(now=now + dt.timedelta(seconds=5)) == []
    assert len(smtp_sink.messages) == 1 and len(webhook.posts) == 1


def test_the_alertmanager_api_form_and_a_refusing_webhook(bootstrap, ops_users, alert_settings, webhook,
                                                           django_capture_on_commit_callbacks):
    alert_settings.TCO_ALERT_WEBHOOK_FORMAT = "alertmanager"
    webhook.status = 500
    research = Team.objects.get(project="research")
    now = timezone.now()
    _burst(research, ops_users["launcher"], now)
    with django_capture_on_commit_callbacks(execute=True):
        alert = anomalies.anomaly_check(now=now)[0]
    body = webhook.posts[0]["json"]
    assert isinstance(body, list) and set(body[0]) == {"labels", "annotations", "startsAt", "generatorURL"}
    assert body[0]["labels"]["alertname"] == "TcoCampaignFailureBurst"
    entry = AuditEntry.objects.get(action=delivery.WEBHOOK_ACTION, target=f"anomaly_alert:{alert.pk}")
    assert entry.ok is False and entry.result == "not sent: HTTP 500 Internal Server Error"
    # The alert stays on the pages whatever the webhook said.
    assert AnomalyAlert.objects.filter(pk=alert.pk).exists()


def test_a_webhook_nobody_listens_on_is_audited_not_raised(bootstrap, ops_users, alert_settings,
                                                             django_capture_on_commit_callbacks):
    alert_settings.TCO_ALERT_WEBHOOK_URL = f"http://127.0.0.1:{free_port()}/hook"
    research = Team.objects.get(project="research")
    now = timezone.now()
    _burst(research, ops_users["launcher"], now)
    with django_capture_on_commit_callbacks(execute=True):
        alert = anomalies.anomaly_check(now=now)[0]
    entry = AuditEntry.objects.get(action=delivery.WEBHOOK_ACTION, target=f"anomaly_alert:{alert.pk}")
    assert entry.ok is False and "refused" in entry.result.lower()


# --------------------------------------------------------------------------- notices, settings, schedule

def test_the_notice_shows_to_the_teams_leads_and_the_admins_only(client, bootstrap, ops_users, alert_settings):
    research = Team.objects.get(project="research")
    now = timezone.now()
    _burst(research, ops_users["launcher"], now)
    alert = anomalies.anomaly_check(now=now)[0]
    for name, sees in (("lead", True), ("admin", True), ("viewer", False), ("launcher", False), ("other", False)):
        client.force_login(ops_users[name])
        page = client.get("/")
        assert page.status_code == 200
        assert (f'data-notice="anomaly-{alert.pk}"' in page.content.decode()) is sees, name
        if sees:
            assert f'<a href="/campaigns/{alert.campaign_id}/"' in page.content.decode()
    AnomalyAlert.objects.filter(pk=alert.pk).update(at=now - dt.timedelta(hours=25))
    client.force_login(ops_users["lead"])
    assert f'data-notice="anomaly-{alert.pk}"' not in client.get("/").content.decode()


@pytest.mark.parametrize("name,value", [("TCO_ALERT_SLOW_FACTOR", "0"), ("TCO_ALERT_SLOW_PERCENTILE", "ninety"),
                                        ("TCO_ALERT_FAILURE_FRACTION", "1.5"), ("TCO_ALERT_WEBHOOK_URL", "ftp://x"),
                                        ("TCO_ALERT_WEBHOOK_FORMAT", "slack")])
def test_a_bad_threshold_stops_start_up_naming_it(name, value, monkeypatch):
    """The settings module read again with the bad value (what start-up runs; the test below starts a
    fresh interpreter once), then again as it was."""
    import importlib

    from django.core.exceptions import ImproperlyConfigured

    import tco_web.settings as module

    before = {key: value for key, value in vars(module).items() if key.startswith("TCO_ALERT_")}
    try:
        with monkeypatch.context() as patched:
            patched.setenv(name, value)
            with pytest.raises(ImproperlyConfigured) as caught:
                importlib.reload(module)
    finally:
        importlib.reload(module)
    assert name in str(caught.value)
    assert {key: value for key, value in vars(module).items() if key.startswith("TCO_ALERT_")} == before


def test_a_bad_threshold_stops_the_start_up_of_a_fresh_process(tmp_path):
    env = {**os.environ, "TCO_ALERT_SLOW_PERCENTILE": "ninety", "TCO_STATE_DIR": str(tmp_path),
           "PYTHONPATH": str(REPO), "DJANGO_SETTINGS_MODULE": "tco_web.settings"}
    done = subprocess.run([sys.executable, "-c", "import django; django.setup()"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "ImproperlyConfigured" in done.stderr and "TCO_ALERT_SLOW_PERCENTILE" in done.stderr


def test_the_check_runs_periodically_and_expires():
    from tco_web import celery as celery_app

    calls = []

    class Sender:
        def add_periodic_task(self, interval, signature, name):
            calls.append((interval, signature, name))

        def signature(self, task, expires):
            return {"task": task, "expires": expires}

    celery_app.setup_periodic_tasks(Sender())
    from django.conf import settings

    found = [(i, s) for i, s, _n in calls if s["task"] == "worker.tasks.alert_anomalies"]
    assert found == [(settings.TCO_ALERT_INTERVAL_S, {"task": "worker.tasks.alert_anomalies",
                                                      "expires": settings.TCO_ALERT_INTERVAL_S * 1.5})]
    import worker.tasks  # noqa: F401 - registers the task

    assert "worker.tasks.alert_anomalies" in celery_app.app.tasks


def test_a_burst_of_a_lost_hosts_failures_says_they_are_the_infrastructures(bootstrap, ops_users, alert_settings):
    # A fresh user read "6 of 8 tasks of sweep-review failed" as the agents' failures; the campaign page blamed
    # a crashed host (failed 19). The alert says the infrastructure's share (core.failures' rule).
    research = Team.objects.get(project="research")
    now = timezone.now()
    crashed = make_campaign(team=research, user=ops_users["launcher"], name="crashed", job_number=7100, tasks=[
        *({"state": "failed", "exit_status": 0, "failed_code": 19, "ended_at": now - dt.timedelta(seconds=20 + n)}
          for n in range(4)),
        *({"state": "failed", "exit_status": 2, "failed_code": 0, "ended_at": now - dt.timedelta(seconds=10 + n)}
          for n in range(2)),
    ])
    (alert,) = anomalies.anomaly_check(now=now)
    assert (alert.campaign_id, alert.details["failed"], alert.details["infrastructure"]) == (crashed.pk, 6, 4)
    assert alert.title.endswith("tasks of crashed (#%d) failed within 10 min (4 the infrastructure's)" % crashed.pk)


def _delete_asked(campaign, at):
    """A delete of ``campaign``'s job asked of tco at ``at`` (a cancel's control request)."""
    from dashboards.models import ControlRequest

    request = ControlRequest.objects.create(cluster=campaign.cluster, campaign=campaign, action="campaign_cancel",
                                            control="delete", job_number=campaign.job_number)
    ControlRequest.objects.filter(pk=request.pk).update(created_at=at)


def test_tasks_killed_by_a_cancel_are_no_failure_burst(bootstrap, ops_users, alert_settings):
    # Found 2026-12-03: a campaign cancelled while 35 of its tasks ran made "35 of 35 tasks of replay-research
    # failed within 10 min": qdel's kill is Grid Engine's failed 100 (exit 137 or 143), someone's decision.
    research = Team.objects.get(project="research")
    now = timezone.now()
    cancelled = make_campaign(team=research, user=ops_users["launcher"], name="cancelled", job_number=7200, tasks=[
        {"state": "failed", "exit_status": 137 + 6 * (n % 2), "failed_code": 100,
         "ended_at": now - dt.timedelta(seconds=10 + n)} for n in range(8)])
    _delete_asked(cancelled, now - dt.timedelta(minutes=1))
    assert anomalies.anomaly_check(now=now) == []
    # Real failures beside many cancelled tasks: counted against the tasks that ended by themselves (5 of 5, not
    # 5 of 15, under the 50 % fraction), the cancelled ones said apart.
    mixed = make_campaign(team=research, user=ops_users["launcher"], name="mixed", job_number=7201, tasks=[
        *({"state": "failed", "exit_status": 1, "failed_code": 0, "ended_at": now - dt.timedelta(seconds=20 + n)}
          for n in range(5)),
        *({"state": "failed", "exit_status": 143, "failed_code": 100, "ended_at": now - dt.timedelta(seconds=5 + n)}
          for n in range(10))])
    _delete_asked(mixed, now - dt.timedelta(minutes=1))
    (alert,) = anomalies.anomaly_check(now=now + dt.timedelta(seconds=1))
    assert (alert.campaign_id, alert.details["failed"], alert.details["ended"], alert.details["decided"]) == \
        (mixed.pk, 5, 5, 10)
    assert "; 10 more were killed by a cancel or delete asked of tco, not counted." in alert.text
    assert [c["exit_status"] for c in alert.details["causes"]] == [1]


def test_tasks_killed_without_a_delete_asked_are_failures(bootstrap, ops_users, alert_settings):
    # Failed 100 alone is the OOM killer or an h_rt kill as well as a qdel: without a delete asked of tco (or
    # with one asked after the tasks had ended) they stay failures.
    research = Team.objects.get(project="research")
    now = timezone.now()
    killed = make_campaign(team=research, user=ops_users["launcher"], name="oom", job_number=7202, tasks=[
        {"state": "failed", "exit_status": 137, "failed_code": 100, "ended_at": now - dt.timedelta(seconds=30 + n)}
        for n in range(6)])
    _delete_asked(killed, now - dt.timedelta(seconds=5))  # after they ended
    (alert,) = anomalies.anomaly_check(now=now)
    assert (alert.campaign_id, alert.details["failed"], alert.details["decided"]) == (killed.pk, 6, 0)


def test_the_failures_tile_leaves_tasks_killed_by_a_cancel_out(bootstrap, ops_users, alert_settings):
    from dashboards.web.landing import landing_tiles

    research = Team.objects.get(project="research")
    now = timezone.now()
    tile = make_campaign(team=research, user=ops_users["launcher"], name="tile", job_number=7300, tasks=[
        *({"state": "failed", "exit_status": 143, "failed_code": 100, "ended_at": now - dt.timedelta(minutes=5)}
          for _ in range(4)),
        {"state": "failed", "exit_status": 2, "failed_code": 0, "ended_at": now - dt.timedelta(minutes=5)},
        {"state": "done", "exit_status": 0, "failed_code": 0, "ended_at": now - dt.timedelta(minutes=5)}])
    _delete_asked(tile, now - dt.timedelta(minutes=6))
    tiles = {t["key"]: t for t in landing_tiles(ops_users["launcher"], seat_resource="anthropic_api", now=now)}
    assert (tiles["failed"]["number"], tiles["failed"]["value"]) == (1, "1 task")
    assert "of 2 tasks that ended; 4 more killed by a cancel, not counted" in tiles["failed"]["detail"]


def test_a_slow_tasks_notice_ends_with_its_campaigns_last_such_task(bootstrap, ops_users, alert_settings):
    # Found 2026-12-03: "60 task(s) of demo (#1) running for up to 7 min 49 s" stayed on every lead's page for a
    # day after the campaign had finished.
    from dashboards.alerts.notices import alert_notices

    research = Team.objects.get(project="research")
    now = timezone.now()
    _history(research, ops_users["launcher"], [5.0] * 30, [60.0 + 2 * n for n in range(30)], now=now)
    long = make_campaign(team=research, user=ops_users["launcher"], name="long", job_number=6003, tasks=[
        {"state": "running", "queue": "agent.q", "submitted_at": now - dt.timedelta(hours=2),
         "started_at": now - dt.timedelta(hours=1), "task_started_at": now - dt.timedelta(hours=1)}])
    (alert,) = anomalies.anomaly_check(now=now)
    lead = ops_users["lead"]
    assert [a.pk for a in alert_notices(lead)["alerts"]] == [alert.pk]
    Task.objects.filter(campaign=long).update(state="done", active=False, ended_at=now)
    assert alert_notices(lead)["alerts"] == []
    # A burst of failures is no phase that ends: it stays for TCO_ALERT_NOTICE_HOURS.
    burst = _burst(research, ops_users["launcher"], now)
    (failures,) = anomalies.anomaly_check(now=now)
    assert failures.campaign_id == burst.pk and [a.pk for a in alert_notices(lead)["alerts"]] == [failures.pk]
