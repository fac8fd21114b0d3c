"""Launching a campaign and an urgent agent (forecast first, then launch)."""
from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods

from dashboards.core import limits
from dashboards.core.errors import Refused
from dashboards.core.roles import request_can
from dashboards.launch import preview as preview_mod
from dashboards.launch import service
from dashboards.web.forms import LaunchForm, UrgentForm
from dashboards.web.views.common import refused

# --------------------------------------------------------------------------- launching

@login_required
@require_http_methods(["GET", "POST"])
def launch_page(request: HttpRequest) -> HttpResponse:
    if not request_can(request, "launch"):
        return refused(request, "Launching is for launchers of a team.", action="launch")
    preview = None
    if request.method == "POST":
        form = LaunchForm(request.POST, request.FILES, user=request.user)
        if form.is_valid():
            if "launch" in request.POST:
                try:
                    outcome = service.launch(user=request.user, request=form.launch_request())
                except Refused as exc:
                    form.add_error(None, str(exc))
                else:
                    campaign = outcome.campaign
                    note = ""
                    if outcome.held_for_budget:
                        note = f" It was submitted on hold: {outcome.verdict['message']}."
                    messages.success(request, f"Campaign {campaign.name} (#{campaign.pk}) launched with "
                                              f"{campaign.task_count} tasks.{note}")
                    return redirect("campaign", campaign_id=campaign.pk)  # the page to watch it on
            preview = preview_mod.launch_preview(user=request.user, request=form.launch_request())
    else:
        form = LaunchForm(user=request.user)
    return render(request, "dashboards/launch.html", {"form": form, "preview": preview,
                                                       "input_examples": form.input_examples()})


@login_required
@require_http_methods(["GET", "POST"])
def urgent_page(request: HttpRequest) -> HttpResponse:
    if not request_can(request, "urgent"):
        return refused(request, "Urgent agents are for urgent launchers.", action="urgent_launch")
    if request.method == "POST":
        form = UrgentForm(request.POST, user=request.user)
        if form.is_valid():
            data = form.cleaned_data
            try:
                outcome = service.urgent_launch(user=request.user, team=data["team"],
                                                  agent_definition=data["agent_definition"], input=data["input"],
                                                  name=data["name"], queue=data["queue"],
                                                  seats_per_task=data["seats_per_task"], model=data["model"],
                                                  cluster=data.get("cluster"))
            except Refused as exc:
                form.add_error(None, str(exc))
            else:
                messages.success(request, f"Urgent agent {outcome.campaign.name} (#{outcome.campaign.pk}) submitted "
                                          f"with priority {limits.URGENT_PRIORITY}.")
                return redirect("ops-urgent")
    else:
        form = UrgentForm(user=request.user)
    return render(request, "dashboards/urgent.html", {"form": form, "agents": service.urgent_agents(request.user)})


@login_required
def urgent_agents_fragment(request: HttpRequest) -> HttpResponse:
    """The urgent agents table alone, refreshed by the page every few seconds."""
    return render(request, "dashboards/urgent_agents.html", {"agents": service.urgent_agents(request.user)})
