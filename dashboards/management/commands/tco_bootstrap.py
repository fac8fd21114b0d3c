"""Create what a fresh installation needs: the cluster, the teams, the demo agent, an admin.

Idempotent: running it again changes nothing that exists (the admin password
is kept in ``<state dir>/admin-password``, mode 0600, and reused).
"""
from __future__ import annotations

import os
import secrets
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

from dashboards.core.clusters import cluster_get_default
from dashboards.models import AgentDefinition, ModelEndpoint, PolicyCeiling, Team
from dashboards.core.accounts import team_ensure
from dashboards.launch.spool import team_sweeps_dir

TEAMS = (("research", "research"), ("engineering", "engineering"))
STAND_IN_MODEL = "stand-in-review"  # the model id the demo's review agents ask the stand-in for
#: The registered endpoint of the demo's stand-in model (demo/demo_model.py), and its credential's name.
DEMO_ENDPOINT = "demo-stand-in"
DEMO_PROVIDER = "anthropic"


def demo_policy(*, read_only: list[str], host: str, port: int, provider: str, landlock: bool = False) -> str:
    """A demo sandbox policy (OpenShell schema): ``read_only`` paths, the work directory and a
    private /tmp writable, the sandbox identity, and one rule: POST /v1/messages on ``host:port``
    with the credential of ``provider`` bound by the proxy, for the agents' interpreter."""
    agent_python = os.path.realpath(settings.TCO_RUNNER_PYTHON)
    return (
        "version: 1\n"
        "filesystem_policy:\n"
        "  include_workdir: true\n"
        f"  read_only: [{', '.join(read_only)}]\n"
        "  read_write: [/sandbox, /tmp]\n"
        + ("landlock: {compatibility: best_effort}\n" if landlock else "")
        + "process: {run_as_user: sandbox, run_as_group: sandbox}\n"
        "network_policies:\n"
        "  model_api:\n"
        "    endpoints:\n"
        f"      - host: {host}\n"
        f"        port: {port}\n"
        "        protocol: rest\n"
        "        enforcement: enforce\n"
        f"        credential_binding: {{provider: {provider}}}\n"
        "        rules: [{allow: {method: POST, path: /v1/messages}}]\n"
        f"    binaries: [{{path: {agent_python}}}]\n"
    )


def demo_model_host() -> str:
    """The IPv4 address the demo's stand-in model listens on and its endpoint names: where the
    runners on the execution hosts reach the master (``schedulers.hosts.master_address``; the
    master's bridge address with execution hosts in namespaces, 127.0.0.1 on a single-host
    cluster), or 127.0.0.1 when the cell's ``act_qmaster`` cannot be read or resolved."""
    from schedulers.hosts import master_address

    try:
        return master_address(settings.SGE_ROOT, settings.SGE_CELL)
    except OSError:
        return "127.0.0.1"


#: The demo stand-in's port before it became privileged (SECURITY.md, F4); untouched entries move.
OLD_DEMO_MODEL_PORT = 8793


def demo_ceiling(host: str | None = None, port: int | None = None, *, project: str) -> str:
    """The policy ceiling of the demo team ``project``: what the demo agent (the runner's default
    policy) and the sweep's review agents (demo/sweep.py review_policy) need, and no more: system
    directories, tco's demo code and venv, the team's own sweep runs (:func:`team_sweeps_dir`,
    never another team's) read-only; the work directory and /tmp writable; POST /v1/messages on
    the stand-in model only, with its credential. ``host``: the model's address,
    :func:`demo_model_host` when None; ``port``: its port, ``TCO_DEMO_MODEL_PORT`` when None."""
    import sys

    read_only = ["/usr", "/lib", "/lib64", "/bin", "/etc", str(Path(settings.BASE_DIR) / "demo"), sys.prefix,
                 str(team_sweeps_dir(project))]
    return demo_policy(read_only=read_only, host=host or demo_model_host(), port=port or settings.TCO_DEMO_MODEL_PORT,
                       provider=DEMO_PROVIDER)


def demo_agent_command() -> list[str]:
    """argv of the bundled demo agent; the runner fills ``{input}`` and ``{workdir}``."""
    return [settings.TCO_RUNNER_PYTHON, "-m", "demo.demo_agent", "{input}", "{workdir}"]


class Command(BaseCommand):
    help = ("Create the cluster record and an admin login, and (unless --no-demo) the demo teams research and "
            "engineering, the demo agent, the stand-in model endpoint and the demo policy ceilings.")

    def add_arguments(self, parser):
        parser.add_argument("--admin", default="admin", help="user name of the admin login (default admin)")
        parser.add_argument("--no-demo", action="store_true",
                            help="a site's installation: only the cluster record and the admin; no demo teams, "
                                 "demo agent, stand-in model endpoint, demo price or demo policy ceilings")

    def handle(self, *args, **options):
        cluster = cluster_get_default()
        if not options["no_demo"]:
            self._demo()

        password_file = Path(settings.STATE_DIR) / "admin-password"
        User = get_user_model()
        user = User.objects.filter(username=options["admin"]).first()
        try:
            recorded = password_file.read_text().strip()
        except OSError:
            recorded = ""
        # The file is what the demo prints: keep it true. A new admin, or one
        # whose password no longer matches the file, gets a fresh password.
        if user is None or not recorded or not user.check_password(recorded):
            password = os.environ.get("TCO_ADMIN_PASSWORD") or secrets.token_urlsafe(12)
            if user is None:
                User.objects.create_superuser(options["admin"], email="", password=password)
            else:
                user.set_password(password)
                user.save(update_fields=["password"])
            password_file.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(password_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(password + "\n")
        teams = "no demo teams" if options["no_demo"] else "demo teams research and engineering"
        self.stdout.write(f"cluster {cluster.name}, {teams}, admin login "
                          f"{options['admin']} (password in {password_file})")

    def _demo(self) -> None:
        """The demo teams, agent, price, stand-in endpoint and the teams' policy ceilings."""
        for name, project in TEAMS:
            team_ensure(name=name, project=project)
        AgentDefinition.objects.get_or_create(
            name="demo-agent",
            version=1,
            defaults={
                "description": "Bundled stand-in agent: reads its input, thinks for a few seconds, writes a result.",
                "command": demo_agent_command(),
                "input_kind": "params",
                "timeout_s": 600,
            },
        )
        # The stand-in model's price: invented, so the demo shows metering and
        # bills end to end. Real models are priced in the admin (Model prices).
        import datetime as dt
        from decimal import Decimal

        from dashboards.models import ModelPrice

        ModelPrice.objects.get_or_create(
            model=STAND_IN_MODEL,
            effective_from=dt.date(2026, 1, 1),
            defaults={
                "input_per_mtok": Decimal("3"), "output_per_mtok": Decimal("15"),
                "cache_read_per_mtok": Decimal("0.30"), "cache_write_5m_per_mtok": Decimal("3.75"),
                "cache_write_1h_per_mtok": Decimal("6"),
                "note": "hypothetical price of the stand-in model (demo/demo_model.py), for the demo only",
            },
        )
        # The stand-in model's endpoint and the demo teams' policy ceilings (issue 11): the only
        # endpoint a demo runner gives a credential to, and the most a demo campaign may allow.
        host = demo_model_host()
        ModelEndpoint.objects.get_or_create(
            name=DEMO_ENDPOINT,
            defaults={"provider": DEMO_PROVIDER, "scheme": "http", "host": host,
                      "port": settings.TCO_DEMO_MODEL_PORT, "path_prefixes": ["/v1/"],
                      "credential_name": DEMO_ENDPOINT})
        shared_sweeps = str(Path(settings.STATE_DIR) / "sweeps")
        for team in Team.objects.filter(project__in=[p for _, p in TEAMS]):
            PolicyCeiling.objects.get_or_create(team=team, defaults={
                "policy": demo_ceiling(host, project=team.project),
                "note": "tco_bootstrap: what the demo and review agents need"})
            # Untouched demo ceilings of earlier installs move to this one: made on a single-host
            # cluster (the runners in namespaces no longer reach 127.0.0.1 of the master), with the
            # stand-in on the unprivileged 8793 (any local account could bind it once the stand-in
            # stopped: SECURITY.md, F4), or listing every team's sweeps (<state>/sweeps).
            own = str(team_sweeps_dir(team.project))
            earlier = {demo_ceiling(h, p, project=team.project).replace(own, shared)
                       for h in ("127.0.0.1", host) for p in (OLD_DEMO_MODEL_PORT, settings.TCO_DEMO_MODEL_PORT)
                       for shared in (own, shared_sweeps)}
            earlier.discard(demo_ceiling(host, project=team.project))
            PolicyCeiling.objects.filter(team=team, policy__in=earlier).update(
                policy=demo_ceiling(host, project=team.project))
        if host != "127.0.0.1":
            ModelEndpoint.objects.filter(name=DEMO_ENDPOINT, host="127.0.0.1").update(host=host)
        if settings.TCO_DEMO_MODEL_PORT != OLD_DEMO_MODEL_PORT:
            ModelEndpoint.objects.filter(name=DEMO_ENDPOINT, port=OLD_DEMO_MODEL_PORT).update(
                port=settings.TCO_DEMO_MODEL_PORT)
