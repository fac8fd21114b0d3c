"""Anomaly alerts (issue 25): tasks slower than their history, bursts of failures, budgets burning early.

``anomalies`` finds and records them (once each), ``delivery`` mails and posts them
(Alertmanager-compatible JSON), ``notices`` shows them to the team's leads and the admins.
"""
