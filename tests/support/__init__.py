"""Helpers the tests share (plain functions, classes and constants, no fixtures): fixtures live in
the conftest.py files, these modules are imported by them and by test modules."""
