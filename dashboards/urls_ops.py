"""URLs of the team-lead, launcher and admin pages (issue 7); include under ``ops/``:

    path("ops/", include("dashboards.urls_ops")),
"""
from django.urls import path

from . import views_netpolicy, views_ops, views_reservations

urlpatterns = [
    path("bills/", views_ops.bills_page, name="ops-bills"),
    path("bills.csv", views_ops.bills_csv, name="ops-bills-csv"),
    path("budgets/", views_ops.budgets_page, name="ops-budgets"),
    path("budgets/<int:budget_id>/delete", views_ops.budget_delete, name="ops-budget-delete"),
    path("launch/", views_ops.launch_page, name="ops-launch"),
    path("urgent/", views_ops.urgent_page, name="ops-urgent"),
    path("reservations/", views_reservations.reservations_page, name="ops-reservations"),
    path("reservations/<int:ar_id>/delete", views_reservations.reservation_delete_view,
         name="ops-reservation-delete"),
    path("urgent/agents", views_ops.urgent_agents_fragment, name="ops-urgent-agents"),
    path("campaigns/<int:campaign_id>/", views_ops.campaign_ops_page, name="ops-campaign"),
    path("campaigns/<int:campaign_id>/control", views_ops.campaign_control_view, name="ops-campaign-control"),
    path("campaigns/<int:campaign_id>/controls", views_ops.campaign_controls_fragment, name="ops-campaign-controls"),
    path("campaigns/<int:campaign_id>/network-policy", views_netpolicy.campaign_network_policy_view,
         name="ops-campaign-network-policy"),
    path("triage/", views_ops.triage_page, name="ops-triage"),
    path("triage/action", views_ops.triage_action_view, name="ops-triage-action"),
    path("triage/group", views_ops.triage_group_view, name="ops-triage-group"),
    path("audit/", views_ops.audit_page, name="ops-audit"),
    path("audit.csv", views_ops.audit_csv, name="ops-audit-csv"),
    path("agents/", views_ops.agent_definitions_page, name="ops-agents"),
]
