"""Issue 23, finding 10: host paths in the sandbox's /proc/self/mountinfo.

The kernel prints each mount's source path within its file system (mountinfo's fourth field): a
bind from the host shows where it comes from. An agent under a policy that lists only system
directories reads its mountinfo: neither the spool's path, nor the campaign's directory, nor tco's
repository (where the relay's script lies) is in it; the relay's script is a copy on the sandbox's
own tmpfs. What remains (docs/security.md, finding 10): the runner's private socket directory and
the paths a policy lists.
"""
from __future__ import annotations

import os

from execution.sandbox.plan import RELAY_SCRIPT
from tests.support.paths import REPO
from tests.support.runner import Spool

POLICY = ("version: 1\nfilesystem_policy:\n  include_workdir: true\n"
          "  read_only: [/usr, /lib, /lib64, /bin, /etc]\n  read_write: [/sandbox, /tmp]\n"
          "process: {run_as_user: sandbox, run_as_group: sandbox}\n")
CAMPAIGN = "c-mountinfo-41"


def mountinfo_of_agent(tmp_path, extra=None) -> tuple[Spool, list[list[str]]]:
    spool = Spool(tmp_path / "spool-finding10", campaign_id=CAMPAIGN)
    spool.write([{"task": 1}], command=["/usr/bin/python3", "-c", "print(open('/proc/self/mountinfo').read())"],
                policy=POLICY)
    result = spool.run(1, extra=extra)
    assert result.returncode == 0, (spool.record(1), result.stderr)
    text = (spool.root / "records" / CAMPAIGN / "1.stdout").read_text()
    return spool, [line.split() for line in text.splitlines() if line.strip()]


def test_the_agent_reads_neither_the_spool_nor_the_campaign_nor_the_repository_in_its_mountinfo(tmp_path):
    spool, lines = mountinfo_of_agent(tmp_path)
    text = "\n".join(" ".join(line) for line in lines)
    for secret in {str(spool.root), os.path.realpath(spool.root), str(REPO), os.path.realpath(REPO),
                   os.path.realpath(RELAY_SCRIPT), CAMPAIGN}:
        assert secret not in text, (secret, text)
    by_mount = {line[4]: line for line in lines}
    # The relay's script: a copy in bubblewrap's own tmpfs, not a bind of the repository's file.
    relay = by_mount["/run/tco-relay.py"]
    assert relay[relay.index("-") + 1] == "tmpfs" and relay[3].startswith("/bindfile"), relay
    # /sandbox: a tmpfs of its own (the spool's work directory is not bound).
    work = by_mount["/sandbox"]
    assert work[3] == "/" and work[work.index("-") + 1] == "tmpfs", work
