"""Token metering: usage extraction, prices and the metering egress proxy.

- :mod:`worker.metering.usage`: server-sent events decoder and usage readers
  for Anthropic Messages and OpenAI chat completions / responses (JSON and
  SSE), the disjoint buckets and flags of DESIGN.md ("Token metering and
  cost"); standard library only.
- :mod:`worker.metering.prices`: the price table (Decimal, effective dates,
  aliases, documented name normalisation); standard library only (Django
  only when built from the database).
- :mod:`worker.metering.proxy`: the aiohttp proxy the runner starts on the
  sandbox's Unix socket (:func:`worker.metering.proxy.start_proxy`).
- :mod:`worker.metering.inspect_usage`: ``manage.py inspect usage``.

Kept import-light: importing this package does not import aiohttp.
"""
