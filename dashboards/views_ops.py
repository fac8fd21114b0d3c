"""Pages for team leads, launchers and admins: bills, budgets, launching, urgent agents,
campaign control, triage, the audit log and the agent registry.

Thin: each view checks the form, calls ``billing``, ``launch`` or ``control`` and
renders. A user without the capability gets 403 with the reason; a refused
or invalid request submits nothing and shows the form again as typed.
"""
from __future__ import annotations

import datetime as dt
import json
from urllib.parse import urlencode

from django.core.paginator import Paginator

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse, QueryDict, StreamingHttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_http_methods, require_POST

from . import agents, audit, billing, control, inputs, launch, launch_forecast, limits, notices, selectors, triage
from . import csv_export
from .clusters import cluster_get_default
from . import forms as ops_forms
from .forms import (
    AgentDefinitionForm,
    BillForm,
    BudgetForm,
    CampaignControlForm,
    LaunchForm,
    TriageActionForm,
    UrgentForm,
)
from .audit import ActionRefused
from .models import AgentDefinition, AuditEntry, Budget, Campaign
from .roles import is_admin, teams_with, user_can
from .services import LaunchError


def refused(request: HttpRequest, message: str, *, action: str = "") -> HttpResponse:
    """403 with the reason; a refused POST of a launch or control ``action`` is audited too."""
    if action and request.method == "POST":
        audit.audit(user=request.user, action=action, target="", params={"status": "refused", "path": request.path},
                        ok=False, result=f"refused: {message}")
    return render(request, "dashboards/launch_refused.html", {"message": message}, status=403)


# --------------------------------------------------------------------------- bills and budgets

def _bill_query(form: BillForm, **changes) -> str:
    """The bill's query string with ``changes`` (None drops a key): every view is a link."""
    from urllib.parse import urlencode

    data = form.cleaned_data
    query = {"period": data["period"], "first": data["first"].isoformat(), "last": data["last"].isoformat(),
             "group_by": data["group_by"], "team": data["team"].pk if data.get("team") else "",
             "campaign": data.get("campaign") or "", "model": data.get("model") or "",
             "launcher": data.get("launcher") or ""}
    query.update(changes)
    return urlencode({k: v for k, v in query.items() if v not in ("", None)})


def _bill(form: BillForm) -> dict:
    data = form.cleaned_data
    return billing.bill(teams=form.teams(), period=data["period"], first=data["first"], last=data["last"],
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
    context = {"form": form, "bill": None, "buckets": billing.BUCKETS, "bucket_labels": billing.BUCKET_LABELS,
               "csv_query": request.GET.urlencode(), "usage_definition": billing.USAGE_DEFINITION,
               "successful_verdict": billing.SUCCESSFUL_VERDICT, "presets": [], "burndowns": []}
    if form.is_valid():
        try:
            result = _bill(form)
        except billing.BillError as exc:
            form.add_error(None, str(exc))
        else:
            _row_links(form, result)
            filters = form.filters()
            campaign = None
            if filters["campaign"]:
                campaign = Campaign.objects.filter(pk=filters["campaign"], team__in=form.teams()).first()
            today = ops_forms._today()
            context.update(
                bill=result, chart=billing.bill_chart(result), units=billing.unit_costs(result["totals"]),
                csv_query=_bill_query(form), campaign=campaign, filters=filters,
                costliest=billing.costliest_tasks(campaign.pk, teams=form.teams()) if campaign else [],
                clear_query=_bill_query(form, campaign=None, model=None, launcher=None),
                group_links={g: "?" + _bill_query(form, group_by=g) for g in billing.GROUPS},
                presets=[{**p, "query": _bill_query(form, first=p["first"].isoformat(), last=p["last"].isoformat(),
                                                    period=p["period"]),
                          "on": (p["first"], p["last"]) == (form.cleaned_data["first"], form.cleaned_data["last"])}
                         for p in billing.presets(today)],
                burndowns=[{**billing.budget_burndown(b), "team": b.team}
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
    except billing.BillError as exc:
        return HttpResponse(f"bad bill request: {exc}", status=400, content_type="text/plain")
    response = HttpResponse(content_type="text/csv; charset=utf-8")
    writer = csv_export.writer(response)
    campaign_id = form.filters()["campaign"]
    if request.GET.get("view") == "tasks" and campaign_id:
        response["Content-Disposition"] = f'attachment; filename="tco-campaign-{campaign_id}-tasks-by-cost.csv"'
        writer.writerow(["campaign", "task_number", "state", "verdict", "total_tokens", "cost_usd", "wallclock_s"])
        for t in billing.costliest_tasks(campaign_id, teams=form.teams(), limit=100_000):
            tokens = sum(getattr(t, b) or 0 for b in billing.BUCKETS)
            writer.writerow([campaign_id, t.task_number, t.state, t.verdict, tokens,
                             format(t.cost_usd.normalize(), "f") if t.cost_usd is not None else "unpriced",
                             f"{t.wallclock_s or 0:.3f}"])
        return response
    filename = (f"tco-bill-{result['period']}-{result['group_by']}-{result['first'].isoformat()}"
                f"-{result['last'].isoformat()}.csv")
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    for row in billing.bill_csv_rows(result):
        writer.writerow(row)
    return response


@login_required
@require_http_methods(["GET", "POST"])
def budgets_page(request: HttpRequest) -> HttpResponse:
    teams = list(billing.teams_billable_by(request.user).order_by("name"))
    if not teams:
        return refused(request, "Budgets are for team leads (and admins).")
    if request.method == "POST":
        form = BudgetForm(request.POST, user=request.user)
        if form.is_valid():
            data = form.cleaned_data
            try:
                billing.budget_set(user=request.user, team=data["team"], period=data["period"],
                                   amount_usd=data["amount_usd"], thresholds=data["thresholds"],
                                   on_exceed=data["on_exceed"], alert_emails=data["alert_emails"])
            except (PermissionError, billing.BillError) as exc:
                form.add_error(None, str(exc))
            else:
                billing.budget_check_alerts(teams=[data["team"]])
                adjective = billing.PERIOD_ADJECTIVES[data["period"]]
                messages.success(request, f"Budget saved: {data['team'].name}, {adjective} ${data['amount_usd']}.")
                return redirect("ops-budgets")
    else:
        form = BudgetForm(user=request.user)
    statuses = [(team, billing.budget_status(team)) for team in teams]
    return render(request, "dashboards/budget.html", {"form": form, "statuses": statuses})


@login_required
@require_POST
def budget_delete(request: HttpRequest, budget_id: int) -> HttpResponse:
    budget = Budget.objects.filter(pk=budget_id, team__in=billing.teams_billable_by(request.user)).first()
    if budget is None:
        raise Http404("no such budget")
    billing.budget_delete(user=request.user, budget=budget)
    messages.success(request, "Budget removed.")
    return redirect("ops-budgets")


# --------------------------------------------------------------------------- launching

@login_required
@require_http_methods(["GET", "POST"])
def launch_page(request: HttpRequest) -> HttpResponse:
    if not user_can(request.user, "launch"):
        return refused(request, "Launching is for launchers of a team.", action="launch")
    preview = None
    if request.method == "POST":
        form = LaunchForm(request.POST, request.FILES, user=request.user)
        if form.is_valid():
            data = form.cleaned_data
            if "launch" in request.POST:
                try:
                    outcome = launch.launch(user=request.user, request=form.launch_request())
                except (ActionRefused, LaunchError) as exc:
                    form.add_error(None, str(exc))
                else:
                    campaign = outcome.campaign
                    note = ""
                    if outcome.held_for_budget:
                        note = f" It was submitted on hold: {outcome.verdict['message']}."
                    messages.success(request, f"Campaign {campaign.name} (#{campaign.pk}) launched with "
                                              f"{campaign.task_count} tasks.{note}")
                    return redirect("ops-campaign", campaign_id=campaign.pk)
            preview = launch.launch_preview(user=request.user, team=data["team"],
                                               agent_definition=data["agent_definition"], count=len(data["inputs"]),
                                               model=data["model"], cost_cap_usd=data["cost_cap_usd"])
            preview["count"] = len(data["inputs"])
            preview["timing"] = launch_forecast.timing_forecast(
                cluster=cluster_get_default(), team=data["team"], count=len(data["inputs"]), queue=data["queue"],
                seats_per_task=data["seats_per_task"], concurrency_cap=data["concurrency_cap"],
                priority=data["priority"], duration_s=preview["forecast"]["duration_s"],
                agent_definition=data["agent_definition"], predecessor_job=data["predecessor_job"],
                user=request.user)
            preview["headroom"] = launch_forecast.budget_headroom(preview["verdict"], preview["expected_usd"])
            preview["basis"] = launch_forecast.history_basis(agent_definition=data["agent_definition"],
                                                             inputs=data["inputs"], forecast=preview["forecast"],
                                                             user=request.user)
    else:
        form = LaunchForm(user=request.user)
    return render(request, "dashboards/launch.html", {"form": form, "preview": preview,
                                                       "inputs_root": inputs.inputs_root(),
                                                       "input_examples": form.input_examples()})


@login_required
@require_http_methods(["GET", "POST"])
def urgent_page(request: HttpRequest) -> HttpResponse:
    if not user_can(request.user, "urgent"):
        return refused(request, "Urgent agents are for urgent launchers.", action="urgent_launch")
    if request.method == "POST":
        form = UrgentForm(request.POST, user=request.user)
        if form.is_valid():
            data = form.cleaned_data
            try:
                outcome = launch.urgent_launch(user=request.user, team=data["team"],
                                                  agent_definition=data["agent_definition"], input=data["input"],
                                                  name=data["name"], queue=data["queue"],
                                                  seats_per_task=data["seats_per_task"], model=data["model"])
            except (ActionRefused, LaunchError) as exc:
                form.add_error(None, str(exc))
            else:
                messages.success(request, f"Urgent agent {outcome.campaign.name} (#{outcome.campaign.pk}) submitted "
                                          f"with priority {limits.URGENT_PRIORITY}.")
                return redirect("ops-urgent")
    else:
        form = UrgentForm(user=request.user)
    return render(request, "dashboards/urgent.html", {"form": form, "agents": launch.urgent_agents(request.user)})


@login_required
def urgent_agents_fragment(request: HttpRequest) -> HttpResponse:
    """The urgent agents table alone, refreshed by the page every few seconds."""
    return render(request, "dashboards/urgent_agents.html", {"agents": launch.urgent_agents(request.user)})


# --------------------------------------------------------------------------- campaign control

def _visible_campaign(request: HttpRequest, campaign_id: int) -> Campaign:
    campaign = (Campaign.objects.filter(pk=campaign_id, team__in=teams_with(request.user, "view"))
                .select_related("team", "agent_definition", "launched_by", "retry_of").first())
    if campaign is None:
        raise Http404("no such campaign")
    return campaign


@login_required
def campaign_ops_page(request: HttpRequest, campaign_id: int) -> HttpResponse:
    campaign = _visible_campaign(request, campaign_id)
    history = []
    can_control = user_can(request.user, "control", campaign.team)
    if can_control:  # the campaign's launches and control actions, an admin's on its job included
        history = control.campaign_actions(campaign)
    summary = notices.campaign_summary(campaign)
    summary["states"] = control.campaign_states(campaign, summary["states"])
    ended = sum(n for s, n in summary["states"].items() if s in ("done", "failed", "deleted", "lost"))
    return render(request, "dashboards/launch_campaign.html", {
        "campaign": campaign, "summary": summary, "priority": control.campaign_priority(campaign),
        "controls": control.campaign_controls(campaign, summary["states"]), "ended": ended,
        "predecessor": control.predecessor_campaign(campaign),
        "progress_pct": round(100.0 * ended / campaign.task_count, 1) if campaign.task_count else 0.0,
        "can_control": can_control, "history": history,
        "retries": list(campaign.retries.order_by("launched_at")), "now": timezone.now()})


@login_required
def campaign_controls_fragment(request: HttpRequest, campaign_id: int) -> HttpResponse:
    """The control page's buttons alone (``campaign_controls.html``), as the campaign is now: the
    page's script fetches it when the live status or task counts change, so Pause, Resume, Cancel
    and Retry follow the campaign without a reload. 403 for users who may not control it."""
    campaign = _visible_campaign(request, campaign_id)
    if not user_can(request.user, "control", campaign.team):
        return HttpResponse("You may not control this campaign.", status=403, content_type="text/plain")
    states = notices.campaign_summary(campaign)["states"]
    response = render(request, "dashboards/campaign_controls.html", {
        "campaign": campaign, "controls": control.campaign_controls(campaign, states)})
    response["Cache-Control"] = "no-store"
    return response


@login_required
@require_POST
def campaign_control_view(request: HttpRequest, campaign_id: int) -> HttpResponse:
    campaign = _visible_campaign(request, campaign_id)
    form = CampaignControlForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Unknown action.")
        return redirect("ops-campaign", campaign_id=campaign.pk)
    action = form.cleaned_data["action"]
    if not form.cleaned_data["confirm"]:
        if not user_can(request.user, "control", campaign.team):
            return refused(request, f"You may not control campaigns of team {campaign.team.name}.",
                           action=f"campaign_{action}")
        return render(request, "dashboards/launch_confirm.html", {"campaign": campaign, "action": action,
                                                                  "summary": notices.campaign_summary(campaign)})
    try:
        if action == "retry":
            outcome = launch.campaign_retry(user=request.user, campaign=campaign)
            messages.success(request, f"Retry campaign {outcome.campaign.name} (#{outcome.campaign.pk}) launched "
                                      f"with the {outcome.campaign.task_count} failed tasks.")
            return redirect("ops-campaign", campaign_id=outcome.campaign.pk)
        control.campaign_control(user=request.user, campaign=campaign, action=action)
    except ActionRefused as exc:
        return refused(request, str(exc))
    except LaunchError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"{action.capitalize()} requested; the result appears below in a moment.")
    return redirect("ops-campaign", campaign_id=campaign.pk)


# --------------------------------------------------------------------------- triage and audit

#: Waiting jobs the triage page reads reasons for (one cached ``qstat -j`` each).
TRIAGE_MAX_JOBS = 200

TRIAGE_FILTERS = ("team", "owner", "queue", "reason", "state", "q")


def _triage_context(request: HttpRequest) -> dict:
    """The triage page's data for the filters, search and sort in the URL (``TRIAGE_FILTERS``,
    ``sort``, ``dir=asc|desc``)."""
    overview = triage.triage_overview(max_jobs=TRIAGE_MAX_JOBS)
    chosen = {k: request.GET.get(k, "")[:100] for k in TRIAGE_FILTERS}
    sort = request.GET.get("sort", "wait")
    if sort not in triage.SORTS:
        sort = "wait"
    direction = request.GET.get("dir", "")
    descending = {"asc": False, "desc": True}.get(direction)
    jobs = triage.triage_filter(overview["jobs"], **chosen, sort=sort, descending=descending)
    every = overview["jobs"]
    facets = {
        "team": sorted({j["team"] for j in every if j["team"]}),
        "owner": sorted({j["launcher"] or j["owner"] for j in every if j["launcher"] or j["owner"]}),
        "queue": sorted({j["queue"] for j in every if j["queue"]}),
        "reason": sorted({(g["key"], g["label"]) for g in (j["group"] for j in every)}),
        "state": ["error", "held", "waiting", "pending"],
    }
    reverse = triage.SORTS[sort][1] if descending is None else descending
    base = {k: v for k, v in chosen.items() if v}
    columns = []
    for key, label in (("job", "Job"), ("owner", "Owner"), ("team", "Team"), ("tasks", "Waiting tasks"),
                       ("priority", "Priority"), ("wait", "Waiting for")):
        on = key == sort
        query = {**base, "sort": key, "dir": ("asc" if reverse else "desc") if on else
                 ("desc" if triage.SORTS[key][1] else "asc")}
        columns.append({"key": key, "label": label, "query": urlencode(query),
                        "aria": ("descending" if reverse else "ascending") if on else "none"})
    recent = list(AuditEntry.objects.filter(action__startswith="triage_").select_related("user")
                  .order_by("-at", "-id")[:10])
    return {"overview": overview, "jobs": jobs, "groups": triage.triage_groups(jobs), "facets": facets,
            "chosen": chosen, "sort": sort, "columns": columns, "filtered": bool(base),
            "query": request.GET.urlencode(), "recent": recent, "actions": TriageActionForm.ACTIONS}


def _back_to_triage(request: HttpRequest) -> HttpResponse:
    """Back to the triage page with the filters the action was sent from (``next``: a query string)."""
    query = request.POST.get("next", "")
    if query.startswith("?"):
        query = query[1:]
    return redirect(reverse("ops-triage") + ("?" + QueryDict(query).urlencode() if query else ""))


@login_required
def triage_page(request: HttpRequest) -> HttpResponse:
    if not user_can(request.user, "triage"):
        return refused(request, "Triage is for cluster admins.")
    return render(request, "dashboards/triage.html", _triage_context(request))


@login_required
@require_POST
def triage_action_view(request: HttpRequest) -> HttpResponse:
    if not user_can(request.user, "triage"):
        return refused(request, "Triage is for cluster admins.", action="triage")
    form = TriageActionForm(request.POST)
    if not form.is_valid():  # shown inline, at the job's row, with the page as it was
        context = _triage_context(request)
        context["row_errors"] = {"job": request.POST.get("job_number", ""), "errors": [
            (field if field != "__all__" else "", " ".join(errors)) for field, errors in form.errors.items()]}
        return render(request, "dashboards/triage.html", context, status=400)
    data = form.cleaned_data
    if not data["confirm"]:
        confirm = TriageActionForm(initial={**request.POST.dict(), "confirm": True})
        return render(request, "dashboards/triage_confirm.html", {
            "form": form, "confirm_form": confirm, "data": data, "next": request.POST.get("next", ""),
            "tasks_text": control.ranges_text(data["tasks"]),
            "action_label": dict(TriageActionForm.ACTIONS)[data["action"]]})
    try:
        entry = control.triage_action(user=request.user, action=data["action"], job_number=data["job_number"],
                                        tasks=data["tasks"], priority=data["priority"])
    except ActionRefused as exc:
        return refused(request, str(exc))
    except LaunchError as exc:
        messages.error(request, f"Job {data['job_number']}: {exc}")
    else:
        messages.success(request, f"{dict(TriageActionForm.ACTIONS)[data['action']].capitalize()} of job "
                                  f"{data['job_number']} requested (request #{entry.pk}).")
    return _back_to_triage(request)


@login_required
@require_POST
def triage_group_view(request: HttpRequest) -> HttpResponse:
    """One action on every job of a reason group (``group``: its key) as the page showed it (the
    filters and search in ``next``), after one confirmation.

    The confirmation page posts the job numbers it listed (``jobs``, repeated); the action runs
    only on jobs both confirmed and still in the group (``triage.confirmed_in_group``): one
    that joined the group after the page was shown is skipped, and so is one that left it; the
    message names both. Each job goes through ``control.triage_action`` (checked and audited
    one by one); the results come back as one message on the triage page: how many were queued,
    which were skipped, and each refusal with its job.
    """
    if not user_can(request.user, "triage"):
        return refused(request, "Triage is for cluster admins.", action="triage")
    key = request.POST.get("group", "")
    action = request.POST.get("action", "")
    if action not in control.TRIAGE_ACTIONS:
        messages.error(request, f"Unknown action {action[:32]!r}.")
        return _back_to_triage(request)
    priority = None
    if action == "priority":
        try:
            priority = int(request.POST.get("priority", ""))
        except ValueError:
            priority = None
        if priority is None or not limits.PRIORITY_MIN <= priority <= limits.PRIORITY_MAX:
            messages.error(request, f"Priority: a whole number from {limits.PRIORITY_MIN} to {limits.PRIORITY_MAX}.")
            return _back_to_triage(request)
    overview = triage.triage_overview(max_jobs=TRIAGE_MAX_JOBS)
    # The group as the page showed it: with the filters and search it was sent from.
    shown = QueryDict(request.POST.get("next", "").lstrip("?"))
    jobs = triage.triage_filter(overview["jobs"], **{k: shown.get(k, "")[:100] for k in TRIAGE_FILTERS})
    group = next((g for g in triage.triage_groups(jobs) if g["key"] == key), None)
    if group is None:
        messages.error(request, "That group has no waiting jobs any more (they may have started); nothing was done.")
        return _back_to_triage(request)
    if action != group["action"]["action"]:  # a group's bulk action is its own, on its jobs only
        messages.error(request, f"{group['title']}: " + (f"the bulk action on this group is {group['action']['label']}"
                                                          if group["action"]["action"] else
                                                          f"no action in tco moves these ({group['action']['why']})")
                       + "; nothing was done.")
        return _back_to_triage(request)
    label = dict(TriageActionForm.ACTIONS)[action]
    if request.POST.get("confirm") != "yes":
        jobs = [j for j in jobs if j["job_number"] in group["jobs"]]
        return render(request, "dashboards/triage_confirm.html", {
            "group": group, "group_jobs": jobs, "action": action, "action_label": label, "priority": priority,
            "next": request.POST.get("next", "")})
    try:
        chosen = triage.confirmed_in_group(group["jobs"], request.POST.getlist("jobs"))
    except ValueError:
        chosen = None
    if not chosen or not chosen["act"]:
        messages.error(request, f"{group['title']}: " + (
            "the confirmation listed no job of this group now (they may have started, or the group changed)"
            if chosen is not None else "the confirmation's job numbers are not valid")
            + "; nothing was done. Look at the group again and confirm.")
        return _back_to_triage(request)
    queued, failed = [], []
    for job_number in chosen["act"]:
        try:
            control.triage_action(user=request.user, action=action, job_number=job_number, priority=priority)
        except (ActionRefused, LaunchError) as exc:
            failed.append(f"job {job_number}: {exc}")
        else:
            queued.append(job_number)
    if queued:
        messages.success(request, f"{label.capitalize()} of {len(queued)} job{'s' if len(queued) != 1 else ''} "
                                  f"(that {group['label']}) requested: {', '.join(map(str, queued))}.")
    if chosen["joined"]:
        messages.warning(request, f"Skipped job{'s' if len(chosen['joined']) != 1 else ''} "
                                  f"{', '.join(map(str, chosen['joined']))}: joined the group after the confirmation page was shown "
                                  f"(not on the confirmation page); look at the group again to act on them.")
    if chosen["left"]:
        messages.warning(request, f"Skipped job{'s' if len(chosen['left']) != 1 else ''} "
                                  f"{', '.join(map(str, chosen['left']))}: no longer in the group "
                                  f"(started, ended or waiting for something else now).")
    for text in failed:
        messages.error(request, text)
    return _back_to_triage(request)


def _audit_query(request: HttpRequest) -> tuple[dict, object, str, bool]:
    """The audit filters, sort and direction from the URL, and the matching entries (admins only)."""
    chosen = {k: request.GET.get(k, "")[:100] for k in selectors.AUDIT_FILTERS}
    dates = {}
    for name in ("since", "until"):
        try:
            dates[name] = dt.date.fromisoformat(chosen[name]) if chosen[name] else None
        except ValueError:
            dates[name] = None
            chosen[name] = ""
    sort = request.GET.get("sort", "at")
    if sort not in selectors.AUDIT_SORTS:
        sort = "at"
    descending = request.GET.get("dir", "desc") != "asc"
    entries = selectors.audit_search(request.user, action=chosen["action"], who=chosen["who"], ok=chosen["ok"],
                                     q=chosen["q"], since=dates["since"], until=dates["until"], sort=sort,
                                     descending=descending)
    return chosen, entries, sort, descending


@login_required
def audit_page(request: HttpRequest) -> HttpResponse:
    try:
        chosen, entries, sort, descending = _audit_query(request)
    except ActionRefused as exc:
        return refused(request, str(exc))
    page = Paginator(entries, selectors.AUDIT_PER_PAGE).get_page(request.GET.get("page"))
    rows = [{"entry": e, "params": selectors.audit_params_text(e.params), "link": selectors.audit_target_link(e.target)}
            for e in page.object_list]
    base = {k: v for k, v in chosen.items() if v}
    columns = []
    for key, label in (("at", "When (UTC)"), ("who", "Who"), ("action", "Action"), ("target", "Target"),
                       ("ok", "OK")):
        on = key == sort
        columns.append({"key": key, "label": label, "aria": ("descending" if descending else "ascending") if on
                        else "none", "query": urlencode({**base, "sort": key,
                                                         "dir": ("asc" if descending else "desc") if on else "desc"})})
    query = urlencode({**base, "sort": sort, "dir": "desc" if descending else "asc"})
    return render(request, "dashboards/audit.html", {
        "rows": rows, "page": page, "chosen": chosen, "columns": columns, "query": query, "filtered": bool(base),
        "actions": sorted(set(AuditEntry.objects.values_list("action", flat=True).distinct())),
        "users": sorted(set(AuditEntry.objects.filter(user__isnull=False)
                            .values_list("user__username", flat=True).distinct()))})


@login_required
def audit_csv(request: HttpRequest) -> HttpResponse:
    """The audit entries of the page's filters and sort, every page, as CSV (UTF-8)."""
    try:
        _chosen, entries, _sort, _descending = _audit_query(request)
    except ActionRefused as exc:
        return refused(request, str(exc))

    class _Echo:
        def write(self, value):
            return value

    writer = csv_export.writer(_Echo())

    def rows():
        yield writer.writerow(["at_utc", "user", "action", "target", "ok", "result", "params_json"])
        for e in entries.iterator(chunk_size=2000):
            yield writer.writerow([e.at.isoformat(), e.user.get_username() if e.user else "", e.action, e.target,
                                   "yes" if e.ok else "no", e.result, json.dumps(e.params, sort_keys=True)])

    response = StreamingHttpResponse(rows(), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="tco-audit-{timezone.now():%Y%m%d-%H%M%S}.csv"'
    return response


# --------------------------------------------------------------------------- agent registry

@login_required
@require_http_methods(["GET", "POST"])
def agent_definitions_page(request: HttpRequest) -> HttpResponse:
    admin = is_admin(request.user)
    if not (admin or user_can(request.user, "launch")):
        return refused(request, "The agent registry is for launchers and admins.")
    instance = None
    edit = request.GET.get("edit") or request.POST.get("edit")
    if edit:
        if not str(edit).isdigit():
            raise Http404("no such agent definition")
        instance = get_object_or_404(AgentDefinition, pk=int(edit))
    form = None
    if request.method == "POST":
        if not admin:
            return refused(request, "Only admins may edit agent definitions.", action="agent_definition_save")
        form = AgentDefinitionForm(request.POST, instance=instance)
        if form.is_valid():
            definition = agents.agent_definition_save(user=request.user, definition=form.save(commit=False))
            messages.success(request, f"Agent definition {definition} saved.")
            return redirect(reverse("ops-agents"))
    elif admin:
        form = AgentDefinitionForm(instance=instance)
    return render(request, "dashboards/launch_agents.html", {
        "definitions": AgentDefinition.objects.order_by("name", "-version"), "form": form, "editing": instance})
