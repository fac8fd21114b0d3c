"""The agent registry page: launchers see the agents they may launch (not their command lines);
admins see and edit everything."""
from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods

from dashboards.core.roles import is_admin, request_can
from dashboards.launch import agents
from dashboards.models import AgentDefinition
from dashboards.web.forms import AgentDefinitionForm
from dashboards.web.views.common import refused

# --------------------------------------------------------------------------- agent registry

@login_required
@require_http_methods(["GET", "POST"])
def agent_definitions_page(request: HttpRequest) -> HttpResponse:
    admin = is_admin(request.user)
    if not (admin or request_can(request, "launch")):
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
        "definitions": AgentDefinition.objects.order_by("name", "-version"), "form": form, "editing": instance,
        # An agent's command line (its paths, flags, perhaps a site's internals) is the admins'; launchers
        # choose an agent by name, version, input and model (fresh attack A7).
        "show_command": admin})
