"""Launch inputs: one JSON object per task, from files in a directory, JSONL or a parameter list.

Each parser returns ``[{...}, ...]`` (task N gets item N-1) or raises
``LaunchError`` naming the line or file at fault. Nothing here recurses on
user input: JSON nested deeper than ``limits.INPUT_MAX_DEPTH`` is refused
with a message, never a stack overflow (issue 11, finding 8).
"""
from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

from django.conf import settings

from dashboards.core import limits
from dashboards.core.errors import LaunchError

log = logging.getLogger(__name__)


def inputs_root() -> Path:
    """Where "files in a directory" inputs must live (``TCO_INPUTS_ROOT``, default ``<state>/inputs``)."""
    return Path(getattr(settings, "TCO_INPUTS_ROOT", None) or Path(settings.STATE_DIR) / "inputs")


def json_depth(value: Any) -> int:
    """How deeply ``value`` nests lists and dicts (a scalar is 0, ``[]`` is 1); iterative."""
    deepest = 0
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (list, dict)):
            depth += 1
            deepest = max(deepest, depth)
            stack.extend((v, depth) for v in (item.values() if isinstance(item, dict) else item))
    return deepest


_NOT_JSON_RAISES = object()


def json_loads_bounded(text: str, *, what: str, not_json: Any = _NOT_JSON_RAISES) -> Any:
    """``json.loads(text)``, refusing nesting deeper than ``limits.INPUT_MAX_DEPTH``.

    Raises LaunchError (``what`` names the place: "JSONL line 3") for text
    that nests too deeply, and for text that is not JSON unless ``not_json``
    is given (then that is returned); never RecursionError.
    """
    try:
        value = json.loads(text)
    except RecursionError:
        raise LaunchError(f"{what} nests deeper than {limits.INPUT_MAX_DEPTH} levels") from None
    except ValueError as exc:
        if not_json is not _NOT_JSON_RAISES:
            return not_json
        raise LaunchError(f"{what} is not JSON: {exc}") from None
    if json_depth(value) > limits.INPUT_MAX_DEPTH:
        raise LaunchError(f"{what} nests deeper than {limits.INPUT_MAX_DEPTH} levels")
    return value


def team_inputs_folder(team) -> Path:
    """A team's folder of "files in a directory" inputs: ``<inputs root>/<team's project>`` (not resolved)."""
    return inputs_root() / team.project


def inputs_from_directory(relative: str, *, team, limit: int = limits.MAX_TASKS_PER_CAMPAIGN) -> list[dict[str, str]]:
    """One input ``{"file": absolute path}`` per regular file directly in ``<team's folder>/<relative>``.

    The team's folder is ``<inputs root>/<project>`` (:func:`team_inputs_folder`): a launcher of one
    team neither probes nor launches over another team's folders (issue 23, finding 6). The path
    must stay inside the team's folder (no ``..``, no absolute path, no symlink out of it, of the
    folder or of a file: such files are skipped); the team's folder itself may not be a link. Files
    are taken in name order; hidden files are skipped. Raises LaunchError with the reason, naming no
    server path and nothing of another team (the log has it).
    """
    relative = (relative or "").strip()
    if not relative or "\0" in relative or any(ord(c) < 0x20 for c in relative):
        raise LaunchError("input directory: give a directory under your team's folder of the inputs root")
    root = inputs_root().resolve()
    folder = root / team.project
    if folder.resolve() != folder:
        log.warning("input directory %r of team %s refused: its folder %s is a link to %s", relative, team.project,
                    folder, folder.resolve())
        raise LaunchError(f"input directory: team {team.name}'s folder of the inputs root is a link; "
                          "ask an admin to make it a plain folder")
    candidate = (folder / relative.lstrip("/")).resolve()
    # The messages name no server path (the resolved root may be tco's state directory); the log does.
    if candidate != folder and folder not in candidate.parents:
        log.warning("input directory %r of team %s refused: %s is outside the team's folder %s", relative,
                    team.project, candidate, folder)
        raise LaunchError(f"input directory {relative!r} is outside your team's folder of the inputs root")
    if not candidate.is_dir():
        log.warning("input directory %r refused: %s is not a directory", relative, candidate)
        raise LaunchError(f"input directory {relative!r} does not exist under your team's folder of the inputs root")
    files = []
    for entry in sorted(candidate.iterdir()):
        if entry.name.startswith(".") or not entry.is_file():
            continue
        if folder not in entry.resolve().parents:
            continue  # a symlink out of the team's folder is not an input
        files.append({"file": str(entry)})
        if len(files) > limit:
            raise LaunchError(f"input directory has more than {limit} files")
    if not files:
        raise LaunchError(f"input directory {relative!r} has no files")
    return files


def inputs_from_jsonl(text: str, *, limit: int = limits.MAX_TASKS_PER_CAMPAIGN) -> list[dict[str, Any]]:
    """One input per non-empty line, each a JSON object. Raises LaunchError naming the line."""
    if len(text.encode("utf-8", "surrogatepass")) > limits.INPUT_MAX_BYTES:
        raise LaunchError(f"JSONL input is larger than {limits.INPUT_MAX_BYTES // (1024 * 1024)} MB")
    items = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        value = json_loads_bounded(line, what=f"JSONL line {number}")
        if not isinstance(value, dict):
            raise LaunchError(f"JSONL line {number} is not a JSON object")
        items.append(value)
        if len(items) > limit:
            raise LaunchError(f"a campaign has at most {limit} tasks; the JSONL has more lines")
    if not items:
        raise LaunchError("the JSONL input has no lines")
    return items


_PARAM_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
_RANGE = re.compile(r"^(-?\d{1,12})\.\.(-?\d{1,12})$")
#: Keys (``key=value`` pairs) a parameter line may have: every task of a range copies them all.
PARAM_MAX_KEYS = 64


def _encoded_bytes(row: dict[str, Any]) -> int:
    """Bytes of ``row`` as the spool's inputs file holds it (``launch._record``: compact, sorted JSON)."""
    return len(json.dumps(row, separators=(",", ":"), sort_keys=True).encode("utf-8", "surrogatepass"))


def inputs_from_params(text: str, *, limit: int = limits.MAX_TASKS_PER_CAMPAIGN) -> list[dict[str, Any]]:
    """A parameter list: one task per line of ``key=value`` pairs separated by spaces.

    Values are JSON where they parse (``3``, ``true``, ``"a b"``), else text.
    A pair ``key=A..B`` (integers) makes its line stand for B-A+1 tasks with
    key = A..B, each with the line's other pairs as fixed values
    (``task=1..24 duration_s=15`` is 24 tasks of 15 s); a line has at most one
    range and at most :data:`PARAM_MAX_KEYS` pairs. Raises LaunchError naming the line; a range
    larger than ``limit`` is refused before anything is built, and so are lines whose expanded
    inputs (each line's encoded JSON size times the tasks it stands for, summed over the lines)
    exceed ``limits.INPUT_MAX_BYTES``, the limit of a raw input body: a short line with a range
    must not stand for more than a body could (attack review 5: ``task=1..75000`` with 200 keys).
    """
    if len(text.encode("utf-8", "surrogatepass")) > limits.INPUT_MAX_BYTES:
        raise LaunchError(f"the parameter list is larger than {limits.INPUT_MAX_BYTES // (1024 * 1024)} MB")
    items: list[dict[str, Any]] = []
    expanded = 0  # bytes of the inputs built so far, as the spool writes them
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line:
            continue
        pairs = line.split()
        if len(pairs) > PARAM_MAX_KEYS:
            raise LaunchError(f"parameter line {number} has {len(pairs)} key=value pairs; a line may have at most "
                              f"{PARAM_MAX_KEYS}")
        row: dict[str, Any] = {}
        ranged: tuple[str, int, int] | None = None
        for pair in pairs:
            key, eq, value = pair.partition("=")
            if not eq or not _PARAM_KEY.match(key):
                raise LaunchError(f"parameter line {number}: {pair!r} is not key=value (key: letters, digits, _)")
            if key in row:
                raise LaunchError(f"parameter line {number}: {key} given twice")
            match = _RANGE.match(value)
            if match:
                if ranged is not None:
                    raise LaunchError(f"parameter line {number}: one range per line ({ranged[0]} and {key} are "
                                      f"both ranges); write one line per value of the other")
                ranged = (key, int(match.group(1)), int(match.group(2)))
                row[key] = None  # filled per task below, in the line's key order
                continue
            row[key] = json_loads_bounded(value, what=f"parameter line {number}: {key}", not_json=value)
        if ranged is None:
            expanded += _encoded_bytes(row)
            _check_expanded(expanded, number)
            items.append(row)
        else:
            key, first, last = ranged
            if last < first:
                raise LaunchError(f"parameter line {number}: range {first}..{last} runs backwards")
            if len(items) + (last - first + 1) > limit:
                raise LaunchError(f"a campaign has at most {limit} tasks; line {number} asks for "
                                  f"{last - first + 1}")
            # The widest task of the line (the range's longest number) times its tasks, before any is built.
            widest = max(_encoded_bytes({**row, key: first}), _encoded_bytes({**row, key: last}))
            expanded += widest * (last - first + 1)
            _check_expanded(expanded, number, tasks=last - first + 1, each=widest)
            items.extend({**row, key: n} for n in range(first, last + 1))
        if len(items) > limit:
            raise LaunchError(f"a campaign has at most {limit} tasks")
    if not items:
        raise LaunchError("the parameter list is empty")
    return items


def _check_expanded(expanded: int, number: int, *, tasks: int = 1, each: int = 0) -> None:
    """Refuse a parameter list whose inputs, built, exceed ``limits.INPUT_MAX_BYTES``. Raises LaunchError."""
    if expanded <= limits.INPUT_MAX_BYTES:
        return
    what = f"its {tasks} tasks of {each} bytes each" if tasks > 1 else "its inputs"
    raise LaunchError(f"parameter line {number}: {what} bring the parameter list's expanded inputs to {expanded} "
                      f"bytes; the expanded inputs may be at most {limits.INPUT_MAX_BYTES // (1024 * 1024)} MB "
                      f"(the input size limit): use fewer or shorter keys, or fewer tasks")


# --------------------------------------------------------------------------- input types (issue 16, bug 12)
#
# The rule: every input of a campaign, whatever its kind (parameter list, JSONL line, file), is
# checked against the agent definition's input schema before anything is submitted, so a value
# the agent cannot read (``duration_s=abc``) is refused with the task and key named instead of
# failing every task at run time. Agents tco knows declare their keys below (the demo agent's are
# documented in demo/demo_agent.py); for every agent, a key named with a unit suffix of tco's
# convention (``_s`` seconds, ``_bytes``, ``tokens_of``, ``usd_text``) must be a number >= 0.

#: Type of an input value: ``int`` (integer, not bool), ``number`` (int or float, not bool), ``bool``, ``str``.
InputType = str
#: Agent definition name -> {key: (type, minimum or None, what it is)}. Keys not listed pass.
INPUT_SCHEMAS: dict[str, dict[str, tuple[InputType, float | None, str]]] = {
    "demo-agent": {
        "task": ("int", None, "the task's number"),
        "duration_s": ("number", 0, "seconds to think"),
        "fail": ("bool", None, "exit 3 when true"),
        "stdout_bytes": ("int", 0, "extra bytes to print on stdout"),
        "stderr_bytes": ("int", 0, "extra bytes to print on stderr"),
        "ignore_sigterm": ("bool", None, "ignore SIGTERM"),
        "spawn_child_s": ("number", 0, "seconds a stray child sleeps"),
        "model": ("str", None, "the model to ask once, through the metering proxy"),
    },
    "sweep-review": {  # demo/review_agent.py
        "sweep_task": ("int", None, "the sweep task whose run is reviewed"),
        "run_output": ("str", None, "the run's output file, readable in the sandbox"),
        "model": ("str", None, "the model to ask"),
        "stream": ("bool", None, "stream the model's answer"),
    },
}
#: Agent definition name -> the input keys that name what a task works on (its number, the file it
#: reviews) rather than how much work it is: the launch forecast does not hold their values against the
#: history's (``launch.forecast.history_basis``), as every new sweep brings new run files and a longer
#: campaign new task numbers, and neither makes the history fit less.
INPUT_IDENTIFIERS: dict[str, frozenset[str]] = {
    "demo-agent": frozenset({"task"}),
    "sweep-review": frozenset({"sweep_task", "run_output"}),
}
#: Unit suffixes whose values are numbers >= 0 for every agent.
UNIT_SUFFIXES = {"_s": "seconds", "_bytes": "bytes", "_tokens": "tokens", "_usd": "USD"}
#: An example input per agent definition name, shown on the launch form (parameter-list syntax).
INPUT_EXAMPLES: dict[str, str] = {
    "demo-agent": "task=1..20 duration_s=5",
    "sweep-review": ("sweep_task=1 run_output=/path/to/sweep/run-1.txt\n"
                     "sweep_task=2 run_output=/path/to/sweep/run-2.txt stream=true"),
}


def input_schema(agent_name: str) -> dict[str, tuple[InputType, float | None, str]]:
    """The declared keys of agent definition ``agent_name`` (``{}`` when it declares none)."""
    return INPUT_SCHEMAS.get(agent_name, {})


def _type_ok(value: Any, kind: InputType) -> bool:
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value \
            and value not in (float("inf"), float("-inf"))
    return isinstance(value, str)


_TYPE_WORDS = {"int": "an integer", "number": "a number", "bool": "true or false", "str": "text"}


def check_inputs(agent_name: str, items: list[dict[str, Any]]) -> None:
    """Check each input (task N is ``items[N-1]``) against ``agent_name``'s declared keys and the
    unit-suffix rule. Raises LaunchError naming the task, the key, what it must be and what it
    was: ``task 2: duration_s (seconds to think) must be a number >= 0, not "abc"``."""
    schema = input_schema(agent_name)
    passed: set[tuple[str, int]] = set()  # (key, id(value)) found fine: a range's tasks share their line's values
    for number, item in enumerate(items, start=1):
        for key, value in item.items():
            if (key, id(value)) in passed:
                continue
            passed.add((key, id(value)))
            declared = schema.get(key)
            if declared is None:
                suffix = next((s for s in UNIT_SUFFIXES if key.endswith(s) and len(key) > len(s)), None)
                if suffix is None:
                    continue
                declared = ("number", 0, UNIT_SUFFIXES[suffix])
            kind, minimum, what = declared
            if _type_ok(value, kind) and (minimum is None or value >= minimum):
                continue
            need = _TYPE_WORDS[kind] + (f" >= {minimum:g}" if minimum is not None else "")
            raise LaunchError(f"task {number}: {key} ({what}) must be {need}, not {json.dumps(value)[:40]}")


def input_example(agent_name: str) -> str:
    """An example parameter list for ``agent_name``: its own, else one built from its schema, else ""."""
    if agent_name in INPUT_EXAMPLES:
        return INPUT_EXAMPLES[agent_name]
    samples = {"int": "1", "number": "1.5", "bool": "false", "str": "text"}
    return " ".join(f"{k}={samples[t]}" for k, (t, _, _) in input_schema(agent_name).items())
