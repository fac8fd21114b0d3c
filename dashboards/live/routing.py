"""WebSocket URL routes: the three live views, and a last route that closes any other path.

Channels' URLRouter raises ("No route found") on a path it does not know, which the server
answers with HTTP 500 and a traceback in the log for every try: a client could fill the log.
"""

from channels.generic.websocket import WebsocketConsumer
from django.urls import path, re_path

from dashboards.live import consumers


class NoSuchSocket(WebsocketConsumer):
    """Any other WebSocket path: refused at the handshake (HTTP 403, as a socket the origin check
    refuses), one log line, no traceback."""

    def connect(self) -> None:
        self.close()


websocket_urlpatterns = [
    path("ws/queue/", consumers.QueueConsumer.as_asgi()),
    path("ws/campaigns/<int:campaign_id>/", consumers.CampaignConsumer.as_asgi()),
    path("ws/tasks/<int:task_id>/", consumers.TaskConsumer.as_asgi()),
    re_path(r"^", NoSuchSocket.as_asgi()),
]
