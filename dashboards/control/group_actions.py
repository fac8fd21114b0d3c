"""One triage action on every job of a reason group, as the admin's page showed it, after one confirmation.

The triage page groups waiting jobs by the reason they wait (``control.triage.triage_groups``);
a group's bulk action is its own (release a tco hold, raise a priority, ...). The
confirmation page lists the group's jobs and posts their numbers back; the action then
runs only on jobs both confirmed and still in the group (``triage.confirmed_in_group``),
each through ``control.actions.triage_action`` (checked and audited one by one).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from django.contrib.auth.models import AbstractBaseUser

from dashboards.control import actions, triage
from dashboards.core import limits
from dashboards.core.errors import ActionRefused, Refused

#: Jobs the triage page reads from the scheduler at most.
TRIAGE_MAX_JOBS = 200
#: The triage page's filters and search (URL parameters).
TRIAGE_FILTERS = ("team", "owner", "queue", "reason", "state", "q")


@dataclasses.dataclass(frozen=True)
class GroupActionResult:
    """What one group action did: ``queued`` job numbers, ``failed`` ``(job, why)`` pairs,
    ``joined`` jobs skipped because they joined the group after the confirmation page,
    ``left`` jobs skipped because they left it."""

    queued: list[int]
    failed: list[tuple[int, str]]
    joined: list[int]
    left: list[int]


def priority_argument(action: str, text: str) -> int | None:
    """The priority a ``priority`` action asks for, from the form's text; None for other actions.
    Raises ``ActionRefused`` unless it is a whole number in the scheduler's range
    (``limits.PRIORITY_MIN`` .. ``limits.PRIORITY_MAX``)."""
    if action != "priority":
        return None
    try:
        priority = int(text)
    except ValueError:
        priority = None
    if priority is None or not limits.PRIORITY_MIN <= priority <= limits.PRIORITY_MAX:
        raise ActionRefused(f"Priority: a whole number from {limits.PRIORITY_MIN} to {limits.PRIORITY_MAX}.")
    return priority


def shown_group(*, key: str, action: str, filters: Mapping[str, str]) -> tuple[dict[str, Any], list[dict]]:
    """The reason group ``key`` as the page showed it (with its ``filters``, ``TRIAGE_FILTERS``),
    and its waiting jobs: ``(group, jobs)`` (``triage.triage_groups``' shapes).

    Raises ``ActionRefused`` (nothing done) when ``action`` is not a triage action, the group
    has no waiting jobs any more, or ``action`` is not the group's own bulk action."""
    if action not in actions.TRIAGE_ACTIONS:
        raise ActionRefused(f"Unknown action {action[:32]!r}.")
    overview = triage.triage_overview(max_jobs=TRIAGE_MAX_JOBS)
    jobs = triage.triage_filter(overview["jobs"], **{k: str(filters.get(k, ""))[:100] for k in TRIAGE_FILTERS})
    group = next((g for g in triage.triage_groups(jobs) if g["key"] == key), None)
    if group is None:
        raise ActionRefused("That group has no waiting jobs any more (they may have started); nothing was done.")
    if action != group["action"]["action"]:  # a group's bulk action is its own, on its jobs only
        raise ActionRefused(f"{group['title']}: " + (f"the bulk action on this group is {group['action']['label']}"
                                                    if group["action"]["action"] else
                                                    f"no action in tco moves these ({group['action']['why']})")
                            + "; nothing was done.")
    return group, [j for j in jobs if j["job_number"] in group["jobs"]]


def group_action(*, user: AbstractBaseUser, group: dict[str, Any], action: str, priority: int | None,
                 confirmed: Sequence[str]) -> GroupActionResult:
    """Run ``action`` on the jobs of ``group`` that the confirmation page listed (``confirmed``: the
    job numbers it posted, as text) and that are still in the group; each job checked and audited
    by ``actions.triage_action``. Raises ``ActionRefused`` (nothing done) when ``confirmed`` is not
    job numbers or names no job of the group now."""
    try:
        chosen = triage.confirmed_in_group(group["jobs"], list(confirmed))
    except ValueError:
        raise ActionRefused(f"{group['title']}: the confirmation's job numbers are not valid; nothing was done. "
                            "Look at the group again and confirm.") from None
    if not chosen["act"]:
        raise ActionRefused(f"{group['title']}: the confirmation listed no job of this group now (they may have "
                            "started, or the group changed); nothing was done. Look at the group again and confirm.")
    queued, failed = [], []
    for job_number in chosen["act"]:
        try:
            actions.triage_action(user=user, action=action, job_number=job_number, priority=priority)
        except Refused as exc:
            failed.append((job_number, str(exc)))
        else:
            queued.append(job_number)
    return GroupActionResult(queued=queued, failed=failed, joined=list(chosen["joined"]), left=list(chosen["left"]))
