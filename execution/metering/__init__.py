"""Token metering: usage extraction, prices and the metering egress proxy.

- :mod:`execution.metering.usage`: server-sent events decoder and usage readers
  for Anthropic Messages and OpenAI chat completions / responses (JSON and
  SSE), the disjoint buckets and flags of DESIGN.md ("Token metering and
  cost"); standard library only.
- :mod:`execution.metering.prices`: the price table (Decimal, effective dates,
  aliases, documented name normalisation); standard library only (Django
  only when built from the database).
- :mod:`execution.metering.proxy`: the aiohttp proxy the runner starts on the
  sandbox's Unix socket (:func:`execution.metering.proxy.start_proxy`).
- :mod:`execution.metering.inspect_usage`: ``manage.py inspect usage``.

Kept import-light: importing this package does not import aiohttp.
"""
