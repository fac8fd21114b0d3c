"""Advance reservations and resource reservation (issue 17, items 1 and 3): the qrstat parser on
real captured XML, the qrsub/qrdel argv (no option injection), the pending reasons, and the
dashboard's booking service (roles, audit, another team's reservation refused)."""
from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from schedulers.fake import FakeScheduler


FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
OCS = FIXTURES / "ocs920"
SGE = FIXTURES / "sge819"
UTC = dt.timezone.utc
NOW = dt.datetime(2026, 12, 1, 17, 19, tzinfo=UTC)


# --------------------------------------------------------------------------- parser


@pytest.mark.django_db
def test_a_launcher_books_for_their_team_and_the_status_and_queue_rows_show_it(booking_env, ops_users):
    from dashboards.core.clusters import cluster_get_default
    from dashboards.models import AuditEntry, Team
    from dashboards.launch.reservations import rows_for

    research = Team.objects.get(project="research")
    booked = _book(ops_users["launcher"], research, booking_env)
    assert booked.ar_id == 1 and booked.team == research and booked.booked_by == ops_users["launcher"]
    entry = AuditEntry.objects.get(action="reservation_book")
    assert entry.ok and entry.target == "reservation:1" and entry.user == ops_users["launcher"]
    status = cluster_get_default().status
    (row,) = status["reservations"]
    assert row["id"] == 1 and row["team"] == "research" and row["booked_by"] == "launcher"
    assert isinstance(row["start_at"], str)  # JSON-ready in the stored status
    (shown,) = rows_for(ops_users["viewer"], cluster_get_default())
    assert shown["team_name"] == research.name and shown["seats"] == 2 and shown["used_slots"] == 0
    assert rows_for(ops_users["other"], cluster_get_default()) == []  # engineering does not see research's


@pytest.mark.django_db
@pytest.mark.parametrize("who", ["viewer", "lead", "other", "nobody"])
def test_only_launchers_of_the_team_book_and_a_refusal_is_audited(booking_env, ops_users, who):
    from dashboards.core.errors import ActionRefused
    from dashboards.models import AuditEntry, Reservation, Team

    with pytest.raises(ActionRefused):
        _book(ops_users[who], Team.objects.get(project="research"), booking_env)
    assert booking_env.reservation_calls == [] and not Reservation.objects.exists()
    assert not AuditEntry.objects.get(action="reservation_book").ok


@pytest.mark.django_db
def test_a_launcher_cannot_hold_capacity_from_every_other_team_for_a_week(booking_env, ops_users, settings):
    """The attack: a launcher books the seats for a week, and no other team's agent gets one."""
    from dashboards.models import AuditEntry, Reservation, Team
    from dashboards.core.errors import LaunchError

    settings.TCO_RESERVATION_MAX_S = 24 * 3600
    research = Team.objects.get(project="research")
    with pytest.raises(LaunchError, match=r"duration: at most 86400 s \(24 h\)"):
        _book(ops_users["launcher"], research, booking_env, duration_s=7 * 24 * 3600)
    assert booking_env.reservation_calls == [] and not Reservation.objects.exists()
    assert not AuditEntry.objects.get(action="reservation_book").ok
    _book(ops_users["launcher"], research, booking_env, duration_s=24 * 3600)  # the limit itself is allowed
    ops_users["launcher"].is_staff = True  # an admin may book longer
    _book(ops_users["launcher"], research, booking_env, duration_s=7 * 24 * 3600)
    assert Reservation.objects.count() == 2


@pytest.mark.django_db
def test_a_name_that_is_an_option_never_reaches_qrsub(booking_env, ops_users):
    """The attack: a reservation name '-u' (or '-w v') would be read by qrsub as an option."""
    from dashboards.models import AuditEntry, Reservation, Team
    from dashboards.core.errors import LaunchError

    for name in ("-u", "-w v", "x;rm -rf /"):
        with pytest.raises(LaunchError, match="reservation name"):
            _book(ops_users["launcher"], Team.objects.get(project="research"), booking_env, name=name)
    assert booking_env.reservation_calls == [] and not Reservation.objects.exists()
    assert AuditEntry.objects.filter(action="reservation_book", ok=False).count() == 3


@pytest.mark.django_db
def test_launching_into_another_teams_reservation_is_refused(booking_env, ops_users, monkeypatch):
    from dashboards.core import enqueue
    from dashboards.launch.service import LaunchRequest, launch
    from dashboards.models import AgentDefinition, Campaign, Team
    from dashboards.core.errors import LaunchError

    monkeypatch.setattr(enqueue, "send", lambda *a, **k: None)
    research, engineering = Team.objects.get(project="research"), Team.objects.get(project="engineering")
    ar = _book(ops_users["launcher"], research, booking_env).ar_id
    agent = AgentDefinition.objects.get(name="demo-agent")
    with pytest.raises(LaunchError, match=f"advance reservation {ar} was booked for team"):
        launch(user=ops_users["other"], request=LaunchRequest(team=engineering, agent_definition=agent,
                                                              inputs=[{"task": 1}], name="steal",
                                                              advance_reservation=ar))
    assert not Campaign.objects.exists()
    outcome = launch(user=ops_users["launcher"], request=LaunchRequest(team=research, agent_definition=agent,
                                                                       inputs=[{"task": 1}], name="mine",
                                                                       advance_reservation=ar))
    assert outcome.campaign.advance_reservation == ar


@pytest.mark.django_db
def test_the_launch_form_offers_only_the_users_teams_reservations(booking_env, ops_users):
    from dashboards.web.forms import LaunchForm
    from dashboards.models import Team

    ar = _book(ops_users["launcher"], Team.objects.get(project="research"), booking_env).ar_id
    mine = [value for value, _ in LaunchForm(user=ops_users["launcher"]).fields["advance_reservation"].choices]
    theirs = [value for value, _ in LaunchForm(user=ops_users["other"]).fields["advance_reservation"].choices]
    assert ar in mine and ar not in theirs


@pytest.mark.django_db
def test_deleting_a_reservation_needs_its_teams_launch_role(booking_env, ops_users):
    from dashboards.core.errors import ActionRefused
    from dashboards.core.clusters import cluster_get_default
    from dashboards.models import Team
    from dashboards.launch.reservations import delete

    ar = _book(ops_users["launcher"], Team.objects.get(project="research"), booking_env).ar_id
    with pytest.raises(ActionRefused):
        delete(user=ops_users["other"], cluster=cluster_get_default(), ar_id=ar, scheduler=booking_env)
    assert booking_env.reservations()
    delete(user=ops_users["launcher"], cluster=cluster_get_default(), ar_id=ar, scheduler=booking_env)
    assert booking_env.reservations() == [] and cluster_get_default().status["reservations"] == []


@pytest.mark.django_db
def test_the_reservations_page_books_and_lists(booking_env, ops_users, client, monkeypatch):
    

    monkeypatch.setattr("dashboards.core.clusters.scheduler_for", lambda cluster, **kw: booking_env)
    client.force_login(ops_users["launcher"])
    page = client.get("/ops/reservations/")
    assert page.status_code == 200 and b"reservation-form" in page.content
    start = (dt.datetime.now(UTC) + dt.timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M")
    from dashboards.models import Team
    team = Team.objects.get(project="research")
    answer = client.post("/ops/reservations/", {"team": team.pk, "name": "page-booking", "start": start,
                                                "duration_min": 30, "queue": "agent.q", "slots": 1, "seats": 1},
                         follow=True)
    assert b"page-booking" in answer.content and b'id="reservation-1"' in answer.content
    injected = client.post("/ops/reservations/", {"team": team.pk, "name": "-u", "start": start, "duration_min": 30,
                                                  "queue": "agent.q", "slots": 1, "seats": 1})
    assert injected.status_code == 200 and b"a letter first" in injected.content
    assert len(booking_env.reservation_calls) == 1  # only the first booking reached qrsub
    queue = client.get("/")
    assert b'id="reservation-1"' in queue.content and b"page-booking" in queue.content
    client.force_login(ops_users["viewer"])
    assert client.get("/ops/reservations/").status_code == 403


def _book(user, team, fake, **fields):
    from dashboards.launch.reservations import BookRequest, book

    base = dict(team=team, name="deadline", start=dt.datetime.now(UTC) + dt.timedelta(minutes=30),
                duration_s=3600, queue="agent.q", seats=2)
    base.update(fields)
    return book(user=user, request=BookRequest(**base), scheduler=fake)


@pytest.fixture
def booking_env(bootstrap, monkeypatch):
    monkeypatch.setattr("dashboards.core.realtime.queue_changed", lambda *a, **k: None)
    return FakeScheduler(queues=("agent.q", "classic.q"))
