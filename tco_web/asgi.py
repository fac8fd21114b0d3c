"""ASGI entry point: HTTP through Django, WebSockets through Channels."""
import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tco_web.settings")
django_asgi_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402  (needs Django set up)

from dashboards.live.consumers import DeferredAuthMiddlewareStack  # noqa: E402
from dashboards.live.routing import websocket_urlpatterns  # noqa: E402
from tco_web.security import SameOriginWebsocketValidator  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        # The page's own origin only, port included (tco_web.security.websocket_origin_allowed).
        # Session and user as Channels' AuthMiddlewareStack reads them, resolved with the socket's own
        # check in one database call (dashboards.live.consumers.DeferredAuthMiddleware).
        "websocket": SameOriginWebsocketValidator(DeferredAuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)
