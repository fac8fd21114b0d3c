"""Reads of the spool's files for the pages: logs, the work directory, outputs.

Every path is taken from the spool contract (execution/spool.py
``SpoolLayout``) or a runner record, and checked to lie inside the spool
after resolving links, before anything is opened. Scoping (may this user see
this task?) is the caller's (``selectors.task_for``).
"""
from __future__ import annotations

import os
import stat
from typing import Any

from django.conf import settings

from dashboards.models import Task
from execution.spool import SpoolLayout

OUTPUT_FILES_SHOWN = 50


def _spool_root() -> str:
    return os.path.realpath(settings.TCO_SPOOL_DIR)


def _inside(root: str, path: str) -> bool:
    try:
        return os.path.commonpath([root, path]) == root
    except ValueError:  # different drives, or a mix of absolute and relative
        return False


def read_spool_file(path: str | None, *, cap: int | None = None, base: str | None = None) -> dict[str, Any]:
    """The last ``cap`` bytes of a file that lies inside the spool (or inside ``base``, itself inside it).

    Returns ``{"path": path relative to the spool | None, "size": bytes |
    None, "text": str | None, "truncated": bool, "error": str | None}``.
    Symbolic links are resolved first and the result must still be inside
    the spool; the file is opened without following a final link, must be a
    regular file, and is checked again through ``/proc/self/fd`` after
    opening, so a path swapped in between is refused too. Never raises for a
    bad path: the reason is in ``error``.
    """
    cap = cap or settings.TCO_LOG_VIEW_CAP
    root = _spool_root()
    limit = os.path.realpath(base) if base else root
    result: dict[str, Any] = {"path": None, "size": None, "text": None, "truncated": False, "error": None}
    if not path:
        result["error"] = "not recorded"
        return result
    real = os.path.realpath(path)
    if not (_inside(root, limit) and _inside(limit, real)):
        result["error"] = "outside the spool directory: not shown"
        return result
    result["path"] = os.path.relpath(real, root)
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        result["error"] = "no such file (yet)"
        return result
    except OSError as exc:
        result["error"] = f"cannot open: {exc.strerror}"
        return result
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            result["error"] = "not a regular file: not shown"
            return result
        proc_link = f"/proc/self/fd/{fd}"
        if os.path.exists(proc_link) and not _inside(limit, os.readlink(proc_link)):
            result["error"] = "outside the spool directory: not shown"
            return result
        size = info.st_size
        result["size"] = size
        start = max(0, size - cap)
        os.lseek(fd, start, os.SEEK_SET)
        data = os.read(fd, cap)
        result["truncated"] = start > 0
        result["text"] = data.decode("utf-8", "replace")
    finally:
        os.close(fd)
    return result


def task_work_dir(task: Task) -> str | None:
    """The task's work directory in the spool (``work/<campaign>/<task>``); None outside a campaign."""
    if task.campaign_id is None:
        return None
    # A non-array job's task number is 0; its runner uses task 1 (execution/runner.py).
    return SpoolLayout(settings.TCO_SPOOL_DIR).work_dir(task.campaign_id, task.task_number or 1)


def task_output_path(task: Task, suffix: str) -> str | None:
    """stdout/stderr: the runner record's path; while the task runs, where the runner writes it."""
    record = task.runner_record or {}
    if record:
        return record.get(f"{suffix}_path")
    if task.campaign_id is None:
        return None
    return SpoolLayout(settings.TCO_SPOOL_DIR).task_file(task.campaign_id, task.task_number or 1, suffix)


def task_outputs(task: Task) -> dict[str, Any]:
    """Files the agent left in its work directory: ``{"dir", "files": [{name, size}], "more", "error"}``.

    Only regular files inside the spool are listed (links are not followed),
    at most ``OUTPUT_FILES_SHOWN``, one level deep.
    """
    work = task_work_dir(task)
    out: dict[str, Any] = {"dir": None, "files": [], "more": 0, "error": None}
    if work is None:
        out["error"] = "no work directory (not a tco campaign)"
        return out
    root = _spool_root()
    real = os.path.realpath(work)
    if not _inside(root, real):
        out["error"] = "outside the spool directory: not shown"
        return out
    out["dir"] = os.path.relpath(real, root)
    try:
        entries = sorted(os.scandir(real), key=lambda e: e.name)
    except FileNotFoundError:
        out["error"] = "no work directory (yet)"
        return out
    except OSError as exc:
        out["error"] = f"cannot list: {exc.strerror}"
        return out
    files = [e for e in entries if e.is_file(follow_symlinks=False)]
    out["files"] = [{"name": e.name, "size": e.stat(follow_symlinks=False).st_size} for e in files[:OUTPUT_FILES_SHOWN]]
    out["more"] = max(0, len(files) - OUTPUT_FILES_SHOWN)
    return out


def task_output_file(task: Task, name: str) -> dict[str, Any]:
    """One file (by its plain name) of the task's work directory, ``read_spool_file`` shape.

    The caller has checked the user may see ``task`` (``selectors.task_for``).
    """
    work = task_work_dir(task)
    if work is None or not name or "/" in name or name in (".", ".."):
        return {"path": None, "size": None, "text": None, "truncated": False, "error": "no such output"}
    return read_spool_file(os.path.join(work, name), base=work)
