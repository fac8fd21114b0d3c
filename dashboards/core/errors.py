"""The errors a user's request is refused with; ``str(err)`` is the message shown to that user.

Every refusal is a :class:`Refused`: a page, a command or the API catches that one class
(``except Refused``) and shows its text; nothing has been submitted, changed or
charged when one is raised. The subclasses say which check refused, and keep the
built-in base they always had (code may still catch ``ValueError`` or
``PermissionError``).
"""
from __future__ import annotations


class Refused(Exception):
    """A user's request refused; ``str(err)`` is shown to the user."""


class ActionRefused(Refused, PermissionError):
    """The user may not do this (role, team, target); audited by ``core.audit.refused``."""


class LaunchError(Refused, ValueError):
    """A launch request that cannot be submitted (limits, policy, inputs, scheduler)."""


class BillError(Refused, ValueError):
    """A bill or budget request out of bounds (period, team, thresholds)."""
