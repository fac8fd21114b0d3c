"""The demo campaign's parts: the research demo agents' sandbox policy, and what ``make demo`` already
launched (a second run launches no duplicate of a campaign still live).

With a model, the demo agents ask it once each through the metering proxy (demo/demo_agent.py), as
the review agents do: research's launcher and lead read real metered tokens and cost, not $0.00.
"""
from __future__ import annotations

import sys
from pathlib import Path

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser

from dashboards.management.commands.tco_bootstrap import demo_policy
from dashboards.models import CAMPAIGN_LIVE, Campaign, CampaignStatus, ModelEndpoint

#: A campaign launched and not yet over: waiting for the submit worker, or live on the cluster.
NOT_OVER = (CampaignStatus.SUBMITTING, *CAMPAIGN_LIVE)


def demo_agent_policy(*, endpoint: ModelEndpoint) -> str:
    """The demo agents' policy when they call a model (OpenShell schema, within the demo teams'
    ceiling): the runner's default policy's paths (system directories, tco's demo code, the venv the
    agent runs with) read-only, the work directory and a private /tmp writable, and one network rule:
    POST /v1/messages on the registered model ``endpoint``, its credential bound by the proxy (the
    agent never sees it)."""
    read_only = ["/usr", "/lib", "/lib64", "/bin", "/etc", str(Path(settings.BASE_DIR) / "demo")]
    if sys.prefix != sys.base_prefix:  # the venv the demo agent's command names (tco_bootstrap)
        read_only.append(sys.prefix)
    return demo_policy(read_only=read_only, host=endpoint.host, port=endpoint.port, provider=endpoint.provider)


def live_campaign(*, user: AbstractBaseUser, name: str) -> Campaign | None:
    """``user``'s newest campaign named ``name`` that is not over (submitting, submitted, running,
    paused or waiting), or None: what ``make demo`` asks before it launches one again."""
    return (Campaign.objects.filter(launched_by=user, name=name, status__in=NOT_OVER)
            .order_by("-pk").first())
