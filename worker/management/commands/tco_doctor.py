"""``python manage.py tco_doctor``: check the configured cluster end to end, as a site admin would.

Prints one line per check (``ok``, ``warn``, ``FAIL``) with what was found
and, when it is not ok, the fix; exits with status 1 when a check fails.
The cluster is the configured one (``TCO_CLUSTER_NAME``: its SGE_ROOT, cell,
flavour and accounting file); the options point the checks elsewhere, e.g. at
a cell being set up. Checks: schedulers/gridengine/doctor.py.
"""
from __future__ import annotations

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from dashboards.core.clusters import cluster_flavour, cluster_get_default
from dashboards.models import IngestCheckpoint
from schedulers.gridengine import doctor, flavours


class Command(BaseCommand):
    help = "Check the configured Grid Engine cluster end to end and name the fix of each failing check."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--sge-root", help="the cell's SGE_ROOT (default: the cluster's)")
        parser.add_argument("--sge-cell", help="the cell's SGE_CELL (default: the cluster's)")
        parser.add_argument("--flavour", choices=sorted(flavours.FLAVOURS),
                            help="the cell's flavour (default: the cluster's)")
        parser.add_argument("--accounting-file", help="the accounting file (default: the cluster's)")
        parser.add_argument("--submit-user", default=None, help="the submit account (default: TCO_SUBMIT_USER)")
        parser.add_argument("--no-drmaa", action="store_true", help="skip loading libdrmaa")

    def handle(self, *args, **options) -> None:
        cluster = cluster_get_default()
        sge_root = options["sge_root"] or cluster.sge_root
        sge_cell = options["sge_cell"] or cluster.sge_cell
        flavour = options["flavour"] or cluster.flavour
        _detected, why = cluster_flavour(sge_root, sge_cell)
        accounting = options["accounting_file"] or (
            cluster.accounting_path if not options["sge_root"] and not options["sge_cell"] and not options["flavour"]
            else flavours.defaults_for(flavour).accounting_path(sge_root, sge_cell))
        checkpoint = IngestCheckpoint.objects.filter(cluster=cluster, source="accounting", path=accounting).first()
        cell = doctor.Cell(sge_root=sge_root, sge_cell=sge_cell, flavour=flavour, accounting_path=accounting,
                           submit_user=options["submit_user"] or settings.TCO_SUBMIT_USER,
                           spool_dir=str(settings.TCO_SPOOL_DIR),
                           checkpoint_offset=checkpoint.offset if checkpoint else 0)
        defaults = flavours.defaults_for(flavour)
        self.stdout.write(f"cluster {cluster.name}: {sge_root}/{sge_cell}, flavour {flavour} ({defaults.label}; "
                          f"installation: {why})")
        self.stdout.write(f"  accounting {accounting} ({defaults.accounting_format}), reporting "
                          f"{defaults.reporting_path(sge_root, sge_cell)}, libdrmaa "
                          f"{defaults.drmaa_library(sge_root)}, jemalloc preload "
                          f"{defaults.jemalloc_preload or 'not needed'}")
        checks = doctor.run_checks(cell, drmaa=not options["no_drmaa"])
        for check in checks:
            label = {"ok": "ok  ", "warn": "warn", "fail": "FAIL"}[check.status]
            self.stdout.write(f"{label} {check.name}: {check.detail}")
            if check.status != doctor.OK and check.fix:
                self.stdout.write(f"     fix: {check.fix}")
        failed = [c.name for c in checks if c.failed]
        if failed:
            raise CommandError(f"{len(failed)} check(s) failed: {', '.join(failed)}")
        self.stdout.write("all checks passed")
