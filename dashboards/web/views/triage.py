"""Admin triage: waiting jobs grouped by the reason they wait; an action on one job or a group."""
from __future__ import annotations

import time
from urllib.parse import urlencode

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, QueryDict
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from dashboards.control import actions, group_actions, triage
from dashboards.core import ranges
from dashboards.core.errors import ActionRefused, LaunchError
from dashboards.core.roles import request_can
from dashboards.models import AuditEntry
from dashboards.web.forms import TriageActionForm
from dashboards.web.views.common import refused

def _triage_context(request: HttpRequest) -> dict:
    """The triage page's data for the filters, search and sort in the URL (``group_actions.TRIAGE_FILTERS``,
    ``sort``, ``dir=asc|desc``)."""
    from dashboards.live.publish import live_status

    overview = triage.triage_overview(max_jobs=group_actions.TRIAGE_MAX_JOBS)
    chosen = {k: request.GET.get(k, "")[:100] for k in group_actions.TRIAGE_FILTERS}
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
        # A choice in a list cannot keep "36 s ago" moving: a hold is said with its clock time there.
        "reason": sorted({(g["key"], g.get("fixed") or g["label"]) for g in (j["group"] for j in every)}),
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
            "query": request.GET.urlencode(), "recent": recent, "actions": TriageActionForm.ACTIONS,
            "live": live_status(), "rendered_at": time.time()}


def _back_to_triage(request: HttpRequest) -> HttpResponse:
    """Back to the triage page with the filters the action was sent from (``next``: a query string)."""
    query = request.POST.get("next", "")
    if query.startswith("?"):
        query = query[1:]
    return redirect(reverse("ops-triage") + ("?" + QueryDict(query).urlencode() if query else ""))


@login_required
def triage_page(request: HttpRequest) -> HttpResponse:
    if not request_can(request, "triage"):
        return refused(request, "Triage is for cluster admins.")
    return render(request, "dashboards/triage.html", _triage_context(request))


@login_required
@require_POST
def triage_action_view(request: HttpRequest) -> HttpResponse:
    if not request_can(request, "triage"):
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
            "tasks_text": ranges.ranges_text(data["tasks"]),
            "action_label": dict(TriageActionForm.ACTIONS)[data["action"]]})
    try:
        entry = actions.triage_action(user=request.user, action=data["action"], job_number=data["job_number"],
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
    if not request_can(request, "triage"):
        return refused(request, "Triage is for cluster admins.", action="triage")
    action = request.POST.get("action", "")
    try:
        priority = group_actions.priority_argument(action, request.POST.get("priority", ""))
        group, group_jobs = group_actions.shown_group(
            key=request.POST.get("group", ""), action=action,
            filters=QueryDict(request.POST.get("next", "").lstrip("?")))  # the filters the page was sent from
        label = dict(TriageActionForm.ACTIONS)[action]
        if request.POST.get("confirm") != "yes":
            return render(request, "dashboards/triage_confirm.html", {
                "group": group, "group_jobs": group_jobs, "action": action, "action_label": label,
                "priority": priority, "next": request.POST.get("next", "")})
        done = group_actions.group_action(user=request.user, group=group, action=action, priority=priority,
                                          confirmed=request.POST.getlist("jobs"))
    except ActionRefused as exc:
        messages.error(request, str(exc))
        return _back_to_triage(request)
    if done.queued:
        plural = "s" if len(done.queued) != 1 else ""
        messages.success(request, f"{label.capitalize()} requested for job{plural} {', '.join(map(str, done.queued))}, "
                                  f"whose tasks {group.get('fixed') or group['label']}.")
    if done.joined:
        messages.warning(request, f"Skipped job{'s' if len(done.joined) != 1 else ''} "
                                  f"{', '.join(map(str, done.joined))}: joined the group after the confirmation page was "
                                  f"shown (not on the confirmation page); look at the group again to act on them.")
    if done.left:
        messages.warning(request, f"Skipped job{'s' if len(done.left) != 1 else ''} "
                                  f"{', '.join(map(str, done.left))}: no longer in the group "
                                  f"(started, ended or waiting for something else now).")
    for job_number, why in done.failed:
        messages.error(request, f"job {job_number}: {why}")
    return _back_to_triage(request)
