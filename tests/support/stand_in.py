"""The demo's scripted stand-in model (demo/demo_model.py) as the cluster tests start it."""
from __future__ import annotations

#: The stand-in model's API key in the sweep-and-review and replay tests.
KEY = "sk-tco-sweep-review-test-4b1d"
