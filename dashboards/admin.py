from django.contrib import admin

from dashboards.models import AccountingRecord, AgentDefinition, Campaign, Cluster, ControlRequest, ModelEndpoint, PolicyCeiling, QuarantinedLine, Task, Team


@admin.register(Cluster)
class ClusterAdmin(admin.ModelAdmin):
    list_display = ("name", "flavour", "sge_root", "sge_cell", "time_zone", "polled_at", "poll_error")


@admin.register(Team)
class TeamAdmin(admin.ModelAdmin):
    list_display = ("name", "project", "group")


@admin.register(AgentDefinition)
class AgentDefinitionAdmin(admin.ModelAdmin):
    list_display = ("name", "version", "input_kind", "default_model")


@admin.register(Campaign)
class CampaignAdmin(admin.ModelAdmin):
    list_display = ("id", "name", "team", "job_number", "task_count", "status", "submit_claimed_at", "launched_at")
    list_filter = ("status", "team")


@admin.register(Task)
class TaskAdmin(admin.ModelAdmin):
    list_display = ("job_number", "task_number", "campaign", "state", "state_code", "host", "exit_status")
    list_filter = ("state",)
    search_fields = ("=job_number",)


@admin.register(AccountingRecord)
class AccountingRecordAdmin(admin.ModelAdmin):
    list_display = ("job_number", "task_number", "project", "hostname", "wallclock_s", "failed", "exit_status")


@admin.register(QuarantinedLine)
class QuarantinedLineAdmin(admin.ModelAdmin):
    list_display = ("path", "offset", "reason", "seen_at")

@admin.register(ModelEndpoint)
class ModelEndpointAdmin(admin.ModelAdmin):
    """Model API endpoints the site registers: the only ones a runner gives a credential to."""

    list_display = ("name", "provider", "scheme", "host", "port", "credential_name", "active")
    list_filter = ("provider", "active")


@admin.register(PolicyCeiling)
class PolicyCeilingAdmin(admin.ModelAdmin):
    """The widest sandbox policy per team or agent definition (validated by the runner's validator)."""

    list_display = ("__str__", "team", "agent_definition", "note")


@admin.register(ControlRequest)
class ControlRequestAdmin(admin.ModelAdmin):
    list_display = ("id", "action", "job_number", "state", "attempts", "created_at", "finished_at")
    list_filter = ("state", "action")
    readonly_fields = [f.name for f in ControlRequest._meta.fields]


from . import pricing_admin  # noqa: E402,F401  (registers the price table)
