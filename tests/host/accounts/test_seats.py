"""Finding F2: any local cluster account could take the global ``anthropic_api`` seats.

The seats (a consumable on the pseudo host ``global``, scripts/dev-cluster)
were requestable by every account in every queue: ``qsub -q classic.q -l
anthropic_api=90 ...`` as another user held seats tco's agents wait for. The
resource quota ``anthropic_api_tco`` (scripts/dev-cluster) now limits every
account but tco's submit account to 0 seats, so such a job can never hold
one. This test is that attack, as the ordinary account ``tco-probe``.
"""
from __future__ import annotations

import re
import subprocess
import time

from tests.support.accounts import as_user

SEAT_RULE = "anthropic_api_tco"
PROBE_WAIT_S = 60.0  # how long to wait for the scheduler's verdict on the probe job (not asserted)


def qstat_j(job: str) -> str:
    return subprocess.run(["qstat", "-j", job], capture_output=True, text=True).stdout


def running(job: str) -> bool:
    out = subprocess.run(["qstat", "-s", "r", "-u", "*"], capture_output=True, text=True).stdout
    return any(line.split()[:1] == [job] for line in out.splitlines())


def test_another_account_cannot_hold_api_seats(probe_account):
    # The attack: a plain job in classic.q (which takes any account's jobs) asking for seats.
    submitted = as_user(probe_account, ["qsub", "-terse", "-b", "y", "-wd", "/tmp", "-q", "classic.q",
                                        "-l", "anthropic_api=1", "-N", "seat-probe", "-o", "/dev/null", "-j", "y",
                                        "/bin/sleep", "60"])
    if submitted.returncode != 0:
        assert submitted.stdout.strip() == "", submitted  # refused at submission: nothing to clean up
        return
    job = submitted.stdout.strip().split(".")[0]
    assert re.fullmatch(r"\d+", job), submitted
    try:
        # Wait for the scheduler's verdict (schedd_job_info is on): it runs, or it says why not.
        deadline = time.monotonic() + PROBE_WAIT_S
        reasons = ""
        while time.monotonic() < deadline and not running(job):
            info = qstat_j(job)
            reasons = info.split("scheduling info:", 1)[1] if "scheduling info:" in info else ""
            if SEAT_RULE in reasons:
                break
            time.sleep(1)
        assert not running(job), f"job {job} of {probe_account} runs holding an anthropic_api seat"
        assert f'in rule "{SEAT_RULE}/' in reasons, qstat_j(job)  # qstat -j quotes the rule
    finally:
        as_user(probe_account, ["qdel", job])
