"""Check the usage, waste and request rollups against the detail rows, or make them again from them (issue 26).

    manage.py tco_rollups --check            # exit 1 and list the hours and days that differ
    manage.py tco_rollups --rebuild          # make them again (after a repair by hand)

Both take ``--cluster NAME``. Where the detail retention dropped rows
(``Cluster.detail_dropped_before``), only the hours from that cut on are
checked or made again: before it the rollups are all that is left. The day rows (usage and
waste, the bills' whole days) are checked against the sum of their hour rows, every day: the hour
rows are kept for all hours.
"""
from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from dashboards.core import rollups
from dashboards.models import Cluster


class Command(BaseCommand):
    help = "Check the usage rollups against the detail rows (--check) or make them again (--rebuild)."

    def add_arguments(self, parser) -> None:
        action = parser.add_mutually_exclusive_group(required=True)
        action.add_argument("--check", action="store_true")
        action.add_argument("--rebuild", action="store_true")
        parser.add_argument("--cluster", help="one cluster's name (default: every cluster)")

    def handle(self, *args, check: bool, rebuild: bool, cluster: str | None, **options) -> None:
        clusters = Cluster.objects.order_by("name")
        if cluster:
            clusters = clusters.filter(name=cluster)
            if not clusters.exists():
                raise CommandError(f"no cluster named {cluster!r}")
        bad = 0
        for c in clusters:
            since = c.detail_dropped_before
            scope = f"cluster {c.name}" + (f" from {since.isoformat()}" if since else "")
            if rebuild:
                rows = rollups.rebuild(cluster_id=c.pk, since=since)
                waste_rows = rollups.rebuild_waste(cluster_id=c.pk, since=since)
                request_rows = rollups.rebuild_requests(cluster_id=c.pk, since=since)
                self.stdout.write(f"{scope}: {rows} rollup rows, {waste_rows} waste and {request_rows} request "
                                  "rollup rows made from the detail rows")
                continue
            differences = (rollups.differences(cluster_id=c.pk, since=since)
                           + rollups.kind_differences("waste", cluster_id=c.pk, since=since)
                           + rollups.kind_differences("requests", cluster_id=c.pk, since=since))
            days = (rollups.day_differences("usage", cluster_id=c.pk)
                    + rollups.day_differences("waste", cluster_id=c.pk))
            bad += len(differences) + len(days)
            for d in differences[:50]:
                changed = {k: (v, d["detail"][k]) for k, v in d["rollup"].items() if v != d["detail"][k]}
                self.stdout.write(f"{scope}: {d['key']}: rollup != detail: {changed}")
            for d in days[:50]:
                changed = {k: (v, d["hours"][k]) for k, v in d["day"].items() if v != d["hours"][k]}
                self.stdout.write(f"cluster {c.name}: {d['key']}: day row != its hours: {changed}")
            if not differences:
                self.stdout.write(f"{scope}: the rollups equal the detail rows")
            if not days:
                self.stdout.write(f"cluster {c.name}: the day rows equal their hours")
        if bad:
            raise CommandError(f"{bad} rollup rows differ from the detail rows (tco_rollups --rebuild makes them again)")
