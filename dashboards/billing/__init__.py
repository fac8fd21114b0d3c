"""Money and time per team: billing periods, bills, budgets and alerts, token prices and cost forecasts.
"""
