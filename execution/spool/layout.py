"""Where everything is under the spool root: :class:`SpoolLayout`, and names safe as path parts.

Standard library only.
"""
from __future__ import annotations

import os
import re
import time

from execution.spool.contract import TASK_FILE_SUFFIXES, SpoolError

__all__ = ["CAMPAIGN_ID_RE", "check_campaign_id", "check_task_number", "SpoolLayout"]

CAMPAIGN_ID_RE = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")
_CLAIM_MARK = ".json.claim-"


def check_campaign_id(campaign_id: str | int) -> str:
    """``campaign_id`` as the path component it becomes: 1-128 letters, digits, ``_.-``, never
    ``.``/``..``; an int (not bool) is written in decimal. Raises :class:`SpoolError`."""
    if isinstance(campaign_id, bool) or not isinstance(campaign_id, (str, int)):
        raise SpoolError(f"campaign id {campaign_id!r} is not text or a number")
    text = str(campaign_id)
    if not CAMPAIGN_ID_RE.match(text) or text in (".", ".."):
        raise SpoolError(f"campaign id {text!r} is not a safe name")
    return text


def check_task_number(task_number: int) -> int:
    """A Grid Engine task number (int >= 1). Raises :class:`SpoolError`."""
    if isinstance(task_number, bool) or not isinstance(task_number, int) or task_number < 1:
        raise SpoolError(f"task number {task_number!r} is not a positive integer")
    return task_number


class SpoolLayout:
    """Every path of the spool under ``root`` (text paths; ``root`` as given, not resolved).

    Campaign ids and task numbers are checked (:func:`check_campaign_id`,
    :func:`check_task_number`) so that no name leads outside the spool;
    methods raise :class:`SpoolError` for a bad one.
    """

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = os.fspath(root)

    def __repr__(self) -> str:
        return f"SpoolLayout({self.root!r})"

    # ---- written at launch
    def campaign_dir(self, campaign_id: str | int) -> str:
        """``campaigns/<campaign>``: the campaign's spec and inputs."""
        return os.path.join(self.root, "campaigns", check_campaign_id(campaign_id))

    def spec_path(self, campaign_id: str | int) -> str:
        """``campaigns/<campaign>/spec.json``: the :class:`RunnerSpec`."""
        return os.path.join(self.campaign_dir(campaign_id), "spec.json")

    def inputs_path(self, campaign_id: str | int) -> str:
        """``campaigns/<campaign>/inputs.jsonl``: line N is task N's input (a JSON object)."""
        return os.path.join(self.campaign_dir(campaign_id), "inputs.jsonl")

    def network_policy_path(self, campaign_id: str | int) -> str:
        """``campaigns/<campaign>/network.json``: the :class:`NetworkPolicyFile` (written by the web
        side when a running campaign's network policy changes; read by its runners)."""
        return os.path.join(self.campaign_dir(campaign_id), "network.json")

    @property
    def prices_path(self) -> str:
        """``prices.json``: the price table the metering proxies read."""
        return os.path.join(self.root, "prices.json")

    @property
    def credentials_path(self) -> str:
        """``credentials.json``: ``{"name": "secret"}``, readable by the submit account only."""
        return os.path.join(self.root, "credentials.json")

    # ---- written by the runner
    @property
    def records_root(self) -> str:
        """``records``: one folder per campaign."""
        return os.path.join(self.root, "records")

    def records_dir(self, campaign_id: str | int) -> str:
        """``records/<campaign>``: every task's record, logs, requests and outputs."""
        return os.path.join(self.records_root, check_campaign_id(campaign_id))

    def task_file(self, campaign_id: str | int, task_number: int, suffix: str) -> str:
        """``records/<campaign>/<task>.<suffix>``, ``suffix`` one of :data:`TASK_FILE_SUFFIXES`."""
        if suffix not in TASK_FILE_SUFFIXES:
            raise SpoolError(f"suffix {suffix!r} is not one of {', '.join(TASK_FILE_SUFFIXES)}")
        return os.path.join(self.records_dir(campaign_id), f"{check_task_number(task_number)}.{suffix}")

    def record_path(self, campaign_id: str | int, task_number: int) -> str:
        """``records/<campaign>/<task>.json``: the :class:`RunnerRecord`."""
        return self.task_file(campaign_id, task_number, "json")

    def outputs_dir(self, campaign_id: str | int, task_number: int) -> str:
        """``records/<campaign>/<task>.outputs``: declared outputs, copied and capped."""
        return self.task_file(campaign_id, task_number, "outputs")

    def work_dir(self, campaign_id: str | int, task_number: int | None = None) -> str:
        """``work/<campaign>`` or ``work/<campaign>/<task>`` (shown at ``/sandbox``)."""
        base = os.path.join(self.root, "work", check_campaign_id(campaign_id))
        return base if task_number is None else os.path.join(base, str(check_task_number(task_number)))

    def logs_dir(self, campaign_id: str | int) -> str:
        """``logs/<campaign>``: Grid Engine's output and error files of the campaign's job."""
        return os.path.join(self.root, "logs", check_campaign_id(campaign_id))

    # ---- ingest's folders
    def ingested_path(self, campaign_folder: str, name: str) -> str:
        """``ingested/<campaign>/<name>``: where a stored record goes."""
        return os.path.join(self.root, "ingested", _component(campaign_folder), _component(name))

    def quarantine_path(self, campaign_folder: str, name: str) -> str:
        """``quarantine/<campaign>/<name>``: where a refused record goes."""
        return os.path.join(self.root, "quarantine", _component(campaign_folder), _component(name))

    def _record_entries(self) -> list[os.DirEntry]:
        """Regular files directly in ``records/<campaign>/`` folders, sorted by path."""
        found: list[os.DirEntry] = []
        try:
            campaigns = list(os.scandir(self.records_root))
        except FileNotFoundError:
            return []
        for campaign in campaigns:
            if not campaign.is_dir(follow_symlinks=False):
                continue
            try:
                found += [e for e in os.scandir(campaign.path) if e.is_file(follow_symlinks=False)]
            except OSError:
                continue
        return sorted(found, key=lambda e: e.path)

    def record_files(self) -> list[str]:
        """Every runner record waiting in ``records/*/*.json``, sorted (claimed ones excluded)."""
        return [e.path for e in self._record_entries() if e.name.endswith(".json") and not e.name.startswith(".")]

    def stale_claims(self, older_than_s: float, *, now: float | None = None) -> list[str]:
        """Claimed records (``records/<campaign>/.<task>.json.claim-*``) whose claim is older than
        ``older_than_s`` seconds (by the rename's inode change time): their ingester died."""
        now = time.time() if now is None else now
        found = []
        for entry in self._record_entries():
            if entry.name.startswith(".") and _CLAIM_MARK in entry.name:
                try:
                    if now - entry.stat(follow_symlinks=False).st_ctime > older_than_s:
                        found.append(entry.path)
                except OSError:
                    continue
        return found

    @staticmethod
    def claim_name(path: str, token: str) -> str:
        """The hidden name a record at ``path`` takes while ingester ``token`` holds it."""
        directory, name = os.path.split(path)
        if name.startswith(".") and _CLAIM_MARK in name:  # re-claiming a stale claim
            name = name[1:name.index(_CLAIM_MARK)] + ".json"
        return os.path.join(directory, f".{name[:-len('.json')]}{_CLAIM_MARK}{token}")

    @staticmethod
    def unclaimed_name(path: str) -> str:
        """The record's own name (``<task>.json``) of a claimed path (or of the record itself)."""
        name = os.path.basename(path)
        if name.startswith(".") and _CLAIM_MARK in name:
            return name[1:name.index(_CLAIM_MARK)] + ".json"
        return name


def _component(name: str) -> str:
    if not name or "/" in name or name in (".", ".."):
        raise SpoolError(f"{name!r} is not a file name")
    return name
