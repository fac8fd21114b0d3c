"""An anomaly alert never wears the green of good news (fresh user, 2026-12-03: "engineering: 6 of 8 tasks of
sweep-review failed" came in the same green banner as "Campaign finished"). The notices' markup as
dashboards/templates/dashboards/anomaly_notices.html writes it, styled by the project's own tco.css, in Chromium."""
from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = [pytest.mark.browser]

CSS = (Path(__file__).resolve().parents[2] / "static" / "css" / "tco.css").read_text()
MARKUP = """<ul class="messages"><li class="success" id="finished">Campaign finished</li></ul>
<ul class="notices"><li class="anomaly anomaly-warning" id="warning"><span>Notice: x</span></li>
<li class="anomaly anomaly-critical" id="critical"><span>Alert: y</span></li></ul>"""


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_anomaly_alerts_are_amber_or_red_never_the_green_of_a_finished_campaign(browser, scheme):
    context = browser.new_context(color_scheme=scheme)
    try:
        page = context.new_page()
        page.set_content(f"<html><head><style>{CSS}</style></head><body>{MARKUP}</body></html>")
        colour = {i: page.eval_on_selector(f"#{i}", "e => getComputedStyle(e).backgroundColor")
                  for i in ("finished", "warning", "critical")}
        variable = {v: page.evaluate(f"getComputedStyle(document.documentElement).getPropertyValue('{v}').trim()")
                    for v in ("--ok-bg", "--warn-bg", "--bad-bg")}
        rgb = {v: page.evaluate("c => { const d = document.createElement('div'); d.style.background = c; "
                                "document.body.append(d); return getComputedStyle(d).backgroundColor; }", value)
               for v, value in variable.items()}
    finally:
        context.close()
    assert colour["finished"] == rgb["--ok-bg"]  # the good news stays green
    assert (colour["warning"], colour["critical"]) == (rgb["--warn-bg"], rgb["--bad-bg"]), (colour, rgb)
