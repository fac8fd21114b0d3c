"""The real dev cluster seen from the tests: its environment, qstat read with regexes, qdel of our own jobs."""
from __future__ import annotations

import re
import subprocess

from django.conf import settings

from tests.sge_env import sge_env

SGE_ENV = sge_env(settings.SGE_ROOT, settings.SGE_CELL, LC_ALL="C")


def qstat_jobs() -> dict[int, dict[str, str]]:
    """job number -> {"name", "owner", "state", "project"} from ``qstat -xml -u '*' -ext``, read here with regexes."""
    out = subprocess.run(["qstat", "-xml", "-u", "*", "-ext"], capture_output=True, text=True, check=True,
                         env={**SGE_ENV, "TZ": "UTC"}).stdout
    jobs: dict[int, dict[str, str]] = {}
    for block in re.findall(r"<job_list[^>]*>(.*?)</job_list>", out, re.S):
        fields = dict(re.findall(r"<(JB_job_number|JB_name|JB_owner|state|JB_project)>([^<]*)<", block))
        number = int(fields["JB_job_number"])
        jobs.setdefault(number, {"name": fields.get("JB_name", ""), "owner": fields.get("JB_owner", ""),
                                 "project": fields.get("JB_project", ""), "states": ""})
        jobs[number]["states"] += fields.get("state", "") + " "
    return jobs


def job_gone_or_deleting(job: int) -> bool:
    """Whether qstat no longer lists ``job`` or shows it deleting; one qstat per call,
    since the job may leave between two."""
    jobs = qstat_jobs()
    return job not in jobs or "d" in jobs[job]["states"]


def qdel_quietly(*job_numbers: int | None) -> None:
    """Delete our own jobs by number (never by user: other suites share the cluster)."""
    ids = [str(j) for j in job_numbers if j]
    if ids:
        subprocess.run(["qdel", *ids], capture_output=True, env=SGE_ENV)
