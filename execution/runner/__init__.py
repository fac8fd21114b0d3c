"""The runner: what Grid Engine starts for each agent task (``python -m execution.runner``).

Its manual (environment, limits, the runner spec, the sandbox, the record,
stages, exit statuses, signals) is docs/runner.md; the entry point is
``__main__.py``, the run itself ``main.py``.
"""
