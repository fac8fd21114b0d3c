"""Acting on jobs: campaign and triage control actions (executed by the submit worker), the triage
reads, a running campaign's network policy.
"""
