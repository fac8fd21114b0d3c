"""The launch page's preview: the cost forecast and budget verdict (``service.launch_preview``) and the
timing, headroom and history (``launch.forecast``) for the campaign a request would launch."""
from __future__ import annotations

from typing import Any

from dashboards.launch import service
from dashboards.launch.forecast import complete_preview
from dashboards.launch.request import LaunchRequest


def launch_preview(*, user, request: LaunchRequest) -> dict[str, Any]:
    """Everything the launch page shows before Launch, for the campaign ``request`` would launch:
    the cost forecast and the budget verdict (``service.launch_preview``: ``forecast``,
    ``expected_usd`` USD, ``verdict``), then :func:`complete_preview`'s figures, and ``refusal``: what
    Launch would refuse it with ("" when it would accept it; ``service.launch_refusal``, the launch's own
    checks, given the cost forecast computed here: one forecast, not two). Reads only; raises nothing a
    valid form can cause."""
    preview = service.launch_preview(user=user, team=request.team, agent_definition=request.agent_definition,
                                     count=len(request.inputs), model=request.model,
                                     cost_cap_usd=request.cost_cap_usd)
    refusal = service.launch_refusal(user=user, request=request, preview=preview)
    preview = complete_preview(user=user, request=request, preview=preview)
    preview["refusal"] = refusal
    return preview