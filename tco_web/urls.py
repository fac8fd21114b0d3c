"""URL map: the dashboards app (pages, API, metrics), the ops pages (bills, launching, triage),
the assistant's "why is this pending?" page, login/logout and the Django admin."""
from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from assistant import pages as assistant_pages

urlpatterns = [
    path("login/", auth_views.LoginView.as_view(template_name="dashboards/login.html"), name="login"),
    # The assistant's answer as a page (and a fragment the task page and triage rows load in place).
    path("tasks/<int:task_id>/why-pending/", assistant_pages.why_pending_page, name="why-pending"),
    path("why-pending/", assistant_pages.why_pending_page, name="why-pending-for"),  # ?task=1128.17
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("ops/", include("dashboards.web.urls_ops")),
    path("", include("dashboards.web.urls")),
]
