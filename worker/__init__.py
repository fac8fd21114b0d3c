"""tco's workers: Celery tasks, ingestion, scheduler adapters and the runner.

The runner (``python -m worker.runner``) and the demo agent import nothing
from Django: the scheduler starts them on exec hosts.
"""
