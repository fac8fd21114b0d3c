"""The project's URLs plus the ops pages, until ``tco_web/urls.py`` includes ``dashboards.urls_ops``."""
from django.urls import include, path

from tco_web.urls import urlpatterns as _project

urlpatterns = list(_project)
if not any(getattr(p, "urlconf_name", None) == "dashboards.urls_ops" or
           getattr(getattr(p, "urlconf_module", None), "__name__", "") == "dashboards.urls_ops" for p in urlpatterns):
    urlpatterns.insert(0, path("ops/", include("dashboards.urls_ops")))
