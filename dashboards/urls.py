from django.urls import path

from . import views

urlpatterns = [
    path("", views.queue_page, name="queue"),
    path("queue.json", views.queue_json, name="queue-json"),
    path("campaigns/<int:campaign_id>/", views.campaign_page, name="campaign"),
    path("healthz", views.healthz, name="healthz"),
]
