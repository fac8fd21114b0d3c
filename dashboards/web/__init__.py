"""HTTP glue: page views (one module per page), the REST API and its token auth, forms, URLs, /metrics.
"""
