"""Admin triage: waiting jobs grouped by the reason they wait; an action on one job or a group."""
from __future__ import annotations

from urllib.parse import urlencode
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, QueryDict
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST
from dashboards.core import limits
from dashboards.control import triage
from dashboards.control import actions
from dashboards.core import ranges
from dashboards.web.forms import TriageActionForm
from dashboards.core.audit import ActionRefused
from dashboards.models import AuditEntry
from dashboards.core.roles import user_can
from dashboards.core.errors import LaunchError
from dashboards.web.views.common import refused


# --------------------------------------------------------------------------- triage and audit

#: Waiting jobs the triage page reads reasons for (one cached ``qstat -j`` each).
TRIAGE_MAX_JOBS = 200

TRIAGE_FILTERS = ("team", "owner", "queue", "reason", "state", "q")


def _triage_context(request: HttpRequest) -> dict:
    """The triage page's data for the filters, search and sort in the URL (``TRIAGE_FILTERS``,
    ``sort``, ``dir=asc|desc``)."""
    from dashboards.live.publish import live_status

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
            "query": request.GET.urlencode(), "recent": recent, "actions": TriageActionForm.ACTIONS,
            "live": live_status()}


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
    if not user_can(request.user, "triage"):
        return refused(request, "Triage is for cluster admins.", action="triage")
    key = request.POST.get("group", "")
    action = request.POST.get("action", "")
    if action not in actions.TRIAGE_ACTIONS:
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
    from dashboards.live.publish import live_status

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
            actions.triage_action(user=request.user, action=action, job_number=job_number, priority=priority)
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
