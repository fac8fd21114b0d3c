"""tco_doctor's checks with the clients answered from captured OCS 9.1.4 configuration
(tests/fixtures/ocs914/config/, qconf as printed) and edited copies of it for the failing cases."""
from __future__ import annotations

from pathlib import Path

import pytest

from schedulers.base import SchedulerUnavailable
from schedulers.gridengine import doctor

OCS914 = Path(__file__).resolve().parent.parent / "fixtures" / "ocs914"


def answers(**override) -> dict[str, bytes]:
    base = {
        "qstat -help": (OCS914 / "version.txt").read_bytes() + b"usage: qstat [options]\n",
        "qstat -g c -xml": (OCS914 / "qstat_g_c.xml").read_bytes(),
        "qconf -sconf global": (OCS914 / "config" / "qconf_sconf_global.txt").read_bytes(),
        "qconf -ssconf": (OCS914 / "config" / "qconf_ssconf.txt").read_bytes(),
        "qconf -so": b"ocsuser\n",
        "qconf -sm": b"root\nocsadmin\n",
    }
    base.update(override)
    return base


def runner(table: dict[str, bytes | Exception]):
    def run(argv, **kwargs):
        answer = table[" ".join(argv)]
        if isinstance(answer, Exception):
            raise answer
        return answer
    return run


@pytest.fixture
def cell(tmp_path) -> doctor.Cell:
    common = tmp_path / "default" / "common"
    common.mkdir(parents=True)
    (common / "act_qmaster").write_text("vm\n")
    (common / "accounting.jsonl").write_bytes((OCS914 / "accounting.jsonl").read_bytes())
    return doctor.Cell(sge_root=str(tmp_path), sge_cell="default", flavour="ocs9",
                       accounting_path=str(common / "accounting.jsonl"), submit_user="ocsuser",
                       spool_dir=str(tmp_path / "spool"))


def verdicts(cell, table) -> dict[str, doctor.Check]:
    return {c.name: c for c in doctor.run_checks(cell, run=runner(table), drmaa=False)}


def test_a_healthy_ocs914_cell_passes(cell):
    checks = verdicts(cell, answers())
    assert {name: c.status for name, c in checks.items()} == {n: "ok" for n in (
        "cell", "clients", "accounting", "operator", "schedd_job_info", "spool")}
    assert checks["clients"].detail.startswith("OCS 9.1.4 (ocs9); qmaster answers: 2 cluster queue(s)")
    assert "251573 bytes (json records)" in checks["accounting"].detail


def test_each_broken_piece_names_its_check_and_fix(cell):
    ssconf = (OCS914 / "config" / "qconf_ssconf.txt").read_bytes().replace(b"schedd_job_info                   true",
                                                                          b"schedd_job_info                   false")
    sconf = (OCS914 / "config" / "qconf_sconf_global.txt").read_bytes().replace(b"accounting=true",
                                                                               b"accounting=false")
    checks = verdicts(cell, answers(**{"qconf -ssconf": ssconf, "qconf -so": b"no operator defined\n"}))
    assert checks["schedd_job_info"].status == "warn" and "qconf -msconf" in checks["schedd_job_info"].fix
    assert checks["operator"].failed and checks["operator"].fix == "as a manager: qconf -ao ocsuser"
    checks = verdicts(cell, answers(**{"qconf -sconf global": sconf}))
    assert checks["accounting"].failed and "reporting_params accounting=true" in checks["accounting"].fix
    # An sge8 banner on a cluster said to be ocs9: the flavour is wrong.
    checks = verdicts(cell, answers(**{"qstat -help": b"SGE 8.1.9\n"}))
    assert checks["clients"].failed and "TCO_SCHEDULER_FLAVOUR=sge8" in checks["clients"].fix
    # The qmaster down: the clients answer -help but not qstat -g c.
    checks = verdicts(cell, answers(**{"qstat -g c -xml": SchedulerUnavailable("qstat: cannot reach the qmaster")}))
    assert checks["clients"].failed and "start the qmaster" in checks["clients"].fix


def test_an_sge8_accounting_path_on_an_ocs9_cell_is_named(cell):
    cell.accounting_path = cell.accounting_path.replace("accounting.jsonl", "accounting")
    check = verdicts(cell, answers())["accounting"]
    assert check.failed and check.detail.endswith(f"(a ocs9 cell writes {cell.sge_root}/default/common/accounting.jsonl)")


def test_a_shrunken_accounting_file_is_a_warning(cell):
    cell.checkpoint_offset = 10**9
    assert verdicts(cell, answers())["accounting"].status == "warn"


def test_an_unwritable_spool_fails(cell, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    cell.spool_dir = str(blocker / "spool")  # a directory under a file cannot exist
    assert verdicts(cell, answers())["spool"].failed
