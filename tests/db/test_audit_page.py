"""The audit log page: entries that fit their card (long text wraps, parameters fold), times with their zone."""
from __future__ import annotations

import pytest

from dashboards.core.audit import audit


pytestmark = pytest.mark.django_db


def test_each_entry_folds_its_parameters_and_labels_its_cells_for_phones(client, ops_users):
    audit(user=ops_users["launcher"], action="launch", target="campaign:7",
          params={"name": "sweep", "outputs": ["a" * 300], "tasks": 12}, ok=True, result="x " * 400)
    client.force_login(ops_users["admin"])
    html = client.get("/ops/audit/").content.decode()
    row = html.split('data-action="launch"', 1)[1].split("</tr>", 1)[0]
    assert "<details><summary>3 parameters</summary>" in row
    assert all(f'data-label="{label}"' in row for label in ("When", "Who", "Action", "Target", "OK", "Result",
                                                             "Parameters"))
    assert '<span class="zone"> UTC</span>' in row
    assert 'class="grid audit"' in html and "<colgroup>" in html


def test_a_long_result_is_folded_to_its_start(client, ops_users):
    audit(user=ops_users["launcher"], action="launch", target="campaign:8", params={}, ok=False,
          result="refused: " + "a long reason " * 40)
    client.force_login(ops_users["admin"])
    row = client.get("/ops/audit/").content.decode().split('data-action="launch"', 1)[1].split("</tr>", 1)[0]
    summary = row.split('<details class="long"><summary>', 1)[1].split("</summary>", 1)[0]
    assert len(summary) == 160 and summary.endswith("…")
