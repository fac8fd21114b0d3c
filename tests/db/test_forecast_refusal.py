"""The launch page's forecast runs the launch's own checks (issue 24, the users' day): a policy the
runner's validator accepts but Launch refuses (a path outside the ceiling) was forecast with a Launch
button, and refused only on Launch."""
from __future__ import annotations

import html as html_lib

import pytest

from dashboards.core.errors import LaunchError
from dashboards.launch.service import launch
from dashboards.models import AuditEntry, Campaign
from tests.support.forms import launch_data

pytestmark = [pytest.mark.django_db]

POLICY = "version: 1\nfilesystem_policy: {read_only: [/proc/1/root]}\n"


def test_the_forecast_says_the_refusal_launch_gives_and_offers_no_launch(as_user, ops_users):
    client = as_user("launcher")
    audited = AuditEntry.objects.count()
    page = html_lib.unescape(client.post("/ops/launch/", {**launch_data(policy=POLICY), "preview": "1"})
                             .content.decode())
    assert 'id="forecast"' in page and 'id="launch-submit"' not in page
    refusal = page.split('id="launch-refusal">', 1)[1].split("</p>", 1)[0]
    assert refusal.startswith("Launch would refuse this: sandbox policy wider than allowed: ")
    assert "outside the ceiling's paths" in refusal
    assert AuditEntry.objects.count() == audited  # the forecast audits nothing
    # The launch, through the service and through the page, refuses with the same words.
    form = client.post("/ops/launch/", {**launch_data(policy=POLICY), "launch": "1"})
    with pytest.raises(LaunchError) as caught:
        launch(user=ops_users["launcher"], request=form.context["form"].launch_request())
    assert refusal == f"Launch would refuse this: {caught.value}"
    assert str(caught.value) in html_lib.unescape(form.content.decode())
    assert not Campaign.objects.filter(name="sweep-1").exists()


def test_a_forecast_without_a_name_is_not_refused_for_it(as_user):
    page = as_user("launcher").post("/ops/launch/", {**launch_data(name=""), "preview": "1"}).content.decode()
    assert 'id="launch-refusal"' not in page and 'id="launch-submit"' in page
