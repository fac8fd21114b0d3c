"""What runs on an execution host: the runner, its sandbox and its metering proxy.

Grid Engine starts ``python -m execution.runner`` once per agent task on
whichever execution host it picks. Nothing in this package imports Django,
Celery or ``dashboards``: an execution host needs only Python, the shared
spool and this package (the rule is checked by import-linter, see
``.importlinter``).
"""
