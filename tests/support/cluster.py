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


def qdel_leftover_campaign_jobs() -> list[int]:
    """Delete the array jobs of this test database's campaigns that the cluster still lists: a test that
    failed or timed out before its own cleanup leaves none behind for the next suite (or a demo's bill
    and triage) to find. A job is deleted only when its number *and* its name (``tco-<install>-c<id>-<name>``)
    match a campaign here (or a demo sweep's job whose tasks are recorded here), so a demo's or another
    database's job of the same number is never touched.
    Returns the job numbers deleted."""
    from dashboards.launch.submit import campaign_job_name
    from dashboards.models import Campaign, Task

    wanted = {c.job_number: campaign_job_name(c) for c in Campaign.objects.exclude(job_number=None)}
    # The demo sweep's plain array jobs (demo.sweep.sweep_submit records their tasks here at submission).
    wanted.update(Task.objects.filter(campaign=None, name__startswith="tco-sweep-")
                  .values_list("job_number", "name").distinct())
    if not wanted:
        return []
    jobs = qstat_jobs()
    doomed = [n for n, name in wanted.items() if n in jobs and jobs[n]["name"] == name and "d" not in jobs[n]["states"]]
    qdel_quietly(*doomed)
    return doomed
