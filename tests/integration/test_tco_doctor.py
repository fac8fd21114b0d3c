"""``manage.py tco_doctor`` against the real dev cluster: every check passes on it, and each way of
pointing tco at a broken cell fails the check that names it, with the fix."""
from __future__ import annotations

import io

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

pytestmark = [pytest.mark.integration, pytest.mark.django_db]


def doctor(*args: str) -> tuple[str, str | None]:
    out = io.StringIO()
    try:
        call_command("tco_doctor", *args, stdout=out)
    except CommandError as exc:
        return out.getvalue(), str(exc)
    return out.getvalue(), None


def lines(text: str, status: str) -> dict[str, str]:
    found = {}
    for line in text.splitlines():
        if line.startswith(status):
            name, _, detail = line[5:].partition(": ")
            found[name] = detail
    return found


def test_the_dev_cluster_passes_every_check(sge_cluster, bootstrap):
    out, error = doctor()
    assert error is None, out
    assert set(lines(out, "ok  ")) == {"cell", "clients", "accounting", "drmaa", "operator", "schedd_job_info",
                                       "spool"}
    assert "SGE 8.1.9 (sge8)" in lines(out, "ok  ")["clients"] and "all checks passed" in out


def test_a_wrong_sge_root_fails_the_cell_and_client_checks(sge_cluster, bootstrap):
    out, error = doctor("--sge-root", "/nonexistent/gridengine", "--no-drmaa")
    failed = lines(out, "FAIL")
    assert error is not None and {"cell", "clients", "accounting"} <= set(failed)
    assert "/nonexistent/gridengine/default/common/act_qmaster not found" in failed["cell"]
    assert "fix: set SGE_ROOT and SGE_CELL" in out


def test_a_missing_accounting_file_fails_the_accounting_check_only(sge_cluster, bootstrap, tmp_path):
    missing = str(tmp_path / "accounting")
    out, error = doctor("--accounting-file", missing, "--no-drmaa")
    assert set(lines(out, "FAIL")) == {"accounting"} and "accounting" in error
    assert f"{missing} does not exist" in lines(out, "FAIL")["accounting"]
    assert f"fix: point the cluster's accounting file at the cell's ({sge_cluster['accounting_path']}" in out


def test_a_submit_account_that_is_not_an_operator_fails_the_operator_check(sge_cluster, bootstrap):
    out, error = doctor("--submit-user", "nobody", "--no-drmaa")
    assert set(lines(out, "FAIL")) == {"operator"} and "operator" in error
    assert "fix: as a manager: qconf -ao nobody" in out
