"""The campaign control page's network policy form in Debian's Chromium (issue 17, item 4): a
launcher narrows a running campaign's network policy after confirming, sees the version in force,
and a change wider than the admins' ceiling is refused with its reason. Screenshots under
var/test-output/ops-netpolicy-*.png."""
from __future__ import annotations

import os

import pytest
import yaml

from dashboards.management.commands.tco_bootstrap import demo_ceiling
from dashboards.models import AuditEntry, Team
from execution.spool.network import NetworkPolicyFile
from tests.support.history import make_campaign

from tests.support.stack import TEST_OUTPUT
from tests.support.browser import login

pytestmark = [pytest.mark.browser, pytest.mark.integration]

os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")


def test_a_launcher_changes_a_running_campaigns_network_policy_with_confirmation(ops_stack, browser_page,
                                                                                 ops_logins):
    from dashboards.launch import spool

    page = browser_page
    campaign = make_campaign(team=Team.objects.get(project="research"), user=ops_logins["launcher"],
                             name="netpol-page", status="submitted", count=1)
    ceiling_network = yaml.safe_load(demo_ceiling(project="research"))["network_policies"]
    login(page, ops_stack, "launcher")
    page.goto(ops_stack.url + f"/ops/campaigns/{campaign.pk}/")
    assert "Version 0" in page.text_content("#network-policy-version")
    page.fill("#network-policy-text", yaml.safe_dump({"network_policies": ceiling_network}))
    page.click("#network-policy-submit")
    page.wait_for_selector("#confirm")
    page.screenshot(path=str(TEST_OUTPUT / "ops-netpolicy-confirm.png"), full_page=True)
    page.click("#confirm")
    page.wait_for_selector("ul.messages")
    assert "Version 1, changed" in page.text_content("#network-policy-version")
    written = NetworkPolicyFile.read(spool.spool_layout().network_policy_path(campaign.pk))
    assert (written.policy_version, written.network_policies, written.changed_by) == (1, ceiling_network, "launcher")
    page.screenshot(path=str(TEST_OUTPUT / "ops-netpolicy-changed.png"), full_page=True)

    wider = yaml.safe_load(yaml.safe_dump(ceiling_network))
    wider["model_api"]["endpoints"][0]["rules"].append({"allow": {"method": "GET", "path": "/v1/everything"}})
    page.fill("#network-policy-text", yaml.safe_dump({"network_policies": wider}))
    page.click("#network-policy-submit")
    page.click("#confirm")
    page.wait_for_selector("ul.messages")
    assert "rule GET /v1/everything is not allowed by the ceiling" in page.text_content("ul.messages")
    assert "Version 1, changed" in page.text_content("#network-policy-version")
    assert [e.ok for e in AuditEntry.objects.filter(action="network_policy").order_by("id")] == [True, False]
