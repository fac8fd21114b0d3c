"""ASGI entry point: HTTP through Django, WebSockets through Channels.

A web process runs two threads that want the GIL: the event loop (handshakes, the live fan-out) and the
one database thread (page GETs, each socket's check). Each query the database thread runs releases the
GIL, and taking it back waits up to the interpreter's switch interval while the loop is busy (5 ms by
default): a socket's check of a few queries then took ~16 ms of wall time for ~1.5 ms of CPU, and a
connect storm's checks queued behind one another (issue 22, py-spy of 1,000 sockets opening at once:
the database thread saturated, the process not). ``TCO_WEB_SWITCH_INTERVAL_S`` (default 0.0005 s,
``sys.setswitchinterval``) shortens that wait.

Before it serves, a web process loads what its first requests would otherwise load while a browser
waits (:func:`load_for_first_requests`): every page's views and templates, the auth backends, the
session engine, the async Redis client, and freezes the heap it has then (``gc.freeze``) so the
collector no longer walks those objects. After a web process restart the dashboards' 1,000 sockets
reconnect at once: that storm paid these imports and full collections on its first sockets (issue 22,
the connect storm). A thread also warms the broker's producer (``dashboards.core.enqueue.warm``): the
first launch a web process served paid 0.3 s for kombu's transport import and the first Redis
connection. ``TCO_WEB_WARM=0`` leaves both out (the tests, which import this module without a server).
"""
import gc
import logging
import os
import sys
import threading

sys.setswitchinterval(float(os.environ.get("TCO_WEB_SWITCH_INTERVAL_S") or 0.0005))

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tco_web.settings")
django_asgi_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402  (needs Django set up)

from dashboards.core import enqueue  # noqa: E402
from dashboards.live.consumers import DeferredAuthMiddlewareStack  # noqa: E402
from dashboards.live.routing import websocket_urlpatterns  # noqa: E402
from tco_web.security import SameOriginWebsocketValidator  # noqa: E402

log = logging.getLogger(__name__)


def load_for_first_requests() -> int:
    """Import and compile what the first page GETs and WebSocket handshakes need, then ``gc.freeze()``.

    Loads the URL conf with every view module (and its reverse map), the authentication backends
    (``settings.AUTHENTICATION_BACKENDS``), the session engine, django-axes' helpers and models (the
    login check), redis-py's asyncio client (the hub's subscription) and every template of the
    ``dashboards`` app through the configured loaders (cached). Returns the number of templates
    loaded. A template that does not compile is logged, not raised: the page that uses it shows the
    error as it would have without this step."""
    from importlib import import_module
    from pathlib import Path

    import redis.asyncio.client  # noqa: F401
    from axes import helpers, models  # noqa: F401
    from django.conf import settings
    from django.contrib.auth import get_backends
    from django.template import TemplateSyntaxError
    from django.template.loader import get_template
    from django.urls import get_resolver

    get_backends()
    import_module(settings.SESSION_ENGINE)
    get_resolver().reverse_dict  # noqa: B018  (imports every view, builds the reverse map)
    root = Path(__file__).resolve().parent.parent / "dashboards" / "templates"
    loaded = 0
    for path in sorted(root.rglob("*.html")):
        try:
            get_template(path.relative_to(root).as_posix())
            loaded += 1
        except TemplateSyntaxError:
            log.exception("template %s does not compile", path)
    gc.collect()
    gc.freeze()
    return loaded


if os.environ.get("TCO_WEB_WARM", "1") != "0":
    load_for_first_requests()
    threading.Thread(target=enqueue.warm, name="tco-warm-broker", daemon=True).start()

application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        # The page's own origin only, port included (tco_web.security.websocket_origin_allowed).
        # Session and user as Channels' AuthMiddlewareStack reads them, resolved with the socket's own
        # check in one database call (dashboards.live.consumers.DeferredAuthMiddleware).
        "websocket": SameOriginWebsocketValidator(DeferredAuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)
