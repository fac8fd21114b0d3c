"""Loading a sandbox policy: strict YAML (no duplicate or merge keys), a file, or a mapping.

Standard library and PyYAML (imported when a policy is parsed).
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from execution.sandbox.policy.model import Policy, PolicyError
from execution.sandbox.policy.schema import MAX_POLICY_BYTES
from execution.sandbox.policy.validate import validate_policy

__all__ = ["parse_yaml", "load_policy"]


def _strict_loader():
    """A PyYAML safe loader that rejects duplicate keys, merge keys and non-text keys."""
    import yaml

    base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

    class StrictLoader(base):  # type: ignore[misc,valid-type]
        pass

    def construct_mapping(loader, node, deep=False):
        seen: dict[str, int] = {}
        mapping: dict[str, Any] = {}
        for key_node, value_node in node.value:
            line = key_node.start_mark.line + 1
            if key_node.tag == "tag:yaml.org,2002:merge":
                raise PolicyError([f"line {line}: YAML merge keys ('<<') are not allowed"])
            key = loader.construct_object(key_node, deep=True)
            if not isinstance(key, str):
                raise PolicyError([f"line {line}: key {key!r} must be text"])
            if key in seen:
                raise PolicyError([f"line {line}: duplicate key {key!r} (first at line {seen[key]})"])
            seen[key] = line
            mapping[key] = loader.construct_object(value_node, deep=True)
        return mapping

    StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, construct_mapping)
    return yaml, StrictLoader


def parse_yaml(text: str) -> Any:
    """The YAML document in ``text``; raises PolicyError (duplicate keys, syntax, size)."""
    if len(text.encode("utf-8")) > MAX_POLICY_BYTES:
        raise PolicyError([f"policy is larger than {MAX_POLICY_BYTES} bytes"])
    yaml, loader = _strict_loader()
    try:
        return yaml.load(text, Loader=loader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise PolicyError([f"{where}not valid YAML: {problem}"]) from None


def load_policy(source: str | os.PathLike | Mapping[str, Any]) -> Policy:
    """Load and validate a policy: YAML text, a path to a YAML file (an absolute path on
    one line), or an already parsed mapping. Raises PolicyError."""
    if isinstance(source, Mapping):
        return validate_policy(source)
    if isinstance(source, os.PathLike) or (isinstance(source, str) and "\n" not in source
                                           and source.startswith("/")):
        path = os.fspath(source)
        try:
            with open(path, "rb") as fh:
                raw = fh.read(MAX_POLICY_BYTES + 1)
        except OSError as exc:
            raise PolicyError([f"cannot read policy file {path}: {exc.strerror}"]) from None
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise PolicyError([f"policy file {path} is not UTF-8"]) from None
    else:
        text = source
    return validate_policy(parse_yaml(text), text=text)
