"""The REST API (``/api/``): the pages' data for scripts, under the same roles.

Authentication: ``Authorization: Token <key>`` (a user's API token, see
``/account/token/`` or ``POST /api/token/``) or the browser session. Every
answer is read through the scoped selectors, so a token sees exactly what its
user sees on the pages; something the user may not see is a 404, a kind of
data their role does not allow (usage without ``bill``) a 403.
The OpenAPI schema is at ``/api/schema/``.
"""
from __future__ import annotations

import datetime as dt
from decimal import Decimal

from django.conf import settings
from django.contrib.auth import authenticate
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.exceptions import NotFound, PermissionDenied, ValidationError
from rest_framework.permissions import AllowAny
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from dashboards.billing import bills, focus
from dashboards.core import accounts, csv_export, encoding, errors, scope
from dashboards.core.roles import CAPABILITIES, is_admin, teams_with
from dashboards.live import campaign as live_campaign
from dashboards.live import queue as live_queue
from dashboards.live import task
from dashboards.models import Campaign, Task
from dashboards.team_models import Role
from schedulers import base

PAGE = OpenApiParameter("page", OpenApiTypes.INT, description="1-based page number")
STATE = OpenApiParameter("state", OpenApiTypes.STR, enum=list(base.LIFECYCLE_STATES),
                         description="only tasks in this lifecycle state")

StateCounts = serializers.DictField(child=serializers.IntegerField(), help_text="lifecycle state -> tasks")


class CampaignRowSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    team = serializers.CharField()
    project = serializers.CharField()
    cluster = serializers.CharField()
    queue = serializers.CharField()
    job_number = serializers.IntegerField(allow_null=True)
    task_count = serializers.IntegerField()
    tasks = serializers.CharField(help_text="task range of the array job, e.g. 1-100")
    status = serializers.CharField()
    urgent = serializers.BooleanField()
    launched_at = serializers.DateTimeField()
    progress_pct = serializers.FloatField(help_text="ended tasks, percent of task_count")
    states = StateCounts


class PageSerializer(serializers.Serializer):
    page = serializers.IntegerField()
    pages = serializers.IntegerField()
    per_page = serializers.IntegerField()
    total = serializers.IntegerField()


class CampaignListSerializer(serializers.Serializer):
    results = CampaignRowSerializer(many=True)
    page = PageSerializer()


class TaskRowSerializer(serializers.Serializer):
    id = serializers.IntegerField(help_text="tco's task id (the agent page is /tasks/<id>/)")
    task_id = serializers.CharField(help_text="job.task as Grid Engine writes it")
    task_number = serializers.IntegerField()
    state = serializers.CharField()
    state_code = serializers.CharField()
    host = serializers.CharField()
    queue = serializers.CharField()
    submitted_at = serializers.DateTimeField(allow_null=True)
    started_at = serializers.DateTimeField(allow_null=True)
    ended_at = serializers.DateTimeField(allow_null=True)
    queue_wait_s = serializers.FloatField(allow_null=True)
    sandbox_start_s = serializers.FloatField(allow_null=True)
    agent_work_s = serializers.FloatField(allow_null=True)
    integration_overhead_s = serializers.FloatField(allow_null=True)
    tokens = serializers.IntegerField()
    cost_usd = serializers.DecimalField(max_digits=14, decimal_places=8, allow_null=True)
    exit_status = serializers.IntegerField(allow_null=True)
    failed_code = serializers.IntegerField(allow_null=True)
    verdict = serializers.CharField()
    flags = serializers.ListField(child=serializers.CharField())


class StageRowSerializer(serializers.Serializer):
    stage = serializers.CharField()
    label = serializers.CharField()
    n = serializers.IntegerField()
    median_s = serializers.FloatField(allow_null=True)
    p10_s = serializers.FloatField(allow_null=True)
    p90_s = serializers.FloatField(allow_null=True)
    min_s = serializers.FloatField(allow_null=True)
    max_s = serializers.FloatField(allow_null=True)
    histogram = serializers.DictField(allow_null=True, help_text="{edges: [s], counts: [tasks]}")


class CampaignDetailSerializer(serializers.Serializer):
    generated_at = serializers.DateTimeField()
    campaign = serializers.DictField()
    states = StateCounts
    ended = serializers.IntegerField()
    failures = serializers.IntegerField()
    progress_pct = serializers.FloatField()
    tasks = TaskRowSerializer(many=True)
    page = serializers.IntegerField()
    pages = serializers.IntegerField()
    per_page = serializers.IntegerField()
    state_filter = serializers.CharField(allow_null=True)
    stages = inline_serializer("Stages", {"rows": StageRowSerializer(many=True),
                                          "tasks_with_record": serializers.IntegerField()})


class UsageRowSerializer(serializers.Serializer):
    team = serializers.CharField()
    project = serializers.CharField()
    tasks = serializers.IntegerField()
    records = serializers.IntegerField(help_text="accounting records")
    finished_tasks = serializers.IntegerField(help_text="done or failed; not launched by tco: accounting records")
    wallclock_s = serializers.FloatField(help_text="seconds, from the accounting records")
    slot_s = serializers.FloatField(help_text="wall clock x slots, seconds")
    input_tokens = serializers.IntegerField()
    cache_read_tokens = serializers.IntegerField()
    cache_write_5m_tokens = serializers.IntegerField()
    cache_write_1h_tokens = serializers.IntegerField()
    output_tokens = serializers.IntegerField()
    reasoning_tokens = serializers.IntegerField()
    tokens = serializers.IntegerField()
    cost_usd = serializers.DecimalField(max_digits=18, decimal_places=8)
    unpriced_tasks = serializers.IntegerField()


def _page(request: Request) -> int:
    try:
        return max(1, int(request.query_params.get("page", 1)))
    except ValueError:
        raise ValidationError({"page": "a positive integer"}) from None


def _state(request: Request) -> str | None:
    state = request.query_params.get("state") or None
    if state is not None and state not in (*base.LIFECYCLE_STATES, "waiting"):
        raise ValidationError({"state": f"one of {', '.join(base.LIFECYCLE_STATES)}, waiting "
                                        "(held tasks that wait for the campaign's -hold_jid_ad predecessor)"})
    return state


class ObtainTokenView(APIView):
    """``POST /api/token/`` with ``username`` and ``password``: a new token.

    A user whose token still works gets 409 with the token's first characters
    and when it was made, and no new token: the old one is replaced only when
    the request says ``"rotate": true`` (the old one then stops working at
    once). A token made before the user's last password change no longer
    works and is replaced without ``rotate``. Failed attempts count towards
    django-axes' lockout like the login page's: a locked-out user name or
    address gets 429 even with the right password.
    """

    authentication_classes: list = []
    permission_classes = [AllowAny]

    @extend_schema(
        summary="Make an API token with a username and password",
        description=("Answers 200 with a new token when the user has none that works (none yet, revoked, or made "
                     "before the user's last password change). A user whose token still works gets 409 and no "
                     "new token, unless the request has \"rotate\": true: then the old token is replaced and stops "
                     "working at once. 400: wrong credentials; 429: too many failed attempts."),
        request=inline_serializer("TokenRequest", {
            "username": serializers.CharField(), "password": serializers.CharField(),
            "rotate": serializers.BooleanField(required=False, default=False,
                                               help_text="replace a working token (it stops working)")}),
        responses={200: inline_serializer("TokenAnswer", {"token": serializers.CharField()}),
                   409: inline_serializer("TokenConflict", {
                       "detail": serializers.CharField(), "token_prefix": serializers.CharField(),
                       "created": serializers.DateTimeField()}),
                   400: OpenApiTypes.OBJECT, 429: OpenApiTypes.OBJECT})
    def post(self, request: Request) -> Response:
        username, password = request.data.get("username"), request.data.get("password")
        if not isinstance(username, str) or not isinstance(password, str) or not username or not password:
            raise ValidationError({"non_field_errors": ["username and password are required"]})
        raw = request.data.get("rotate", False)
        # By type, not by value: bool is an int and 1 == True, so "rotate": 1 (or 1.0) passed the old
        # membership test and replaced the token (fresh attack A7). JSON true/false, or the form's text.
        if type(raw) is bool:
            rotate = raw
        elif isinstance(raw, str) and raw in ("true", "false"):
            rotate = raw == "true"
        else:
            raise ValidationError({"rotate": "true or false"})
        django_request = request._request
        user = authenticate(request=django_request, username=username, password=password)
        if getattr(django_request, "axes_locked_out", False):
            return Response({"detail": "too many failed attempts; try again later"},
                            status=status.HTTP_429_TOO_MANY_REQUESTS)
        if user is None or not user.is_active:
            raise ValidationError({"non_field_errors": ["unable to log in with the provided credentials"]})
        working = accounts.api_token_working(user)
        if working is not None and not rotate:
            return Response({"detail": f"you already have a working API token (it starts {working.prefix}); "
                                       "send \"rotate\": true to replace it (the old one stops working), or "
                                       "keep using it",
                             "token_prefix": working.prefix, "created": working.created},
                            status=status.HTTP_409_CONFLICT)
        return Response({"token": accounts.api_token_rotate(user=user).key})


class MeView(APIView):
    @extend_schema(summary="Who the caller is: teams, roles and capabilities",
                   responses=inline_serializer("Me", {
                       "username": serializers.CharField(), "admin": serializers.BooleanField(),
                       "teams": serializers.ListField(child=serializers.DictField()),
                       "capabilities": serializers.DictField(child=serializers.ListField())}))
    def get(self, request: Request) -> Response:
        user = request.user
        roles = {m.team_id: m.role for m in user.memberships.all()}
        teams = [{"team": t.name, "project": t.project,
                  "role": "admin" if is_admin(user) else roles.get(t.pk, Role.VIEWER)}
                 for t in scope.teams_visible_to(user).order_by("name")]
        capabilities = {cap: sorted(teams_with(user, cap).values_list("project", flat=True)) for cap in CAPABILITIES}
        return Response({"username": user.get_username(), "admin": is_admin(user), "teams": teams,
                         "capabilities": capabilities})


class QueueView(APIView):
    @extend_schema(summary="The live queue (as the queue page shows it)", parameters=[PAGE],
                   responses=OpenApiTypes.OBJECT,
                   description="Shape: see dashboards.live.queue.queue_summary. Campaigns are paginated.")
    def get(self, request: Request) -> Response:
        return Response(live_queue.queue_summary(request.user, seat_resource=settings.TCO_SEAT_RESOURCE,
                                                page=_page(request)))


class QueueDepthView(APIView):
    @extend_schema(summary="Queued and running tasks over the last hour or day, per team",
                   parameters=[OpenApiParameter("window", OpenApiTypes.STR, enum=["hour", "day"])],
                   responses=inline_serializer("QueueDepth", {
                       "window": serializers.CharField(), "t": serializers.ListField(child=serializers.DateTimeField()),
                       "queued": serializers.DictField(child=serializers.ListField(child=serializers.IntegerField())),
                       "running": serializers.ListField(child=serializers.IntegerField())}))
    def get(self, request: Request) -> Response:
        window = request.query_params.get("window", "hour")
        if window not in ("hour", "day"):
            raise ValidationError({"window": "hour or day"})
        return Response(live_queue.queue_depth_history(request.user, window))


class CampaignListView(APIView):
    @extend_schema(operation_id="campaigns_list", summary="Campaigns the caller may see, unfinished first",
                   parameters=[PAGE, OpenApiParameter("status", OpenApiTypes.STR,
                                                      enum=[s for s, _ in Campaign.STATUS])],
                   responses=CampaignListSerializer)
    def get(self, request: Request) -> Response:
        status_filter = request.query_params.get("status") or None
        if status_filter is not None and status_filter not in dict(Campaign.STATUS):
            raise ValidationError({"status": f"one of {', '.join(dict(Campaign.STATUS))}"})
        rows, page = live_queue.campaign_list(request.user, page=_page(request), status=status_filter)
        return Response({"results": rows, "page": page})


class CampaignDetailView(APIView):
    @extend_schema(summary="One campaign: progress, a page of tasks (failures first) and the stage table",
                   parameters=[PAGE, STATE], responses=CampaignDetailSerializer)
    def get(self, request: Request, campaign_id: int) -> Response:
        try:
            return Response(live_campaign.campaign_detail(request.user, campaign_id, page=_page(request),
                                                      state=_state(request)))
        except Campaign.DoesNotExist:
            raise NotFound("no such campaign") from None


class CampaignTasksView(APIView):
    @extend_schema(summary="A page of one campaign's tasks (failures first unless filtered by state)",
                   parameters=[PAGE, STATE, OpenApiParameter("per_page", OpenApiTypes.INT)],
                   responses=inline_serializer("TaskPage", {"tasks": TaskRowSerializer(many=True),
                                                            "page": serializers.IntegerField(),
                                                            "pages": serializers.IntegerField(),
                                                            "per_page": serializers.IntegerField()}))
    def get(self, request: Request, campaign_id: int) -> Response:
        try:
            per_page = min(1000, max(1, int(request.query_params.get("per_page", live_campaign.TASKS_PER_PAGE))))
        except ValueError:
            raise ValidationError({"per_page": "an integer, 1 to 1000"}) from None
        try:
            detail = live_campaign.campaign_detail(request.user, campaign_id, page=_page(request), per_page=per_page,
                                               state=_state(request))
        except Campaign.DoesNotExist:
            raise NotFound("no such campaign") from None
        return Response({k: detail[k] for k in ("tasks", "page", "pages", "per_page")})


class TaskDetailView(APIView):
    @extend_schema(summary="One agent: stages, policy, model requests, logs, accounting, scheduler data",
                   parameters=[OpenApiParameter("scheduler", OpenApiTypes.BOOL,
                                                description="ask qstat -j while the task is active (default true)")],
                   responses=OpenApiTypes.OBJECT,
                   description="Shape: see dashboards.live.task.task_detail.")
    def get(self, request: Request, task_id: int) -> Response:
        with_scheduler = request.query_params.get("scheduler", "true").lower() not in ("0", "false", "no")
        try:
            return Response(task.task_detail(request.user, task_id, with_scheduler=with_scheduler))
        except Task.DoesNotExist:
            raise NotFound("no such task") from None


def _parse_when(text: str | None, default: dt.datetime, name: str) -> dt.datetime:
    if not text:
        return default
    try:
        value = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValidationError({name: "an ISO 8601 date or time"}) from None
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.timezone.utc)
    return value


PERIOD_PARAMETERS = [
    OpenApiParameter("since", OpenApiTypes.DATETIME, description="start of the period, inclusive (default: 1st of "
                                                                 "this month, UTC)"),
    OpenApiParameter("until", OpenApiTypes.DATETIME, description="end of the period, exclusive (default: now)")]


def _period(request: Request) -> tuple[dt.datetime, dt.datetime]:
    """``since`` and ``until`` of a usage request (``PERIOD_PARAMETERS``); 400 unless until > since."""
    now = timezone.now()
    since = _parse_when(request.query_params.get("since"),
                        now.replace(day=1, hour=0, minute=0, second=0, microsecond=0), "since")
    until = _parse_when(request.query_params.get("until"), now, "until")
    if until <= since:
        raise ValidationError({"until": "must be after since"})
    return since, until


class UsageView(APIView):
    @extend_schema(summary="Tokens, cost and wall clock per team (teams where the caller may read bills)",
                   parameters=PERIOD_PARAMETERS,
                   description="The bill page's definition (dashboards.billing.bills.USAGE_DEFINITION): "
                               + bills.USAGE_DEFINITION + " Here they are in not_launched_by_tco.",
                   responses=inline_serializer("Usage", {"since": serializers.DateTimeField(),
                                                         "until": serializers.DateTimeField(),
                                                         "teams": UsageRowSerializer(many=True),
                                                         "not_launched_by_tco": UsageRowSerializer(many=True)}))
    def get(self, request: Request) -> Response:
        if not teams_with(request.user, "bill").exists():
            raise PermissionDenied("usage needs the team lead role (or admin)")
        since, until = _period(request)
        usage = bills.usage_by_team(request.user, since=since, until=until)
        for rows in usage.values():
            for row in rows:
                row["cost_usd"] = format(row["cost_usd"].quantize(Decimal("1e-8")), "f")
        return Response({"since": encoding.jsonable(since), "until": encoding.jsonable(until),
                         "definition": bills.USAGE_DEFINITION, **usage},
                        status=status.HTTP_200_OK)


class CSVRenderer(BaseRenderer):
    """Lets a client ask for ``text/csv`` (``Accept``); an error is then its ``detail`` as text."""

    media_type = "text/csv"
    format = "csv"
    charset = "utf-8"

    def render(self, data, accepted_media_type=None, renderer_context=None) -> bytes:
        if isinstance(data, (bytes, str)):
            return data.encode() if isinstance(data, str) else data
        return (str(data.get("detail", data)) if isinstance(data, dict) else str(data)).encode() + b"\n"


class FocusView(APIView):
    """``GET /api/focus/?since=..&until=..``: the FOCUS 1.2 CSV of the caller's teams (``billing.focus``)."""

    renderer_classes = [JSONRenderer, CSVRenderer]

    @extend_schema(summary="FOCUS 1.2 cost and usage CSV per day, team, campaign (tokens) and queue (slot-hours)",
                   parameters=PERIOD_PARAMETERS,
                   description="Teams where the caller may read bills, as /api/usage/. Columns: FOCUS 1.2's "
                               "Cost and Usage columns, then tco's x_ columns (dashboards.billing.focus.COLUMNS). "
                               "Its BilledCost, x_WallclockSeconds and x_SlotSeconds sum to the bill's cost, wall "
                               "clock and slot-seconds for the same window. " + bills.USAGE_DEFINITION,
                   responses={(200, "text/csv"): OpenApiTypes.STR})
    def get(self, request: Request):
        if not teams_with(request.user, "bill").exists():
            raise PermissionDenied("FOCUS exports need the team lead role (or admin)")
        since, until = _period(request)
        try:
            span = focus.window(since=since, until=until)
        except errors.BillError as exc:
            raise ValidationError({"until": str(exc)}) from None
        rows = focus.focus_rows(teams=bills.teams_billable_by(request.user), window=span)
        header, *body = focus.focus_csv_rows(rows)
        return csv_export.csv_response(focus.focus_filename(span), header, body)
