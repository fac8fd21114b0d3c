"""Budgets for team leads: set, list and delete a team's budget."""
from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from dashboards.billing import bills, budgets, periods
from dashboards.core import errors
from dashboards.models import Budget
from dashboards.web.forms import BudgetForm
from dashboards.web.views.common import refused


@login_required
@require_http_methods(["GET", "POST"])
def budgets_page(request: HttpRequest) -> HttpResponse:
    teams = list(bills.teams_billable_by(request.user).order_by("name"))
    if not teams:
        return refused(request, "Budgets are for team leads (and admins).")
    if request.method == "POST":
        form = BudgetForm(request.POST, user=request.user)
        if form.is_valid():
            data = form.cleaned_data
            try:
                budgets.budget_set(user=request.user, team=data["team"], period=data["period"],
                                   amount_usd=data["amount_usd"], thresholds=data["thresholds"],
                                   on_exceed=data["on_exceed"], alert_emails=data["alert_emails"])
            except (PermissionError, errors.BillError) as exc:
                form.add_error(None, str(exc))
            else:
                budgets.budget_check_alerts(teams=[data["team"]])
                adjective = periods.PERIOD_ADJECTIVES[data["period"]]
                messages.success(request, f"Budget saved: {data['team'].name}, {adjective} ${data['amount_usd']}.")
                return redirect("ops-budgets")
    else:
        form = BudgetForm(user=request.user)
    statuses = [(team, budgets.budget_status(team)) for team in teams]
    return render(request, "dashboards/budget.html", {"form": form, "statuses": statuses})


@login_required
@require_POST
def budget_delete(request: HttpRequest, budget_id: int) -> HttpResponse:
    budget = Budget.objects.filter(pk=budget_id, team__in=bills.teams_billable_by(request.user)).first()
    if budget is None:
        raise Http404("no such budget")
    budgets.budget_delete(user=request.user, budget=budget)
    messages.success(request, "Budget removed.")
    return redirect("ops-budgets")
