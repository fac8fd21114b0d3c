"""Fresh attack A7 (issue 23): launchers read every agent definition's command line on the agent
registry page (paths, flags, a site's internals). They choose an agent by its name, version, input
kind and model; the command is the admins'."""
from __future__ import annotations

import pytest

from dashboards.models import AgentDefinition

pytestmark = [pytest.mark.django_db]

SECRET_FLAG = "--site-internal=/srv/secret-tree"


@pytest.fixture
def registered(ops_users):
    return AgentDefinition.objects.create(name="solver", version="3", command=["/opt/solver/bin/run", SECRET_FLAG],
                                          input_kind="params", timeout_s=60)


@pytest.mark.parametrize("role", ["launcher", "urgent"])
def test_a_launcher_sees_the_agents_but_not_their_commands(as_user, registered, role):
    response = as_user(role).get("/ops/agents/")
    html = response.content.decode()
    assert response.status_code == 200
    assert "solver" in html and ">3<" in html                     # the agent itself is listed
    assert SECRET_FLAG not in html and "/opt/solver/bin/run" not in html
    assert "<th>Command</th>" not in html and "agent-form" not in html


def test_an_admin_sees_and_edits_the_command(as_user, registered):
    html = as_user("admin").get("/ops/agents/").content.decode()
    assert f"/opt/solver/bin/run {SECRET_FLAG}" in html and "<th>Command</th>" in html and "agent-form" in html
    edit = as_user("admin").get(f"/ops/agents/?edit={registered.pk}").content.decode()
    assert SECRET_FLAG in edit
