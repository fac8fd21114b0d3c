"""URLs of the pages, the REST API (``/api/``) and ``/metrics``."""

from django.urls import path
from drf_spectacular.views import SpectacularAPIView

from dashboards.web import api, metrics
from dashboards.web.views import account, campaign, landing, queue, task

urlpatterns = [
    path("", queue.queue_page, name="queue"),
    path("queue.json", queue.queue_json, name="queue-json"),
    path("landing", landing.landing_fragment, name="landing-fragment"),
    path("campaigns/<int:campaign_id>/", campaign.campaign_page, name="campaign"),
    path("tasks/<int:task_id>/", task.task_page, name="task"),
    path("tasks/<int:task_id>/outputs/<str:name>", task.task_output, name="task-output"),
    path("tasks/<int:task_id>/logs.json", task.task_logs, name="task-logs"),
    path("account/token/", account.token_page, name="token"),
    path("metrics", metrics.metrics_view, name="metrics"),
    path("healthz", account.healthz, name="healthz"),
    # REST API (dashboards/api.py); schema at /api/schema/.
    path("api/me/", api.MeView.as_view(), name="api-me"),
    path("api/token/", api.ObtainTokenView.as_view(), name="api-token"),
    path("api/queue/", api.QueueView.as_view(), name="api-queue"),
    path("api/queue/depth/", api.QueueDepthView.as_view(), name="api-queue-depth"),
    path("api/campaigns/", api.CampaignListView.as_view(), name="api-campaigns"),
    path("api/campaigns/<int:campaign_id>/", api.CampaignDetailView.as_view(), name="api-campaign"),
    path("api/campaigns/<int:campaign_id>/tasks/", api.CampaignTasksView.as_view(), name="api-campaign-tasks"),
    path("api/tasks/<int:task_id>/", api.TaskDetailView.as_view(), name="api-task"),
    path("api/usage/", api.UsageView.as_view(), name="api-usage"),
    path("api/focus/", api.FocusView.as_view(), name="api-focus"),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
]
