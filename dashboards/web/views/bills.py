"""Bills for team leads: per period and grouping, as a page and as CSV."""
from __future__ import annotations

import datetime as dt
from urllib.parse import urlencode

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse

from dashboards.billing import bill_page, bills, budgets, focus, periods, waste
from dashboards.core import csv_export, errors
from dashboards.core.roles import is_admin, request_can
from dashboards.models import Budget, Campaign
from dashboards.web import forms as ops_forms
from dashboards.web.forms import BillForm
from dashboards.web.views.common import refused
from dashboards.web.views.waste import waste_query

# --------------------------------------------------------------------------- bills and budgets

def _bill_query(form: BillForm, **changes) -> str:
    """The bill's query string with ``changes`` (None drops a key): every view is a link."""

    data = form.cleaned_data
    query = {"period": data["period"], "first": data["first"].isoformat(), "last": data["last"].isoformat(),
             "group_by": data["group_by"], "team": data["team"].pk if data.get("team") else "",
             "cluster": data["cluster"].name if data.get("cluster") else "",
             "campaign": data.get("campaign") or "", "model": data.get("model") or "",
             "launcher": data.get("launcher") or ""}
    query.update(changes)
    return urlencode({k: v for k, v in query.items() if v not in ("", None)})


def tasks_by_cost(campaign_id: int) -> str:
    """The campaign page's task table sorted by cost, the most expensive first."""
    return reverse("campaign", args=[campaign_id]) + "?sort=cost&dir=desc"


def _bill(form: BillForm, *, with_campaigns: bool = False) -> dict:
    """The form's bill (``bills.bill``); ``with_campaigns``: with the same bill grouped by campaign in
    ``by_campaign``, from the same reads (the page's costliest campaign)."""
    data = form.cleaned_data
    return bills.bill(teams=form.teams(), period=data["period"], first=data["first"], last=data["last"],
                      group_by=data["group_by"], clusters=form.clusters(), with_campaigns=with_campaigns,
                      **form.filters())


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
            # A small link beside the name: the campaign's tasks, the costliest first.
            row["page"] = tasks_by_cost(int(row["key"]))
        elif group_by == "model":
            row["link"] = "?" + _bill_query(form, model=row["key"], group_by="campaign")
        elif group_by == "launcher" and row["key"]:
            row["link"] = "?" + _bill_query(form, launcher=row["key"], group_by="campaign")
        elif group_by == "team":
            row["link"] = "?" + _bill_query(form, team=team_ids.get(row["team"], ""), group_by="campaign")


def _page_number(request: HttpRequest, name: str) -> int:
    """The page asked for in ``name`` (``tasks_page``, ``rows_page``: 1-based; anything else is page 1)."""
    try:
        return max(1, min(int(request.GET.get(name, "1")), 100_000))
    except ValueError:
        return 1


def _pager(form: BillForm, name: str, page: int, more: bool) -> dict:
    """``{"page", "prev", "next"}``: links to the pages beside ``page`` of ``name`` ("" where none)."""
    return {"page": page, "prev": "?" + _bill_query(form, **{name: page - 1 if page > 2 else None}) if page > 1 else "",
            "next": "?" + _bill_query(form, **{name: page + 1}) if more else ""}


@login_required
def bills_page(request: HttpRequest) -> HttpResponse:
    if not request_can(request, "bill"):
        return refused(request, "Bills are for team leads (and admins).")
    form = BillForm.from_query(request.GET, user=request.user)
    context = {"form": form, "bill": None, "buckets": bills.BUCKETS, "bucket_labels": bills.BUCKET_LABELS,
               "csv_query": request.GET.urlencode(), "usage_definition": bills.USAGE_DEFINITION,
               "successful_verdict": bills.SUCCESSFUL_VERDICT, "presets": [], "burndowns": [],
               "is_admin": is_admin(request.user)}
    admin = context["is_admin"]
    if form.is_valid():
        try:
            result = _bill(form, with_campaigns=True)
        except errors.BillError as exc:
            form.add_error(None, str(exc))
        else:
            _row_links(form, result)
            filters = form.filters()
            campaign = None
            if filters["campaign"]:
                campaign = Campaign.objects.filter(pk=filters["campaign"], team__in=form.teams()).first()
            costliest, tasks_page, more = [], _page_number(request, "tasks_page"), False
            if campaign:
                per_page = bill_page.COSTLIEST_PER_PAGE
                costliest = bill_page.costliest_tasks(campaign.pk, teams=form.teams(), limit=per_page + 1,
                                                      offset=(tasks_page - 1) * per_page)
                more, costliest = len(costliest) > per_page, costliest[:per_page]
            rows_page, per_page = _page_number(request, "rows_page"), bill_page.ROWS_PER_PAGE
            # Other accounts' jobs under a team's project (qsub -P, not launched by tco) are real and an admin
            # sees them row by row; a team lead is not shown them as rows beside the team's own campaigns,
            # only their sum, said to be other accounts' (the footer row).
            listed = [r for r in result["rows"] if r["launched_by_tco"] or admin]
            shown = listed[(rows_page - 1) * per_page:rows_page * per_page]
            today = ops_forms.cluster_today()
            context.update(
                bill=result, chart=bill_page.bill_chart(result), units=bill_page.unit_costs(result["totals"]),
                csv_query=_bill_query(form), campaign=campaign, filters=filters,
                costliest=costliest, tasks_pager=_pager(form, "tasks_page", tasks_page, more),
                rows=shown, rows_pager=_pager(form, "rows_page", rows_page, len(listed) > rows_page * per_page),
                clear_query=_bill_query(form, campaign=None, model=None, launcher=None),
                group_links={g: "?" + _bill_query(form, group_by=g) for g in bills.GROUPS},
                presets=[{**p, "query": _bill_query(form, first=p["first"].isoformat(), last=p["last"].isoformat(),
                                                    period=p["period"]),
                          "on": (p["first"], p["last"]) == (form.cleaned_data["first"], form.cleaned_data["last"])}
                         for p in periods.presets(today)],
                burndowns=[{**b, "team": b["budget"].team, "adjective": periods.PERIOD_ADJECTIVES[b["budget"].period],
                            "fraction": (b["spent_usd"] / b["budget"].amount_usd) if b["budget"].amount_usd else None}
                           for b in budgets.budget_burndowns(
                               list(Budget.objects.filter(team__in=form.teams()).select_related("team")
                                    .order_by("team__name", "period")))])
            wasted, limit = None, waste.bill_task_limit()
            # The waste figures come from the waste rollups (billing.waste); a bill of more tasks than
            # TCO_BILL_WASTE_TASKS links the waste view instead (a busy site's quarter: 500,000).
            skipped = bool(limit) and result["totals"]["tasks"] + result["not_tco_totals"]["tasks"] > limit
            if not skipped:
                try:
                    wasted = waste.waste(teams=form.teams(), first=result["first"], last=result["last"],
                                         campaign=filters["campaign"], seats=False)["totals"]
                except errors.BillError:  # a range longer than the waste view's
                    wasted = None
            # The costliest campaign of the range and its costliest task, beside the spend (the lead's first
            # screen): from the bill grouped by campaign that came with the page's (one bill's reads).
            top = bill_page.costliest_campaign(result["by_campaign"], teams=form.teams())
            if top is not None:
                top["link"] = "?" + _bill_query(form, campaign=top["campaign_id"], group_by="campaign")
                top["tasks_by_cost"] = tasks_by_cost(top["campaign_id"])
            context.update(wasted=wasted, waste_skipped=skipped, waste_query=waste_query(
                form, first=result["first"].isoformat(), last=result["last"].isoformat()),
                campaign_tasks=tasks_by_cost(campaign.pk) if campaign else "", top=top)
            # The budgets' days are cut in the default cluster's zone (billing.budgets.budget_burndowns).
            context["burn_zone"] = str(periods.cluster_zone(periods.default_cluster()))
            context["burn_chart"] = [{"team": b["team"].name, "period": b["budget"].period, "days": b["days"],
                                      "cumulative_usd": b["cumulative_usd"], "amount_usd": b["amount_usd"],
                                      "projected_usd": float(b["projected_usd"]),
                                      "end_day": b["end_day"].isoformat()} for b in context["burndowns"]]
    return render(request, "dashboards/bills.html", context)


def _bad_request(form: BillForm) -> HttpResponse:
    """400 with the form's errors as text (the CSV downloads have no page to show them on)."""
    return HttpResponse("bad bill request: " + "; ".join(
        f"{k}: {' '.join(v)}" for k, v in form.errors.items()), status=400, content_type="text/plain")


@login_required
def bills_csv(request: HttpRequest) -> HttpResponse:
    """The CSV of the view the page shows (same query): the bill's rows, or with ``view=tasks``
    and a campaign, that campaign's costliest tasks."""
    if not request_can(request, "bill"):
        return refused(request, "Bills are for team leads (and admins).")
    form = BillForm.from_query(request.GET, user=request.user)
    if not form.is_valid():
        return _bad_request(form)
    try:
        result = _bill(form)
    except errors.BillError as exc:
        return HttpResponse(f"bad bill request: {exc}", status=400, content_type="text/plain")
    campaign_id = form.filters()["campaign"]
    if request.GET.get("view") == "tasks" and campaign_id:
        def task_rows():
            for t in bill_page.costliest_tasks(campaign_id, teams=form.teams(), limit=100_000):
                tokens = sum(getattr(t, b) or 0 for b in bills.BUCKETS)
                yield [campaign_id, t.task_number, t.state, t.verdict, tokens,
                       format(t.cost_usd.normalize(), "f") if t.cost_usd is not None else "unpriced",
                       f"{t.wallclock_s or 0:.3f}"]
        return csv_export.csv_response(
            f"tco-campaign-{campaign_id}-tasks-by-cost.csv",
            ["campaign", "task_number", "state", "verdict", "total_tokens", "cost_usd", "wallclock_s"], task_rows())
    filename = (f"tco-bill-{result['period']}-{result['group_by']}-{result['first'].isoformat()}"
                f"-{result['last'].isoformat()}.csv")
    header, *rows = bill_page.bill_csv_rows(result)
    return csv_export.csv_response(filename, header, rows)


@login_required
def bills_focus(request: HttpRequest) -> HttpResponse:
    """The FOCUS 1.2 CSV (``billing.focus``) of the page's teams and days, widened to whole periods
    as the bill is: the same totals as the bill above it (its filters narrow the page, not the file)."""
    if not request_can(request, "bill"):
        return refused(request, "Bills are for team leads (and admins).")
    form = BillForm.from_query(request.GET, user=request.user)
    if not form.is_valid():
        return _bad_request(form)
    data = form.cleaned_data
    first = periods.period_start(data["first"], data["period"])
    last = periods.next_period_start(periods.period_start(data["last"], data["period"]), data["period"])
    try:
        span = focus.window(first=first, last=last - dt.timedelta(days=1))
    except errors.BillError as exc:
        return HttpResponse(f"bad bill request: {exc}", status=400, content_type="text/plain")
    header, *rows = focus.focus_csv_rows(focus.focus_rows(teams=form.teams(), window=span))
    return csv_export.csv_response(focus.focus_filename(span), header, rows)
