"""The state table: qstat letters are a set, decided by precedence (BUG-02)."""
from __future__ import annotations

import pytest

from schedulers.base import SCHEDULER_STATES
from schedulers.states import map_state


@pytest.mark.parametrize(
    ("code", "state", "restarted"),
    [
        ("r", "running", False),
        ("t", "starting", False),
        ("Rr", "running", True),
        ("Rt", "starting", True),
        ("s", "suspended", False),
        ("S", "suspended", False),
        ("T", "suspended", False),
        ("dr", "deleting", False),
        ("dt", "deleting", False),
        ("ds", "deleting", False),
        ("qw", "pending", False),
        ("w", "pending", False),
        ("Rq", "pending", True),
        ("hqw", "held", False),
        ("hRwq", "held", True),
        ("hr", "running", False),
        ("hs", "suspended", False),
        ("Eqw", "error", False),
        ("Ehqw", "error", False),
        ("dEqw", "error", False),
    ],
)
def test_it_maps_letter_sets_by_precedence(code, state, restarted):
    assert map_state(code) == (state, restarted)


def test_a_running_task_put_on_hold_is_still_running():
    assert map_state("hr")[0] == "running"


def test_error_is_never_pending_and_suspension_is_never_finished():
    assert map_state("Eqw")[0] == "error"
    for code in ("s", "S", "T", "Ss", "sT"):
        assert map_state(code)[0] == "suspended"


def test_letter_order_does_not_matter():
    assert map_state("wqRh") == map_state("hRwq") == ("held", True)


@pytest.mark.parametrize("code", ["", "x", "rx", "qwz", "f", "R", "?", "  "])
def test_unknown_letters_and_empty_codes_give_unknown_without_raising(code):
    assert map_state(code)[0] == "unknown"


def test_unknown_code_keeps_the_restarted_flag():
    assert map_state("Rrx") == ("unknown", True)


def test_every_answer_is_a_scheduler_state():
    codes = ["r", "t", "s", "S", "T", "d", "E", "h", "q", "w", "R", "x", "Eqw", "hr"]
    assert {map_state(code)[0] for code in codes} <= set(SCHEDULER_STATES)


def test_a_non_string_code_gives_unknown():
    assert map_state(None) == ("unknown", False)  # type: ignore[arg-type]
