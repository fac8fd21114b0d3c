"""URLs of the team-lead, launcher and admin pages (issue 7); include under ``ops/``:

    path("ops/", include("dashboards.web.urls_ops")),
"""

from django.urls import path

from dashboards.web.views import agents, audit, bills, budgets, control, launch, triage
from dashboards.web.views import netpolicy as views_netpolicy
from dashboards.web.views import reservations as views_reservations

urlpatterns = [
    path("bills/", bills.bills_page, name="ops-bills"),
    path("bills.csv", bills.bills_csv, name="ops-bills-csv"),
    path("budgets/", budgets.budgets_page, name="ops-budgets"),
    path("budgets/<int:budget_id>/delete", budgets.budget_delete, name="ops-budget-delete"),
    path("launch/", launch.launch_page, name="ops-launch"),
    path("urgent/", launch.urgent_page, name="ops-urgent"),
    path("reservations/", views_reservations.reservations_page, name="ops-reservations"),
    path("reservations/<int:ar_id>/delete", views_reservations.reservation_delete_view,
         name="ops-reservation-delete"),
    path("urgent/agents", launch.urgent_agents_fragment, name="ops-urgent-agents"),
    path("campaigns/<int:campaign_id>/", control.campaign_ops_page, name="ops-campaign"),
    path("campaigns/<int:campaign_id>/control", control.campaign_control_view, name="ops-campaign-control"),
    path("campaigns/<int:campaign_id>/controls", control.campaign_controls_fragment, name="ops-campaign-controls"),
    path("campaigns/<int:campaign_id>/network-policy", views_netpolicy.campaign_network_policy_view,
         name="ops-campaign-network-policy"),
    path("triage/", triage.triage_page, name="ops-triage"),
    path("triage/action", triage.triage_action_view, name="ops-triage-action"),
    path("triage/group", triage.triage_group_view, name="ops-triage-group"),
    path("audit/", audit.audit_page, name="ops-audit"),
    path("audit.csv", audit.audit_csv, name="ops-audit-csv"),
    path("agents/", agents.agent_definitions_page, name="ops-agents"),
]
