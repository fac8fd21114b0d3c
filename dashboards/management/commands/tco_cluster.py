"""The clusters (Grid Engine cells) tco watches: list them, add one, change one (docs/clusters.md).

    manage.py tco_cluster list
    manage.py tco_cluster add second --cell second --qmaster-port 6544 --execd-port 6545 [--sge-root R]
                              [--flavour sge8|ocs9] [--accounting-file PATH] [--time-zone ZONE]
    manage.py tco_cluster set second --time-zone Europe/Berlin

The default cluster (``TCO_CLUSTER_NAME``, from ``SGE_ROOT``/``SGE_CELL``) is made on first use;
every other one is added here (or in the Django admin). From then on tco polls, ingests and
launches on it; its submissions go to the submit worker of its own queue, ``submit.<name>``
(``scripts/services`` starts one per cluster).
"""
from __future__ import annotations

from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django.core.management.base import BaseCommand, CommandError

from dashboards.core.clusters import cluster_flavour, clusters_watched, submit_queue
from dashboards.models import Cluster
from schedulers.gridengine import flavours


class Command(BaseCommand):
    help = "List, add or change the clusters (Grid Engine cells) tco watches."

    def add_arguments(self, parser) -> None:
        parser.add_argument("action", choices=("list", "add", "set"))
        parser.add_argument("name", nargs="?")
        parser.add_argument("--sge-root")
        parser.add_argument("--cell")
        parser.add_argument("--qmaster-port", type=int)
        parser.add_argument("--execd-port", type=int)
        parser.add_argument("--flavour", choices=[f for f, _ in Cluster.FLAVOURS])
        parser.add_argument("--accounting-file")
        parser.add_argument("--time-zone")
        parser.add_argument("--names", action="store_true", help="list: the names only, one a line")

    def handle(self, *args, action: str, name: str | None, **o) -> None:
        if action == "list":
            for c in clusters_watched():
                if o["names"]:
                    self.stdout.write(c.name)
                    continue
                ports = f" ports {c.qmaster_port}/{c.execd_port}" if c.qmaster_port else ""
                self.stdout.write(f"{c.name}: {c.sge_root}/{c.sge_cell}{ports} {c.flavour} {c.time_zone}, "
                                  f"accounting {c.accounting_path}, submit queue {submit_queue(c)}")
            return
        if not name:
            raise CommandError(f"{action} needs the cluster's name")
        if o["time_zone"]:
            try:
                ZoneInfo(o["time_zone"])
            except (ZoneInfoNotFoundError, ValueError):
                raise CommandError(f"unknown time zone {o['time_zone']!r}") from None
        if action == "add":
            if Cluster.objects.filter(name=name).exists():
                raise CommandError(f"cluster {name!r} exists: change it with 'set'")
            sge_root = o["sge_root"] or "/var/lib/gridengine"
            cell = o["cell"] or name
            flavour = o["flavour"] or cluster_flavour(sge_root, cell)[0]
            cluster = Cluster(
                name=name, sge_root=sge_root, sge_cell=cell, flavour=flavour,
                accounting_path=o["accounting_file"] or flavours.defaults_for(flavour).accounting_path(sge_root, cell),
                time_zone=o["time_zone"] or "UTC", qmaster_port=o["qmaster_port"], execd_port=o["execd_port"])
            cluster.full_clean()
            cluster.save()
            self.stdout.write(f"cluster {name} added: cell {sge_root}/{cell}, {flavour}; its submissions go to "
                              f"queue {submit_queue(cluster)}")
            return
        cluster = Cluster.objects.filter(name=name).first()
        if cluster is None:
            raise CommandError(f"no cluster named {name!r}")
        changes = {"sge_root": o["sge_root"], "sge_cell": o["cell"], "qmaster_port": o["qmaster_port"],
                   "execd_port": o["execd_port"], "flavour": o["flavour"], "accounting_path": o["accounting_file"],
                   "time_zone": o["time_zone"]}
        for field, value in changes.items():
            if value is not None:
                setattr(cluster, field, value)
        cluster.full_clean()
        cluster.save()
        self.stdout.write(f"cluster {name} changed")
