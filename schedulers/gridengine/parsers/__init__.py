"""Parsers of Grid Engine output, one module per command or file.

Each takes the raw bytes a command printed (or a file holds) and returns plain
records or dicts; nothing here runs a command or knows about Django.
"""
