"""Token metering: usage extraction, prices and the metering egress proxy.

- :mod:`execution.metering.usage`: the disjoint buckets and flags of DESIGN.md
  ("Token metering and cost"), which API a body is; with
  :mod:`~execution.metering.sse` (server-sent events decoder),
  :mod:`~execution.metering.usage_readers` (usage of JSON and SSE answers of
  Anthropic Messages and OpenAI chat completions / responses) and
  :mod:`~execution.metering.usage_file` (flexible accounting's usage file);
  standard library only.
- :mod:`execution.metering.prices`: the price table (Decimal, effective dates,
  aliases, documented name normalisation); standard library only (Django
  only when built from the database).
- :mod:`execution.metering.endpoints`: which endpoints a sandbox may reach,
  the registered model endpoints, the proxy's limits; without aiohttp, so the
  runner checks them before the sandbox starts.
- :mod:`execution.metering.proxy`: the aiohttp proxy the runner starts on the
  sandbox's Unix socket (:func:`execution.metering.proxy_thread.start_proxy`
  with a :class:`~execution.metering.proxy_spec.ProxySpec`); its parts are
  ``routing``, ``rewriting``, ``caps``, ``credentials`` and ``ledger``.
- :mod:`execution.metering.inspect_usage`: ``manage.py inspect usage``.

Kept import-light: importing this package does not import aiohttp.
"""
