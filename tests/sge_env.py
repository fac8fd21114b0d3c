"""The Grid Engine cell the test run talks to, from its environment.

Tests that start ``qstat``/``qhost``/``qacct`` themselves (to check tco
against the scheduler's own output) build the child's environment with
:func:`sge_env`, so the suite runs against whichever cell the environment
names: ``SGE_ROOT``/``SGE_CELL`` (Django settings, defaulted like
``tco_web.settings``) and, for a cell on its own ports (scripts/dev-cluster
``--cell mh --qmaster-port 6544``), ``SGE_QMASTER_PORT``/``SGE_EXECD_PORT``.
"""
from __future__ import annotations

import os

PORT_VARIABLES = ("SGE_QMASTER_PORT", "SGE_EXECD_PORT")


def sge_env(sge_root: str, sge_cell: str, **extra: str) -> dict[str, str]:
    """``{"SGE_ROOT", "SGE_CELL", "PATH", the port variables set in os.environ, **extra}``."""
    env = {"SGE_ROOT": sge_root, "SGE_CELL": sge_cell, "PATH": "/usr/bin:/bin"}
    env.update({name: os.environ[name] for name in PORT_VARIABLES if os.environ.get(name)})
    env.update(extra)
    return env
