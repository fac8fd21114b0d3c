"""WebSocket URL routes."""

from django.urls import path

from dashboards.live import consumers

websocket_urlpatterns = [
    path("ws/queue/", consumers.QueueConsumer.as_asgi()),
    path("ws/campaigns/<int:campaign_id>/", consumers.CampaignConsumer.as_asgi()),
    path("ws/tasks/<int:task_id>/", consumers.TaskConsumer.as_asgi()),
]
