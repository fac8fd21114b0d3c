"""``{% landing %}``: the top of the landing page (stat tiles, then the user's campaigns), from
``dashboards.web.landing``. A tag, so the queue page's view and its live snapshot stay as they are."""
from __future__ import annotations

from urllib.parse import urlencode

from django import template
from django.conf import settings

register = template.Library()

#: The URL parameters of the campaign table (the queue page's own ``page`` is left alone).
PARAMS = ("scope", "q", "status", "sort", "dir", "cpage")


@register.inclusion_tag("dashboards/landing.html", takes_context=True)
def landing(context) -> dict:
    """Tiles and campaigns for the request's user; the table's scope, filter, sort and page from the URL."""
    from dashboards.web import landing as reads
    from dashboards.core.states import UNFINISHED_CAMPAIGN
    from dashboards.models import CampaignStatus

    request = context["request"]
    user = request.user
    chosen = {k: request.GET.get(k, "")[:100] for k in PARAMS}
    try:
        page = int(chosen["cpage"] or 1)
    except ValueError:
        page = 1
    table = reads.my_campaigns(user, scope=chosen["scope"], q=chosen["q"], status=chosen["status"],
                               sort=chosen["sort"] or "launched", descending=chosen["dir"] != "asc", page=page)

    def link(**changes) -> str:
        values = {**chosen, "scope": table["scope"], **changes}
        return "?" + urlencode({k: v for k, v in values.items() if v}) + "#my-campaigns"

    columns = []
    for key, (_field, label) in reads.CAMPAIGN_SORTS.items():
        on = table["sort"] == key
        # A first click sorts the way people look: newest, biggest and costliest first; names A-Z.
        first_desc = key not in ("name", "team", "status")
        descending = (not table["descending"]) if on else first_desc
        columns.append({"key": key, "label": label, "href": link(sort=key, dir="desc" if descending else "asc",
                                                                 cpage=""),
                        "aria": ("descending" if table["descending"] else "ascending") if on else "none"})
    statuses = [("unfinished", "unfinished")] + [(v, v) for v, _ in CampaignStatus.choices]
    # The audience's tiles from the queue page's summary (its live snapshot: no aggregate over the tasks per
    # GET); a context without one (the landing fragment) reads the live snapshot itself.
    summary = context.get("summary")
    audience = summary.get("tiles") if isinstance(summary, dict) else _snapshot_tiles(user)
    return {"tiles": reads.landing_tiles(user, seat_resource=settings.TCO_SEAT_RESOURCE, audience=audience),
            "table": table,
            "columns": {c["key"]: c for c in columns}, "statuses": statuses, "unfinished": UNFINISHED_CAMPAIGN,
            "scope_links": [(s, {"mine": "mine", "teams": "my teams", "all": "all"}[s], link(scope=s, cpage=""))
                            for s in table["scopes"]],
            "prev": link(cpage=table["page"].previous_page_number()) if table["page"].has_previous() else "",
            "next": link(cpage=table["page"].next_page_number()) if table["page"].has_next() else "",
            "chosen": chosen}


def _snapshot_tiles(user) -> list | None:
    """The tiles in the latest queue snapshot of ``user``'s audience (page 1), or None (none stored: the
    caller reads the database)."""
    from dashboards.core.scope import scope_of
    from dashboards.live import snapshots

    live = snapshots.current(snapshots.queue_view(scope_of(user), 1))
    return live["data"].get("tiles") if live is not None else None
