"""The waste view of the bill: failed tasks, failed verdicts, retries and idle model seats; tco's
infrastructure failures apart (billing.waste)."""
from __future__ import annotations

from urllib.parse import urlencode

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from dashboards.billing import waste
from dashboards.core import csv_export, errors
from dashboards.core.roles import request_can
from dashboards.web.forms import BillForm
from dashboards.web.views.common import refused


def waste_query(form: BillForm, **changes) -> str:
    """The query string of the waste view for the bill ``form`` shows (same teams and days)."""
    data = form.cleaned_data
    query = {"first": data["first"].isoformat(), "last": data["last"].isoformat(),
             "team": data["team"].pk if data.get("team") else "", "campaign": data.get("campaign") or ""}
    query.update(changes)
    return urlencode({k: v for k, v in query.items() if v not in ("", None)})


@login_required
def waste_page(request: HttpRequest) -> HttpResponse:
    if not request_can(request, "bill"):
        return refused(request, "Bills are for team leads (and admins).")
    form = BillForm.from_query(request.GET, user=request.user)
    context = {"form": form, "result": None, "seat_resource": settings.TCO_SEAT_RESOURCE,
               "seat_limit": waste.seat_task_limit()}
    if form.is_valid():
        data = form.cleaned_data
        try:
            result = waste.waste(teams=form.teams(), first=data["first"], last=data["last"],
                                 campaign=data.get("campaign"), seat_limit=waste.seat_task_limit())
        except errors.BillError as exc:
            form.add_error(None, str(exc))
        else:
            if request.GET.get("format") == "csv":
                header, *rows = waste.waste_csv_rows(result)
                return csv_export.csv_response(
                    f"tco-waste-{data['first'].isoformat()}-{data['last'].isoformat()}.csv", header, rows)
            by_team: dict[str, list] = {}
            for row in result["rows"]:
                by_team.setdefault(row["project"], []).append(row)
            context.update(result=result, groups=[(team, by_team.get(team["project"], []))
                                                  for team in result["teams"]],
                           bill_query=urlencode({"period": "day", "first": data["first"].isoformat(),
                                                 "last": data["last"].isoformat(),
                                                 "team": data["team"].pk if data.get("team") else "",
                                                 "group_by": "campaign"}),
                           clear_query=waste_query(form, campaign=None), csv_query=waste_query(form, format="csv"))
    return render(request, "dashboards/waste.html", context)
