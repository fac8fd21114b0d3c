"""Bills for team leads: per period and grouping, as a page and as CSV."""
from __future__ import annotations

from urllib.parse import urlencode

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse

from dashboards.billing import bills, budgets, periods
from dashboards.core import csv_export, errors
from dashboards.core.roles import user_can
from dashboards.models import Budget, Campaign
from dashboards.web import forms as ops_forms
from dashboards.web.forms import BillForm
from dashboards.web.views.common import refused

# --------------------------------------------------------------------------- bills and budgets

def _bill_query(form: BillForm, **changes) -> str:
    """The bill's query string with ``changes`` (None drops a key): every view is a link."""

    data = form.cleaned_data
    query = {"period": data["period"], "first": data["first"].isoformat(), "last": data["last"].isoformat(),
             "group_by": data["group_by"], "team": data["team"].pk if data.get("team") else "",
             "campaign": data.get("campaign") or "", "model": data.get("model") or "",
             "launcher": data.get("launcher") or ""}
    query.update(changes)
    return urlencode({k: v for k, v in query.items() if v not in ("", None)})


def _bill(form: BillForm) -> dict:
    data = form.cleaned_data
    return bills.bill(teams=form.teams(), period=data["period"], first=data["first"], last=data["last"],
                        group_by=data["group_by"], **form.filters())


def _row_links(form: BillForm, result: dict) -> None:
    """Each launched-by-tco row's label links to its breakdown (a campaign's costliest tasks; a
    team's, model's or launcher's campaigns); a campaign's row also gets ``page``, its campaign page."""
    group_by = result["group_by"]
    team_ids = {t.name: t.pk for t in form.teams()}
    for row in result["rows"]:
        row["link"] = ""
        if not row["launched_by_tco"]:
            continue
        if group_by == "campaign" and row["key"] is not None:
            row["link"] = "?" + _bill_query(form, campaign=row["key"], group_by="campaign")
            row["page"] = reverse("ops-campaign", args=[int(row["key"])])  # a small link beside the name
        elif group_by == "model":
            row["link"] = "?" + _bill_query(form, model=row["key"], group_by="campaign")
        elif group_by == "launcher" and row["key"]:
            row["link"] = "?" + _bill_query(form, launcher=row["key"], group_by="campaign")
        elif group_by == "team":
            row["link"] = "?" + _bill_query(form, team=team_ids.get(row["team"], ""), group_by="campaign")


@login_required
def bills_page(request: HttpRequest) -> HttpResponse:
    if not user_can(request.user, "bill"):
        return refused(request, "Bills are for team leads (and admins).")
    form = BillForm.from_query(request.GET, user=request.user)
    context = {"form": form, "bill": None, "buckets": bills.BUCKETS, "bucket_labels": bills.BUCKET_LABELS,
               "csv_query": request.GET.urlencode(), "usage_definition": bills.USAGE_DEFINITION,
               "successful_verdict": bills.SUCCESSFUL_VERDICT, "presets": [], "burndowns": []}
    if form.is_valid():
        try:
            result = _bill(form)
        except errors.BillError as exc:
            form.add_error(None, str(exc))
        else:
            _row_links(form, result)
            filters = form.filters()
            campaign = None
            if filters["campaign"]:
                campaign = Campaign.objects.filter(pk=filters["campaign"], team__in=form.teams()).first()
            today = ops_forms._today()
            context.update(
                bill=result, chart=bills.bill_chart(result), units=bills.unit_costs(result["totals"]),
                csv_query=_bill_query(form), campaign=campaign, filters=filters,
                costliest=bills.costliest_tasks(campaign.pk, teams=form.teams()) if campaign else [],
                clear_query=_bill_query(form, campaign=None, model=None, launcher=None),
                group_links={g: "?" + _bill_query(form, group_by=g) for g in bills.GROUPS},
                presets=[{**p, "query": _bill_query(form, first=p["first"].isoformat(), last=p["last"].isoformat(),
                                                    period=p["period"]),
                          "on": (p["first"], p["last"]) == (form.cleaned_data["first"], form.cleaned_data["last"])}
                         for p in periods.presets(today)],
                burndowns=[{**budgets.budget_burndown(b), "team": b.team}
                           for b in Budget.objects.filter(team__in=form.teams()).select_related("team")
                           .order_by("team__name", "period")])
            context["burn_chart"] = [{"team": b["team"].name, "period": b["budget"].period, "days": b["days"],
                                      "cumulative_usd": b["cumulative_usd"], "amount_usd": b["amount_usd"],
                                      "projected_usd": float(b["projected_usd"]),
                                      "end_day": b["end_day"].isoformat()} for b in context["burndowns"]]
    return render(request, "dashboards/bills.html", context)


@login_required
def bills_csv(request: HttpRequest) -> HttpResponse:
    """The CSV of the view the page shows (same query): the bill's rows, or with ``view=tasks``
    and a campaign, that campaign's costliest tasks."""
    if not user_can(request.user, "bill"):
        return refused(request, "Bills are for team leads (and admins).")
    form = BillForm.from_query(request.GET, user=request.user)
    if not form.is_valid():
        return HttpResponse("bad bill request: " + "; ".join(
            f"{k}: {' '.join(v)}" for k, v in form.errors.items()), status=400, content_type="text/plain")
    try:
        result = _bill(form)
    except errors.BillError as exc:
        return HttpResponse(f"bad bill request: {exc}", status=400, content_type="text/plain")
    campaign_id = form.filters()["campaign"]
    if request.GET.get("view") == "tasks" and campaign_id:
        def task_rows():
            for t in bills.costliest_tasks(campaign_id, teams=form.teams(), limit=100_000):
                tokens = sum(getattr(t, b) or 0 for b in bills.BUCKETS)
                yield [campaign_id, t.task_number, t.state, t.verdict, tokens,
                       format(t.cost_usd.normalize(), "f") if t.cost_usd is not None else "unpriced",
                       f"{t.wallclock_s or 0:.3f}"]
        return csv_export.csv_response(
            f"tco-campaign-{campaign_id}-tasks-by-cost.csv",
            ["campaign", "task_number", "state", "verdict", "total_tokens", "cost_usd", "wallclock_s"], task_rows())
    filename = (f"tco-bill-{result['period']}-{result['group_by']}-{result['first'].isoformat()}"
                f"-{result['last'].isoformat()}.csv")
    header, *rows = bills.bill_csv_rows(result)
    return csv_export.csv_response(filename, header, rows)
