"""URL map: the dashboards app (pages, API, metrics), the ops pages (bills, launching, triage),
login/logout and the Django admin."""
from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

urlpatterns = [
    path("login/", auth_views.LoginView.as_view(template_name="dashboards/login.html"), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("ops/", include("dashboards.web.urls_ops")),
    path("", include("dashboards.web.urls")),
]
