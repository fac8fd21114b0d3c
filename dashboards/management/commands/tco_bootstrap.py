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

from dashboards.clusters import cluster_get_default
from dashboards.models import AgentDefinition, ModelEndpoint, PolicyCeiling, Team
from dashboards.services import team_ensure

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


def demo_ceiling(host: str | None = None, port: int | None = None) -> str:
    """The policy ceiling of the demo teams: what the demo agent (the runner's default policy) and
    the sweep's review agents (demo/sweep.py review_policy) need, and no more: system directories,
    tco's demo code and venv, the sweeps' run directories read-only; the work directory and /tmp
    writable; POST /v1/messages on the stand-in model only, with its credential. ``host``: the
    model's address, :func:`demo_model_host` when None; ``port``: its port, ``TCO_DEMO_MODEL_PORT``
    when None."""
    import sys

    read_only = ["/usr", "/lib", "/lib64", "/bin", "/etc", str(Path(settings.BASE_DIR) / "demo"), sys.prefix,
                 str(Path(settings.STATE_DIR) / "sweeps")]
    return demo_policy(read_only=read_only, host=host or demo_model_host(), port=port or settings.TCO_DEMO_MODEL_PORT,
                       provider=DEMO_PROVIDER)


def demo_agent_command() -> list[str]:
    """argv of the bundled demo agent; the runner fills ``{input}`` and ``{workdir}``."""
    return [settings.TCO_RUNNER_PYTHON, "-m", "demo.demo_agent", "{input}", "{workdir}"]


class Command(BaseCommand):
    help = "Create the cluster record, the research and engineering teams, the demo agent and an admin login."

    def add_arguments(self, parser):
        parser.add_argument("--admin", default="admin", help="user name of the admin login (default admin)")

    def handle(self, *args, **options):
        cluster = cluster_get_default()
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
        ModelEndpoint.objects.get_or_create(
            name=DEMO_ENDPOINT,
            defaults={"provider": DEMO_PROVIDER, "scheme": "http", "host": demo_model_host(),
                      "port": settings.TCO_DEMO_MODEL_PORT, "path_prefixes": ["/v1/"],
                      "credential_name": DEMO_ENDPOINT})
        for team in Team.objects.filter(project__in=[p for _, p in TEAMS]):
            PolicyCeiling.objects.get_or_create(team=team, defaults={
                "policy": demo_ceiling(), "note": "tco_bootstrap: what the demo and review agents need"})
        # Made on a single-host cluster, then the cell got execution hosts in namespaces: the
        # runners no longer reach 127.0.0.1 of the master. Only the untouched demo entries move.
        host = demo_model_host()
        if host != "127.0.0.1":
            ModelEndpoint.objects.filter(name=DEMO_ENDPOINT, host="127.0.0.1").update(host=host)
            PolicyCeiling.objects.filter(team__project__in=[p for _, p in TEAMS],
                                         policy=demo_ceiling("127.0.0.1")).update(policy=demo_ceiling(host))
        # Made when the stand-in's port was the unprivileged 8793, which any local account could
        # bind once the stand-in stopped (SECURITY.md, F4): the untouched demo entries move too.
        port = settings.TCO_DEMO_MODEL_PORT
        if port != OLD_DEMO_MODEL_PORT:
            ModelEndpoint.objects.filter(name=DEMO_ENDPOINT, port=OLD_DEMO_MODEL_PORT).update(port=port)
            PolicyCeiling.objects.filter(team__project__in=[p for _, p in TEAMS],
                                         policy=demo_ceiling(host, OLD_DEMO_MODEL_PORT)).update(policy=demo_ceiling(host))
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
        self.stdout.write(f"cluster {cluster.name}, teams research and engineering, admin login "
                          f"{options['admin']} (password in {password_file})")
