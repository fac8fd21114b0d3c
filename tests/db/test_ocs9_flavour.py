"""OCS 9 as a flavour: detection and defaults, the qstat -j reader on OCS 9.2 output, -fmt json readers,
the adapter's JSON/XML choice, DRMAA library and closing, ingest of the captured OCS 9.1.4 accounting.

Fixtures: tests/fixtures/ocs914/ (real OCS 9.1.4 output), tests/fixtures/ocs920/ (real OCS 9.2.0prealpha
output, a subset of the captures; its README.md describes every file). Where a test edits a captured file
to make a case the capture lacks, it says so ("derived from").
"""
from __future__ import annotations

import shutil
import datetime as dt
from pathlib import Path

import pytest

from schedulers.gridengine.adapter import OpenClusterScheduler

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
OCS914 = FIXTURES / "ocs914"
OCS920 = FIXTURES / "ocs920"

#: The lifecycle word of each qstat state code in these captures, written out by hand from qstat(1).
BY_HAND = {"r": "running", "s": "suspended", "Eqw": "error", "qw": "pending", "hqw": "held", "df": "finishing"}


@pytest.mark.django_db
def test_the_default_cluster_takes_the_configured_flavour_and_its_accounting_file(settings, tmp_path):
    from dashboards.core.clusters import cluster_get_default, scheduler_for

    settings.TCO_CLUSTER_NAME = "ocs-site"
    settings.SGE_ROOT, settings.SGE_CELL = str(tmp_path), "default"
    settings.TCO_SCHEDULER_FLAVOUR, settings.TCO_ACCOUNTING_FILE = "ocs9", ""
    cluster = cluster_get_default()
    assert cluster.flavour == "ocs9"
    assert cluster.accounting_path == f"{tmp_path}/default/common/accounting.jsonl"
    assert type(scheduler_for(cluster)) is OpenClusterScheduler


def test_an_ocs9_cluster_ingests_every_captured_record_and_bills_as_qacct(ocs9_cluster):
    from django.db.models import Sum

    from dashboards.billing.bills import bill
    from dashboards.ingest.accounting import ingest_accounting
    from dashboards.models import AccountingRecord, Team

    result = ingest_accounting(ocs9_cluster, max_bytes=64 * 1024)  # several batches
    assert (result.accepted, result.quarantined, result.error) == (253, 0, "")
    records = AccountingRecord.objects.filter(cluster=ocs9_cluster)
    assert records.count() == 253
    per_project = {row["project"] or "NONE": row["w"] for row in
                   records.values("project").annotate(w=Sum("wallclock_s")).order_by()}
    assert per_project == qacct_p() == {"NONE": 179, "engineering": 350, "research": 6086}
    day = dt.date(2026, 12, 1)
    billed = bill(teams=Team.objects.all(), period="day", first=day, last=day, clusters=[ocs9_cluster])
    assert {row["project"]: row["wallclock_s"] for row in billed["rows"]} == \
        {"engineering": 350.0, "research": 6086.0}
    job10 = records.get(job_number=10)
    assert (job10.wallclock_s, round(job10.wallclock_exact_s, 3)) == (0, 1.08)  # qacct -j 10: 0 and 1.080
    assert ingest_accounting(ocs9_cluster).accepted == 0  # caught up: nothing twice


def test_a_missing_accounting_file_is_a_loud_error_on_the_queue_page(ocs9_cluster, django_user_model):
    from dashboards.ingest.accounting import ingest_accounting
    from dashboards.live.queue import queue_summary

    wrong = ocs9_cluster.accounting_path.replace("accounting.jsonl", "accounting")  # the sge8 file name
    ocs9_cluster.accounting_path = wrong
    ocs9_cluster.save()
    result = ingest_accounting(ocs9_cluster)
    assert result.accepted == 0 and wrong in result.error
    ocs9_cluster.refresh_from_db()
    assert wrong in ocs9_cluster.accounting_error and ocs9_cluster.accounting_error_at is not None
    admin = django_user_model.objects.create_user("root", is_staff=True, is_superuser=True)
    page = queue_summary(admin)
    (row,) = [c for c in page["clusters"] if c["name"] == "ocs914"]
    assert wrong in row["accounting_error"] and row["flavour"] == "ocs9"
    # Fixed: the next pass reads the file and clears the error.
    ocs9_cluster.accounting_path = wrong + ".jsonl"
    ocs9_cluster.save()
    assert ingest_accounting(ocs9_cluster).accepted == 253
    ocs9_cluster.refresh_from_db()
    assert ocs9_cluster.accounting_error == "" and ocs9_cluster.accounting_error_at is None


def qacct_p() -> dict[str, int]:
    """qacct -P of the captured file: PROJECT -> WALLCLOCK."""
    rows = {}
    for line in (OCS914 / "qacct_P.txt").read_text().splitlines()[2:]:
        project, wallclock, *_ = line.split()
        rows[project] = int(wallclock)
    return rows


@pytest.fixture
def ocs9_cluster(db, tmp_path):
    from dashboards.models import Cluster
    from dashboards.core.accounts import team_ensure

    common = tmp_path / "default" / "common"
    common.mkdir(parents=True)
    shutil.copy(OCS914 / "accounting.jsonl", common / "accounting.jsonl")
    team_ensure(name="Research", project="research")
    team_ensure(name="Engineering", project="engineering")
    return Cluster.objects.create(name="ocs914", flavour="ocs9", sge_root=str(tmp_path), sge_cell="default",
                                  accounting_path=str(common / "accounting.jsonl"))
