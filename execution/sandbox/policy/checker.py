"""How policy validation collects problems: each names its field, all are reported at once.

Standard library only.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["Checker", "kind"]


class Checker:
    """Collects every problem of a policy, each prefixed with its field (``where``)."""
    def __init__(self) -> None:
        self.problems: list[str] = []

    def add(self, where: str, message: str) -> None:
        """Note ``message`` for the field ``where``."""
        self.problems.append(f"{where}: {message}")

    def mapping(self, value: Any, where: str, allowed: tuple[str, ...]) -> Mapping[str, Any] | None:
        """``value`` if it is a mapping whose keys are all in ``allowed`` (an unknown key is noted with a
        "did you mean" hint); None (noted) if it is not a mapping."""
        if not isinstance(value, Mapping):
            self.add(where, f"expected a mapping, got {kind(value)}")
            return None
        for key in value:
            if key not in allowed:
                import difflib

                hint = difflib.get_close_matches(str(key), allowed, n=1)
                self.add(f"{where}.{key}" if where else str(key),
                         "unknown field" + (f" (did you mean {hint[0]!r}?)" if hint else
                                            f" (known: {', '.join(allowed)})"))
        return value

    def boolean(self, value: Any, where: str) -> bool | None:
        """``value`` if it is true or false, else None (noted)."""
        if not isinstance(value, bool):
            self.add(where, f"expected true or false, got {kind(value)}")
            return None
        return value

    def text(self, value: Any, where: str, *, choices: tuple[str, ...] | None = None) -> str | None:
        """``value`` if it is text (and one of ``choices``, when given), else None (noted)."""
        if not isinstance(value, str):
            self.add(where, f"expected text, got {kind(value)}")
            return None
        if choices is not None and value not in choices:
            self.add(where, f"{value!r} is not one of {', '.join(choices)}")
            return None
        return value

    def integer(self, value: Any, where: str, low: int, high: int) -> int | None:
        """``value`` if it is an integer in ``low``..``high``, else None (noted)."""
        if isinstance(value, bool) or not isinstance(value, int):
            self.add(where, f"expected an integer, got {kind(value)}")
            return None
        if not low <= value <= high:
            self.add(where, f"{value} is outside {low}..{high}")
            return None
        return value

    def text_list(self, value: Any, where: str) -> list[str]:
        """The text items of the list ``value`` (others noted); [] if it is not a list (noted)."""
        if not isinstance(value, list):
            self.add(where, f"expected a list, got {kind(value)}")
            return []
        out = []
        for i, item in enumerate(value):
            if self.text(item, f"{where}[{i}]") is not None:
                out.append(item)
        return out


def kind(value: Any) -> str:
    """How a problem names a value's type: ``a mapping``, ``text ('...')``, ``an integer (3)``, ..."""
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if isinstance(value, int):
        return f"an integer ({value})"
    if isinstance(value, float):
        return f"a number ({value})"
    if isinstance(value, str):
        return f"text ({value[:40]!r})"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, Mapping):
        return "a mapping"
    return type(value).__name__
