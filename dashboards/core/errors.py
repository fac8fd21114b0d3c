"""The errors a user's request can be refused with (their message is for that user)."""
from __future__ import annotations



class BillError(ValueError):
    """A bill or budget request out of bounds; ``str(err)`` is shown to the user."""

class LaunchError(ValueError):
    """A launch request that cannot be submitted; ``str(err)`` is shown to the user."""
