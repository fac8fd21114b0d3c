"""ASGI entry point: HTTP through Django, WebSockets through Channels.

A web process runs two threads that want the GIL: the event loop (handshakes, the live fan-out) and the
one database thread (page GETs, each socket's check). Each query the database thread runs releases the
GIL, and taking it back waits up to the interpreter's switch interval while the loop is busy (5 ms by
default): a socket's check of a few queries then took ~16 ms of wall time for ~1.5 ms of CPU, and a
connect storm's checks queued behind one another (issue 22, py-spy of 1,000 sockets opening at once:
the database thread saturated, the process not). ``TCO_WEB_SWITCH_INTERVAL_S`` (default 0.0005 s,
``sys.setswitchinterval``) shortens that wait.

At start a thread warms the broker's producer (``dashboards.core.enqueue.warm``): the first launch a
web process served paid 0.3 s for kombu's transport import and the first Redis connection.
``TCO_WEB_WARM_BROKER=0`` leaves it out (the tests, which import this module without a server).
"""
import os
import sys
import threading

sys.setswitchinterval(float(os.environ.get("TCO_WEB_SWITCH_INTERVAL_S") or 0.0005))

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tco_web.settings")
django_asgi_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402  (needs Django set up)

from dashboards.core import enqueue  # noqa: E402

if os.environ.get("TCO_WEB_WARM_BROKER", "1") != "0":
    threading.Thread(target=enqueue.warm, name="tco-warm-broker", daemon=True).start()

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
