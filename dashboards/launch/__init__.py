"""Launching campaigns: the launch service and its checks, inputs, the forecast, the spool, the DRMAA
submission (claims, adoption), predecessors, reservations, the agent registry, the launcher's notices.
"""
