"""The three users' journeys through a running tco, in Debian's Chromium, timed and counted.

    .venv/bin/python demo/journeys.py --url http://127.0.0.1:8000 --password "$(cat var/admin-password)"

Run against ``make demo`` (its logins: eng-lead, admin, launcher). Each journey is what a person
does, as a script: the clicks it takes (link and button presses, form fields filled are counted
apart) and the wall-clock seconds from the login page to the answer. Screenshots of each step go to
``--shots`` (var/test-output/journeys). A script reads pages faster than a person: the seconds are a
floor, the clicks are what a person needs at best.

- lead: this week's spend, the costliest campaign and its costliest task;
- admin: why a job is pending (triage, then "why is this pending?"), then act on it (its group's action,
  confirmed once: Release for make demo's paused nightly-eval) and see triage drop it without a reload;
- launcher: launch a campaign from the form and watch it on its page until its first task runs.
Prints one line per journey and a JSON summary. Needs Playwright and /usr/bin/chromium.
"""
from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path


class Walk:
    """One journey: counts clicks and fields, keeps screenshots, times from the start."""

    def __init__(self, page, name: str, shots: Path) -> None:
        self.page, self.name, self.shots = page, name, shots
        self.clicks = self.fields = self.step = 0
        self.started = time.monotonic()
        self.notes: list[str] = []

    def click(self, selector: str) -> None:
        self.page.locator(selector).first.click()
        self.clicks += 1
        self.page.wait_for_load_state("load")

    def fill(self, selector: str, value: str) -> None:
        self.page.fill(selector, value)
        self.fields += 1

    def shot(self, what: str) -> None:
        self.step += 1
        self.shots.mkdir(parents=True, exist_ok=True)
        self.page.screenshot(path=str(self.shots / f"{self.name}-{self.step}-{what}.png"), full_page=False)

    def result(self, answer: str) -> dict:
        return {"journey": self.name, "clicks": self.clicks, "fields": self.fields,
                "seconds": round(time.monotonic() - self.started, 1), "answer": answer, "notes": self.notes}


def login(walk: Walk, url: str, user: str, password: str) -> None:
    walk.page.goto(url + "/login/")
    walk.fill("#id_username", user)
    walk.fill("#id_password", password)
    walk.click("#login-submit")


def lead(page, url: str, password: str, shots: Path) -> dict:
    walk = Walk(page, "lead", shots)
    login(walk, url, "eng-lead", password)
    walk.shot("landing")
    walk.click('#tiles [data-tile="spend"]')  # today's spend, on the bill
    walk.click('#bill-presets [data-preset="this-week"]')
    walk.click('#bill-group-tabs [data-group="campaign"]')
    walk.shot("week-by-campaign")
    total = page.text_content('#bill-total td[data-col="cost_usd"]') or ""
    rows = page.eval_on_selector_all(
        "#bill tbody tr[data-key]",
        "rows => rows.map(r => [r.dataset.key, (r.querySelector('td[data-col=\"cost_usd\"]') || {}).textContent || ''])")
    costs: dict[str, float] = {}
    for key, cost in rows:
        number = re.sub(r"[^0-9.]", "", cost)
        costs[key] = costs.get(key, 0.0) + (float(number) if number else 0.0)
    if not costs:
        walk.notes.append("no campaign with spend this week")
        return walk.result("no spend this week")
    costliest = max(costs, key=costs.get)
    walk.click(f'#bill tbody tr[data-key="{costliest}"] a.campaign-page')  # its tasks, the costliest first
    walk.shot("campaign-tasks-by-cost")
    walk.click("#tasks tbody tr a")
    walk.shot("costliest-task")
    week = re.sub(r"\s+", " ", total).strip()
    return walk.result(f"week total: {week}; costliest campaign {costliest} (${costs[costliest]:.4f}); "
                       f"its costliest task: {page.url.rsplit('/', 2)[-2]}")


def admin(page, url: str, password: str, shots: Path) -> dict:
    walk = Walk(page, "admin", shots)
    login(walk, url, "admin", password)
    walk.shot("landing")
    if page.get_attribute('#tiles [data-tile="waiting"]', "href") != "/ops/triage/":
        walk.notes.append("the queued tile does not open triage")
    walk.click('#tiles [data-tile="waiting"]')
    walk.shot("triage")
    if not page.locator(".why-pending").count():
        return walk.result("nothing is pending")
    headline = (page.text_content("#triage-groups .group h3") or "").strip()
    # "Why is this pending?" on a job of the first group (the headline's), not whichever row is first.
    first_group = page.get_attribute("#triage-groups .group", "data-group")
    row_link = f'#triage tr[data-group="{first_group}"] .why-pending'
    walk.click(row_link if page.locator(row_link).count() else ".why-pending")
    page.wait_for_selector(".why-pending-answer", timeout=15000)
    walk.shot("why-pending")
    answer = re.sub(r"\s+", " ", page.text_content(".why-pending-answer") or "").strip()
    # Act on it: the first group that has an action (make demo's paused nightly-eval: Release), confirmed
    # once; then wait, without reloading, for triage to drop the group (it is live).
    group = page.locator("#triage-groups .group:has(form.group-action)").first
    if group.count():
        key = group.get_attribute("data-group")
        job = page.get_attribute(f'#triage tr[data-group="{key}"]', "data-job")
        label = re.sub(r"\s+", " ", group.locator("form.group-action button").text_content() or "").strip()
        walk.click(f'#triage-groups .group[data-group="{key}"] form.group-action button')
        walk.shot("confirm")
        walk.click("#confirm")
        acted = time.monotonic()
        walk.shot("acted")
        try:
            page.wait_for_selector(f'#triage-groups .group[data-group="{key}"]', state="detached", timeout=60000)
            walk.notes.append(f"{label}: the group left triage {time.monotonic() - acted:.1f} s after the "
                              "confirmation, without a reload")
            # The scheduler's side: job's row no longer lists held tasks (qstat polled, pushed live).
            page.wait_for_function("job => { const r = document.querySelector(`#triage tr[data-job=\"${job}\"]`);"
                                   " return !r || !/held:/.test(r.textContent); }", arg=job, timeout=60000)
            walk.notes.append(f"job {job}'s row shows no held task {time.monotonic() - acted:.1f} s after the "
                              "confirmation")
        except Exception:  # noqa: BLE001 - a group or a hold that stays is the finding
            walk.notes.append(f"{label}: job {job} still shown held on triage 60 s after the confirmation")
        walk.shot("after-action")
    return walk.result(f"{headline} | {answer[:300]}")


def launcher(page, url: str, password: str, shots: Path, watch_s: float) -> dict:
    walk = Walk(page, "launcher", shots)
    login(walk, url, "launcher", password)
    walk.click('header nav a[href="/ops/launch/"]')
    walk.shot("form")
    if page.is_visible("#use-example"):
        walk.click("#use-example")
    else:
        walk.fill('textarea[name="input_params"]', "\n".join(f"seed={n}" for n in range(1, 9)))
    walk.fill('input[name="name"]', f"journey-{int(time.time())}")
    walk.click("#launch-preview")
    walk.shot("forecast")
    walk.click("#launch-submit")
    if page.locator("#confirm").count():
        walk.click("#confirm")
    launched = time.monotonic()
    walk.notes.append(f"landed on {page.url.replace(url, '')}")
    deadline = time.monotonic() + watch_s
    seen = ""
    while time.monotonic() < deadline:
        seen = re.sub(r"\s+", " ", page.text_content("main") or "")
        if re.search(r"\brunning\b\D{0,40}[1-9]|\b[1-9]\d* running\b|\bdone\b\D{0,20}[1-9]", seen):
            break
        time.sleep(0.5)
    walk.shot("watching")
    walk.notes.append(f"first task seen running or done {time.monotonic() - launched:.1f} s after the launch")
    return walk.result(page.url.replace(url, ""))


def main() -> None:
    from playwright.sync_api import sync_playwright

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--password", required=True)
    parser.add_argument("--shots", type=Path, default=Path("var/test-output/journeys"))
    parser.add_argument("--viewport", default="1400x900")
    parser.add_argument("--watch-s", type=float, default=120.0)
    args = parser.parse_args()
    width, height = (int(x) for x in args.viewport.split("x"))
    results = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path="/usr/bin/chromium",
                                     args=["--headless", "--no-sandbox", "--disable-gpu"])
        # The launcher first: its campaign may still wait while the admin asks why.
        for journey in ("launcher", "admin", "lead"):
            context = browser.new_context(viewport={"width": width, "height": height}, is_mobile=width < 500,
                                          has_touch=width < 500)
            page = context.new_page()
            try:
                if journey == "launcher":
                    result = launcher(page, args.url, args.password, args.shots, args.watch_s)
                else:
                    result = {"lead": lead, "admin": admin}[journey](page, args.url, args.password, args.shots)
            except Exception as exc:  # noqa: BLE001 - a journey that breaks is itself the finding
                page.screenshot(path=str(args.shots / f"{journey}-failed.png"))
                result = {"journey": journey, "error": f"{type(exc).__name__}: {exc}"[:500], "url": page.url}
            results.append(result)
            print(json.dumps(result), flush=True)
            context.close()
        browser.close()
    print(json.dumps({"viewport": args.viewport, "journeys": results}, indent=1))


if __name__ == "__main__":
    main()
