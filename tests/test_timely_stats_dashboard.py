"""Why slow, on screen: the dashboard's statistics panel for real timely programs in real Chromium.

Two programs of the connector crate's examples run at once with statistics on: ``slow``, whose
``Sleepy`` operator sleeps for every message, and ``stuck``, whose ``Hold`` keeps a capability.
The page must show, for ``slow``, ``Sleepy`` first among the busy operators and the records per
second of its channels; for ``stuck``, the stalled state with its statistics beside it (nothing
busy); for a dataflow that sends no statistics, no panel at all. Screenshots of both programs go
to ``test-output`` (or ``TRACKER_SHOTS``).
"""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

import pytest
from playwright.sync_api import Browser, expect

from bench.timely import build, start_example
from tests.helpers import ADMIN_TOKEN, ServiceProcess, loop_then_stage, program_token, wait_for
from tests.test_dashboard import OUTPUT, WAIT_MS, browser, wait_js

pytestmark = pytest.mark.service(TRACKER_STALL_SECONDS="2")
__all__ = ["browser"]  # the fixture, shared with the dashboard's own tests


@pytest.fixture(scope="module")
def binaries() -> Path:
    """The examples, built once (debug; cargo's target directory is cached)."""
    return build(release=False)


def _stop(program: subprocess.Popen[str]) -> None:
    if program.poll() is None:
        program.kill()
    program.communicate(timeout=60)


def test_the_dashboard_shows_why_slow_beside_where_stuck(service: ServiceProcess, binaries: Path,
                                                          browser: Browser) -> None:
    names = {"slow": f"slow-{uuid.uuid4().hex[:6]}", "stuck": f"stuck-{uuid.uuid4().hex[:6]}"}
    token = program_token(service)
    programs = [
        start_example(binaries, "slow", ["-w", "4", "--name", names["slow"], "--rounds", "60", "--records", "25",
                                         "--sleep-ms", "30", "--round-ms", "200", "--statistics-ms", "500"],
                      url=service.url, token=token),
        start_example(binaries, "stuck", ["-w", "4", "--name", names["stuck"], "--hold-at", "3", "--holder", "2",
                                          "--hold-seconds", "20", "--rounds", "40", "--round-ms", "100",
                                          "--statistics-ms", "500"], url=service.url, token=token),
    ]
    try:
        with service.client() as client:
            ids = {example: wait_for(f"{example} registered", lambda name=name: [
                d["id"] for d in client.get("/v1/dataflows", params={"name": name}).json()] or None, timeout=60)[0]
                for example, name in names.items()}
            quiet = client.post("/v1/dataflows", json=loop_then_stage("no-statistics")).json()["id"]
        page = browser.new_page(viewport={"width": 1400, "height": 1800})
        errors: list[str] = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.goto(service.url + "/dashboard")
        page.fill("#token", ADMIN_TOKEN)
        page.click("#save-token")

        page.locator(f'#dataflows li[data-id="{ids["slow"]}"]').click(timeout=WAIT_MS)
        first = page.locator("#activity-operators tbody tr").first
        expect(first.locator("td").first).to_have_text("Sleepy #3", timeout=WAIT_MS)
        share = float(first.locator("td.share").inner_text().rstrip("%"))
        second = float(page.locator("#activity-operators tbody tr").nth(1).locator("td.share").inner_text().rstrip("%"))
        assert 5 <= share <= 100 and second < share / 5, (share, second)  # it sleeps, the others barely work
        channel = page.locator("#activity-channels tbody tr").first
        expect(channel.locator("td").first).to_contain_text("→", timeout=WAIT_MS)
        assert channel.locator("td.num").first.inner_text().endswith("/s")
        expect(page.locator("#activity-note")).to_contain_text("from 4 worker(s)")
        page.locator("#activity-panel").scroll_into_view_if_needed()
        OUTPUT.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(OUTPUT / "why-slow.png"), full_page=True)

        page.locator(f'#dataflows li[data-id="{ids["stuck"]}"]').click(timeout=WAIT_MS)
        expect(page.locator("#state")).to_contain_text("stalled", timeout=WAIT_MS)
        wait_js(page, "Number(document.querySelector('#activity-panel').dataset.reports) > 0")
        expect(page.locator("#activity-operators tbody tr").first).to_be_visible(timeout=WAIT_MS)
        expect(page.locator("#held tbody")).to_contain_text("Hold", timeout=WAIT_MS)
        page.screenshot(path=str(OUTPUT / "why-stuck.png"), full_page=True)

        page.locator(f'#dataflows li[data-id="{quiet}"]').click(timeout=WAIT_MS)
        expect(page.locator("#title")).to_contain_text(quiet, timeout=WAIT_MS)
        wait_js(page, "window.dashboard.frame !== null")
        page.wait_for_timeout(500)  # the panel's first answer (it polls as the frames do)
        assert page.locator("#activity-panel").is_hidden()
        assert not errors, errors
        page.close()
    finally:
        for program in programs:
            _stop(program)
