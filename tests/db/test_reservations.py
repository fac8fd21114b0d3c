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


@pytest.mark.django_db
def test_a_team_cannot_hoard_every_seat_by_chaining_reservations(booking_env, ops_users, caps):
    """The attack: research's launcher booked 96 of 96 seats for 48 h with two 24 h bookings 2 and 3
    days ahead, and the admin's 1-seat booking for engineering in that window found no seats."""
    from dashboards.core.errors import LaunchError
    from dashboards.models import AuditEntry, Reservation, Team

    research, engineering = Team.objects.get(project="research"), Team.objects.get(project="engineering")
    launcher = ops_users["launcher"]
    with pytest.raises(LaunchError, match=r"team research would hold 96 model API seats \(anthropic_api\) at "
                                          r".*at most 32 at any moment \(TCO_RESERVATION_TEAM_MAX_SEATS\)"):
        _book(launcher, research, booking_env, start=_days(2), duration_s=24 * 3600, seats=96)
    assert booking_env.reservation_calls == [] and not Reservation.objects.exists()
    assert not AuditEntry.objects.get(action="reservation_book").ok
    # Within the cap, chained: one day each, 32 seats each (never more than 32 at once).
    _book(launcher, research, booking_env, start=_days(2), duration_s=24 * 3600, seats=32)
    _book(launcher, research, booking_env, start=_days(3), duration_s=24 * 3600, seats=32)
    # One more seat during either of them would be 33 at once.
    with pytest.raises(LaunchError, match="would hold 33 model API seats"):
        _book(launcher, research, booking_env, start=_days(2.5), duration_s=3600, seats=1)
    # And the team has its 48 h of reservations: a seat-less hour elsewhere is over the total.
    with pytest.raises(LaunchError, match=r"49 h of reservations not yet ended.*TCO_RESERVATION_TEAM_MAX_TOTAL_S"):
        _book(launcher, research, booking_env, start=_days(5), duration_s=3600, seats=0)
    assert len(booking_env.reservation_calls) == 2
    # The other team books in that window; an admin may book above a team's caps.
    _book(ops_users["other"], engineering, booking_env, start=_days(2.5), duration_s=3600, seats=1)
    _book(ops_users["admin"], research, booking_env, start=_days(2.5), duration_s=3600, seats=40)
    assert Reservation.objects.count() == 4


@pytest.mark.django_db
def test_slots_and_lead_time_are_capped_too(booking_env, ops_users, caps):
    from dashboards.core.errors import LaunchError
    from dashboards.models import Team

    research = Team.objects.get(project="research")
    with pytest.raises(LaunchError, match=r"start: at most 168 h ahead \(TCO_RESERVATION_MAX_LEAD_S\)"):
        _book(ops_users["launcher"], research, booking_env, start=_days(8), seats=1)
    with pytest.raises(LaunchError, match=r"would hold 40 slots at .*\(TCO_RESERVATION_TEAM_MAX_SLOTS\)"):
        _book(ops_users["launcher"], research, booking_env, queue="classic.q", slots=40, seats=0)
    assert booking_env.reservation_calls == []
    _book(ops_users["admin"], research, booking_env, start=_days(8), seats=1)  # admins: above the caps


@pytest.mark.django_db
def test_two_bookings_racing_past_the_check_leave_only_one(booking_env, ops_users, caps, monkeypatch):
    """Two launchers of a team book 32 seats each at once: both pass the first check; the one recorded
    second breaks the cap, so it is deleted again at the scheduler and refused."""
    from dashboards.core.clusters import cluster_get_default
    from dashboards.core.errors import LaunchError
    from dashboards.models import Reservation, Team

    research = Team.objects.get(project="research")
    start = _days(1)
    submit = booking_env.reservation_submit

    def racing(spec):
        ar = submit(spec)
        Reservation.objects.create(cluster=cluster_get_default(), ar_id=ar + 100, team=research, name="racer",
                                   queue="agent.q", seats=32, start_at=start, end_at=start + dt.timedelta(hours=1))
        return ar

    monkeypatch.setattr(booking_env, "reservation_submit", racing)
    with pytest.raises(LaunchError, match="would hold 64 model API seats.*was deleted again"):
        _book(ops_users["launcher"], research, booking_env, start=start, duration_s=3600, seats=32)
    assert booking_env.reservation_calls[-1] == ["qrdel", "1"] and booking_env.reservations() == []
    assert list(Reservation.objects.values_list("name", flat=True)) == ["racer"]


@pytest.mark.django_db
def test_the_booking_forms_fields_are_bounded_by_the_caps(booking_env, ops_users, caps):
    from dashboards.models import Team
    from dashboards.web.views.reservations import ReservationForm

    team = Team.objects.get(project="research")
    data = {"team": team.pk, "name": "big", "start": _days(1).strftime("%Y-%m-%dT%H:%M"), "duration_min": 60,
            "queue": "agent.q", "slots": 1, "seats": 96}
    form = ReservationForm(data, user=ops_users["launcher"])
    assert not form.is_valid() and "less than or equal to 32" in form.errors["seats"][0]
    assert 'max="32"' in str(form["seats"]) and "TCO_RESERVATION_TEAM_MAX_SEATS" in form.fields["seats"].help_text
    assert not ReservationForm({**data, "seats": 1, "slots": 33}, user=ops_users["launcher"]).is_valid()
    assert not ReservationForm({**data, "seats": 1, "duration_min": 24 * 60 + 1}, user=ops_users["launcher"]).is_valid()
    assert ReservationForm({**data, "seats": 32}, user=ops_users["launcher"]).is_valid()
    assert ReservationForm(data, user=ops_users["admin"]).is_valid()  # admins above the caps
    assert not ReservationForm({**data, "seats": 10001}, user=ops_users["admin"]).is_valid()


@pytest.mark.django_db
def test_every_user_sees_which_team_holds_reserved_seats(booking_env, ops_users, caps, client):
    """Engineering's user does not see research's reservations (names, times), but sees that team
    Research holds 32 seats: a team booking the cluster's seats is visible to the teams it holds them from."""
    from dashboards.core.clusters import cluster_get_default
    from dashboards.launch.reservations import holders
    from dashboards.models import Team

    research = Team.objects.get(project="research")
    start = _days(1)
    _book(ops_users["launcher"], research, booking_env, name="secret-deadline", start=start, seats=32)
    _book(ops_users["launcher"], research, booking_env, name="second", start=start + dt.timedelta(minutes=30),
          duration_s=3600, seats=0, slots=1)
    (held,) = holders(cluster_get_default())
    assert (held["holder"], held["team"], held["seats_now"], held["seats_peak"], held["slots_peak"],
            held["reservations"]) == ("research", True, 0, 32, 2, 2)
    (held,) = holders(cluster_get_default(), now=start + dt.timedelta(minutes=40))  # inside both
    assert (held["seats_now"], held["slots_now"]) == (32, 2)
    client.force_login(ops_users["other"])
    page = client.get("/").content.decode()
    holder_table = page.split('id="reservation-holders"', 1)[1].split("</div>", 1)[0]
    assert 'data-holder="research"' in holder_table and ">32<" in holder_table
    assert "secret-deadline" not in page


def _days(n: float) -> dt.datetime:
    return (dt.datetime.now(UTC) + dt.timedelta(days=n)).replace(microsecond=0)


@pytest.fixture
def caps(settings):
    """The reservation caps of issue 23, finding 2, at test sizes."""
    settings.TCO_RESERVATION_MAX_S = 24 * 3600
    settings.TCO_RESERVATION_TEAM_MAX_SEATS = 32
    settings.TCO_RESERVATION_TEAM_MAX_SLOTS = 32
    settings.TCO_RESERVATION_TEAM_MAX_TOTAL_S = 48 * 3600
    settings.TCO_RESERVATION_MAX_LEAD_S = 7 * 24 * 3600
    return settings
