"""What one metering proxy enforces and meters: :class:`ProxySpec`, passed whole.

Without aiohttp (execution/metering/endpoints.py says why that matters to the
runner); :class:`~execution.metering.proxy.MeteringProxy` and
:func:`~execution.metering.proxy_thread.start_proxy` take it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping, Sequence

from execution.metering.caps import Caps
from execution.metering.credentials import CredentialResolver
from execution.metering.endpoints import Endpoint, Limits, RegisteredEndpoint

if TYPE_CHECKING:
    from execution.metering.prices import PriceTable

__all__ = ["ProxySpec"]


@dataclass(frozen=True)
class ProxySpec:
    """The proxy's rules, credentials, caps, prices and limits.

    ``endpoints``: the :class:`~execution.metering.endpoints.Endpoint` list requests are routed
    by (:func:`~execution.metering.endpoints.endpoints_from_policy` makes it from a policy);
    ``credentials``: a :class:`~execution.metering.credentials.CredentialResolver` or its
    ``sources`` mapping; ``caps``: :class:`~execution.metering.caps.Caps` (None: none);
    ``prices``: :class:`~execution.metering.prices.PriceTable` for costs (None: costs are not
    computed and usage is flagged ``unpriced_model``); ``registered``: the only destinations
    that get a credential; ``limits``: :class:`~execution.metering.endpoints.Limits` (None: the
    defaults); ``policy_version``: the network policy version of ``endpoints`` (0: the launch
    policy); ``max_request_bytes``: largest request body (None: ``limits.max_body_bytes``);
    ``connect_timeout_s``/``read_timeout_s``: upstream timeouts, seconds.

    Raises ValueError if a cost cap is set without prices or a campaign cap without a
    counter, or (from :class:`CredentialResolver`) for a malformed credential source.
    """

    endpoints: Sequence[Endpoint]
    credentials: CredentialResolver | Mapping[str, str]
    caps: Caps | None = None
    prices: PriceTable | None = None
    registered: Sequence[RegisteredEndpoint] = ()
    limits: Limits | None = None
    policy_version: int = 0
    max_request_bytes: int | None = None
    connect_timeout_s: float = 30.0
    read_timeout_s: float = 600.0

    def __post_init__(self) -> None:
        set_ = object.__setattr__  # a frozen dataclass normalises its own fields here only
        set_(self, "endpoints", tuple(self.endpoints))
        set_(self, "registered", tuple(self.registered))
        if not isinstance(self.credentials, CredentialResolver):
            set_(self, "credentials", CredentialResolver(self.credentials))
        caps = self.caps or Caps()
        set_(self, "caps", caps)
        set_(self, "limits", self.limits or Limits())
        if caps.has_cost_cap and self.prices is None:
            raise ValueError("a cost cap needs a price table")
        if (caps.campaign_tokens is not None or caps.campaign_cost_usd is not None) \
                and caps.campaign_counter is None:
            raise ValueError("a campaign cap needs a campaign counter")

    @property
    def body_limit(self) -> int:
        """The largest request body accepted (bytes)."""
        return self.max_request_bytes or self.limits.max_body_bytes
