"""The lowest layer of dashboards: who sees what, roles, audit, errors, encoders, holds, ranges, bulk SQL,
clusters and their adapter, after-commit events, stages, health. Imports nothing above it.
"""
