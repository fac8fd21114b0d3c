"""Scheduler adapters: what tco asks of a Grid Engine cluster and how.

No Django here: the adapters run commands, parse their output and submit
through DRMAA; ``dashboards`` stores what they return.
"""
