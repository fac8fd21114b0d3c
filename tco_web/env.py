"""Settings from the environment, strictly parsed (healthchecks' envbool/envsecret style).

Each reader returns the variable's value, or ``default`` when it is unset or empty,
and raises ``django.core.exceptions.ImproperlyConfigured`` (naming the variable
and what it should be) for a value it cannot parse. ``env_str`` also reads
``NAME_FILE`` (a secret kept in a file). Used by tco_web/settings.py and
tco_web/ldap_settings.py.
"""
from __future__ import annotations

import os
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured


def env_str(name: str, default: str | None = None) -> str | None:
    """The variable ``name``, or the contents of the file named by ``name_FILE``."""
    file_path = os.environ.get(f"{name}_FILE")
    if file_path:
        try:
            return Path(file_path).read_text().strip()
        except OSError as exc:
            raise ImproperlyConfigured(f"{name}_FILE={file_path!r} cannot be read: {exc}") from exc
    return os.environ.get(name, default)


def env_bool(name: str, default: bool) -> bool:
    """``1/true/yes/on`` or ``0/false/no/off`` (any case); anything else is an error."""
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    value = raw.strip().lower()
    if value in {"1", "true", "yes", "on"}:
        return True
    if value in {"0", "false", "no", "off"}:
        return False
    raise ImproperlyConfigured(f"{name}={raw!r} is not a boolean (use true or false)")


def _env_number(name: str, default, convert, what: str):
    """``convert(value)`` of the variable ``name`` (``default`` when unset or empty); ImproperlyConfigured
    ("... is not <what>") when ``convert`` raises ValueError."""
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return convert(raw)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name}={raw!r} is not {what}") from exc


def env_float(name: str, default: float) -> float:
    return _env_number(name, default, float, "a number")


def env_int(name: str, default: int) -> int:
    return _env_number(name, default, int, "an integer")


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None:
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


def env_number_in(name: str, default: float, *, low: float, high: float, integer: bool = False) -> float:
    """``env_float`` (``env_int`` with ``integer``) that must also lie in ``[low, high]``; out of
    range is an error naming the range (a threshold of 0 or -1 is a typo, never a silent "off")."""
    value = env_int(name, int(default)) if integer else env_float(name, default)
    if not low <= value <= high:
        raise ImproperlyConfigured(f"{name}={value!r} is out of range: use {low:g} to {high:g}")
    return value


def env_choice(name: str, default: str, choices: tuple[str, ...]) -> str:
    """The variable ``name`` (``default`` when unset or empty), one of ``choices``; anything else is an error."""
    value = os.environ.get(name) or default
    if value not in choices:
        raise ImproperlyConfigured(f"{name}={value!r} is not one of {', '.join(choices)}")
    return value
