"""Grid Engine job state letters -> tco lifecycle state.

Source: qstat(1) of SGE 8.1.9 and OCS 9.x, section "OUTPUT FORMATS", field
"state": a job's state is a *set* of letters, printed in a fixed order. The
letters and their meaning (qstat(1), and ``job_get_state_string`` in
sge_job.c):

====== ============================================================
letter meaning
====== ============================================================
d      deletion requested (qdel) -- the task still runs until killed
E      error: the job could not be started (needs ``qmod -cj`` or qdel)
h      hold (user, operator, system or a job dependency)
r      running
R      restarted (rescheduled or restarted after migration) -- a flag
s      suspended (``qmod -sj``)
S      suspended because its queue is suspended (subordination)
T      suspended because a queue suspend threshold was exceeded
t      transferring: dispatched, being started on the exec host
w      waiting (pending; also for a start time set with ``-a``)
q      queued (pending)
====== ============================================================

Because the letters combine (``hr`` is a running task that has been put on
hold, ``Eqw`` a pending job in error, ``dr`` a running task being deleted,
``hRwq`` a held task that has been restarted), the state is decided by
precedence, never by matching the whole string::

    E > d > s/S/T > r > t > h > q/w

``R`` does not change the state; it sets the ``restarted`` flag. A code with
any letter not in the table above (or an empty code) maps to ``unknown``: a
new letter from a future version is shown as such rather than guessed. The
Grid Engine headers define a few more job letters that ``qstat -xml -u '*'``
is not expected to print and that are deliberately left ``unknown`` here:
``x`` (exiting, execd collecting usage; ``EXITING_SYM``), ``u`` (exec host
stopped reporting), ``m`` (migrating), ``z`` (zombie, ``-s z`` only) and
OCS 9.2's ``f`` (finished, retained; ``-s f`` only).
"""
from __future__ import annotations

__all__ = ["STATE_PRECEDENCE", "RESTARTED_LETTER", "KNOWN_LETTERS", "map_state"]

# Highest precedence first. Each entry: (letters, lifecycle state).
STATE_PRECEDENCE: tuple[tuple[frozenset[str], str], ...] = (
    (frozenset("E"), "error"),
    (frozenset("d"), "deleting"),
    (frozenset("sST"), "suspended"),
    (frozenset("r"), "running"),
    (frozenset("t"), "starting"),
    (frozenset("h"), "held"),
    (frozenset("qw"), "pending"),
)
RESTARTED_LETTER = "R"
KNOWN_LETTERS = frozenset("".join("".join(letters) for letters, _ in STATE_PRECEDENCE) + RESTARTED_LETTER)

# The same few codes repeat across every poll; remember each answer.
_CACHE: dict[str, tuple[str, bool]] = {}


def map_state(code: str) -> tuple[str, bool]:
    """Map qstat's state letters (``"Eqw"``, ``"hr"``, ``"Rr"``) to
    ``(lifecycle_state, restarted)``.

    ``lifecycle_state`` is one of ``pending, held, starting, running,
    suspended, deleting, error, unknown`` (base.SCHEDULER_STATES).
    ``restarted`` is True when the code contains ``R``. Never raises:
    unknown letters, or a code of only ``R``, give ``"unknown"``.
    """
    try:
        return _CACHE[code]
    except (KeyError, TypeError):
        pass
    result = _map_state_uncached(code)
    if isinstance(code, str) and len(_CACHE) < 1024:
        _CACHE[code] = result
    return result


def _map_state_uncached(code: object) -> tuple[str, bool]:
    if not isinstance(code, str):
        return ("unknown", False)
    letters = set(code.strip())
    restarted = RESTARTED_LETTER in letters
    if not letters or not letters <= KNOWN_LETTERS:
        return ("unknown", restarted)
    for group, state in STATE_PRECEDENCE:
        if letters & group:
            return (state, restarted)
    return ("unknown", restarted)
