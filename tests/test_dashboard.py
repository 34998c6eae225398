"""The built-in dashboard in real headless Chromium against the real service.

Debian's ``chromium`` is driven by Playwright's Python package (``executable_path``; no browser
is downloaded). The test enters the token like a user, opens a running dataflow, checks the
graph is drawn, posts progress over REST and watches the frontier change on screen (in the
graph's port labels and in the frontier table), then saves a screenshot to
``test-output/dashboard.png``. Every request the page makes must go to the service itself:
the assets are vendored, so the dashboard works offline.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

from tests.helpers import ADMIN_TOKEN, ROOT, ServiceProcess, loop_graph, register, update

# The service with fast Delta compaction, so the history route has rows to show.
pytestmark = pytest.mark.service(TRACKER_FLUSH_SECONDS="0.2", TRACKER_COMPACT_SECONDS="0.3")

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
OUTPUT = ROOT / "test-output"
WAIT_MS = 15_000  # every on-screen wait is bounded


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """Debian's Chromium, headless; fails (not skips) when it is missing: bin/test installs it."""
    if not shutil.which(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: run bin/test (it installs it) or `apt-get install -y chromium "
                    "chromium-driver`", pytrace=False)
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


class Example:
    """A running example: a three-operator loop fed by an input whose capability advances."""

    def __init__(self, service: ServiceProcess) -> None:
        self.service = service
        self.id, self.token = register(service, loop_graph(3, name="dashboard-loop"))
        self.seq = 0
        self.epoch = 0

    def advance(self) -> None:
        """The input moves its capability to the next epoch (one progress batch over REST)."""
        with self.service.client(self.token) as client:
            answer = client.post(f"/v1/dataflows/{self.id}/progress", json={
                "worker": "input", "seq": self.seq,
                "updates": [update(0, 0, "source", [self.epoch], -1), update(0, 0, "source", [self.epoch + 1], 1)]})
        assert answer.status_code == 200, answer.text
        self.seq += 1
        self.epoch += 1

    def wait_for_delta(self, version: int, timeout: float = 15.0) -> None:
        """Until the service's periodic compaction has put ``version`` into ``frontier_changes``."""
        deadline = time.monotonic() + timeout
        with self.service.client(self.token) as client:
            while time.monotonic() < deadline:
                rows = client.get(f"/dashboard/api/dataflows/{self.id}/history").json()["frontier_changes"]
                if any(r["version"] >= version for r in rows):
                    return
                time.sleep(0.1)
        raise AssertionError(f"version {version} did not reach the Delta tables within {timeout}s")


def wait_js(page: Page, expression: str, arg: Any = None, timeout_ms: int = WAIT_MS) -> None:
    """Until the JavaScript ``expression`` (or function of ``arg``) is truthy in the page.

    Polled with ``page.evaluate`` rather than ``page.wait_for_function``, whose polling runs
    the predicate through ``eval`` inside the page, which the service's Content-Security-Policy
    (``script-src 'self'``, no ``unsafe-eval``) refuses."""
    deadline = time.monotonic() + timeout_ms / 1000
    while not page.evaluate(expression, arg):
        if time.monotonic() > deadline:
            raise AssertionError(f"not true within {timeout_ms} ms: {expression}")
        time.sleep(0.1)


def frontier_cell(page: Page, loc: str) -> Any:
    """The frontier table's cell of location ``node:port:kind``."""
    return page.locator(f'#frontiers tr[data-loc="{loc}"] td.frontier')


def graph_label(page: Page, port_id: str) -> str:
    """The label Cytoscape draws on a port (e.g. ``in 0 {(2)}``)."""
    return page.evaluate("(id) => window.dashboard.cy.getElementById(id).data('label')", port_id)


def test_token_is_asked_once_and_refused_tokens_are_reported(service: ServiceProcess, browser: Browser) -> None:
    page = browser.new_page()
    page.goto(service.url + "/")  # the home page redirects to the dashboard
    assert page.url == service.url + "/dashboard"
    expect(page.locator("#login")).to_be_visible(timeout=WAIT_MS)
    page.fill("#token", "not-a-token")
    page.click("#save-token")
    expect(page.locator("#login-error")).to_contain_text("401", timeout=WAIT_MS)
    page.fill("#token", ADMIN_TOKEN)
    page.click("#save-token")
    expect(page.locator("#app")).to_be_visible(timeout=WAIT_MS)
    page.reload()  # kept in localStorage: no second prompt
    expect(page.locator("#app")).to_be_visible(timeout=WAIT_MS)
    assert page.locator("#login").is_hidden()
    page.close()


def test_live_graph_frontiers_plots_and_screenshot(service: ServiceProcess, browser: Browser) -> None:
    example = Example(service)
    example.advance()  # epoch 0 done before the page opens: the plots get history from Delta
    example.wait_for_delta(1)
    page = browser.new_page(viewport={"width": 1400, "height": 1250})
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    requested: list[str] = []
    page.on("request", lambda request: requested.append(request.url))

    page.goto(service.url + "/dashboard")
    page.fill("#token", ADMIN_TOKEN)
    page.click("#save-token")
    page.locator(f'#dataflows li[data-id="{example.id}"]').click(timeout=WAIT_MS)

    # The graph: 4 operators (compound nodes), 8 ports, 4 edges and 4 internal connections,
    # one of which advances time (the loop), all drawn on Cytoscape's canvas.
    wait_js(page, "window.dashboard.cy && window.dashboard.cy.nodes('.port').length === 8")
    counts = page.evaluate("""() => { const cy = window.dashboard.cy; return {
        operators: cy.nodes('.operator').length, edges: cy.edges('.edge').length,
        internal: cy.edges('.internal').length, loops: cy.edges('.loop').map(e => e.data('label')) }; }""")
    assert counts == {"operators": 4, "edges": 4, "internal": 4, "loops": ["+(1)"]}
    assert page.locator("#graph canvas").count() >= 1
    # Something is really painted: Cytoscape's own PNG export of the drawing is far from blank.
    assert page.evaluate("window.dashboard.cy.png({full: true}).length") > 10_000

    # The live frontier as of the first batch: the input holds epoch 1; op2's input sees 1 and
    # op1's loop input sees 2 (the feedback adds one).
    expect(frontier_cell(page, "2:0:target")).to_have_text("{(1)}", timeout=WAIT_MS)
    wait_js(page, "window.dashboard.cy.getElementById('t-1-0').data('label') === 'in 0 {(2)}'")
    # What holds op2's input back: the input operator's capability at epoch 1.
    expect(page.locator('#held tr[data-loc="2:0:target"]')).to_contain_text("1 × (0,0,source)@(1)", timeout=WAIT_MS)

    # Progress posted now must show up on screen through the SSE stream, without a reload.
    example.advance()
    expect(frontier_cell(page, "2:0:target")).to_have_text("{(2)}", timeout=WAIT_MS)
    wait_js(page, "window.dashboard.cy.getElementById('t-2-0').data('label') === 'in 0 {(2)}'")
    wait_js(page, "window.dashboard.cy.getElementById('t-1-0').data('label') === 'in 0 {(3)}'")
    expect(page.locator('#held tr[data-loc="2:0:target"]')).to_contain_text("(0,0,source)@(2)", timeout=WAIT_MS)
    expect(page.locator("#status")).to_contain_text("version 2", timeout=WAIT_MS)

    # Clicking a port explains it.
    page.locator('#held tr[data-loc="3:0:target"]').click()
    expect(page.locator("#explain")).to_contain_text("Not safe yet", timeout=WAIT_MS)

    # Epochs plot (one series per operator: its inputs' earliest open epoch): history replayed
    # from Delta plus live samples, epochs rising to 2 for op2.
    wait_js(page, "(() => { const s = window.dashboard.series; "
                           "return s.ys[s.keys.indexOf('2')].includes(2); })()")
    series = page.evaluate("() => window.dashboard.series")
    op2 = series["keys"].index("2")
    assert next(y for y in series["ys"][op2] if y is not None) == 0  # from version 0, before the page opened
    assert max(y for y in series["ys"][op2] if y is not None) == 2
    assert series["x"] == sorted(series["x"])
    assert page.locator("#frontier-plot canvas").count() == 1 and page.locator("#throughput-plot canvas").count() == 1
    # Throughput plot: Delta history (1 batch in its second) and live samples from version polling.
    for _ in range(3):
        example.advance()
    wait_js(page, "window.dashboard.rate.batches.some((b, i) => i > 0 && b > 0)")
    expect(frontier_cell(page, "2:0:target")).to_have_text("{(5)}", timeout=WAIT_MS)

    OUTPUT.mkdir(exist_ok=True)
    shot = OUTPUT / "dashboard.png"
    page.wait_for_timeout(1600)  # let the "just changed" highlight fade, so the picture shows the steady state
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 20_000
    assert errors == [], errors
    foreign = [url for url in requested if not url.startswith(service.url)]
    assert foreign == [], f"the dashboard must work offline, but it fetched {foreign}"
    page.close()


def _edge(src: tuple[int, int], dst: tuple[int, int]) -> dict[str, Any]:
    return {"source": {"node": src[0], "port": src[1]}, "target": {"node": dst[0], "port": dst[1]}}


def nested_loops() -> dict[str, Any]:
    """input 0 -> iterative scope 1 (step 1, an iterative scope 2 (work 1) inside, feedback 3) -> after 2."""
    inner = {"kind": "iterative", "nodes": [{"id": 1, "name": "work", "inputs": 1, "outputs": 1}],
             "edges": [_edge((0, 0), (1, 0)), _edge((1, 0), (0, 0))]}
    loop = {"kind": "iterative",
            "nodes": [{"id": 1, "name": "step", "inputs": 2, "outputs": 1},
                      {"id": 2, "name": "rounds", "inputs": 1, "outputs": 1, "scope": inner},
                      {"id": 3, "name": "feedback", "inputs": 1, "outputs": 1,
                       "connections": [{"input": 0, "output": 0, "summaries": [[0, 1]]}]}],
            "edges": [_edge((0, 0), (1, 0)), _edge((1, 0), (2, 0)), _edge((2, 0), (3, 0)), _edge((3, 0), (1, 1)),
                      _edge((2, 0), (0, 0))]}
    return {"name": "dashboard-nested", "nodes": [
        {"id": 0, "name": "input", "inputs": 0, "outputs": 1},
        {"id": 1, "name": "loop", "inputs": 1, "outputs": 1, "scope": loop},
        {"id": 2, "name": "after", "inputs": 1, "outputs": 0}],
        "edges": [_edge((0, 0), (1, 0)), _edge((1, 0), (2, 0))]}


def test_a_nested_dataflow_is_drawn_with_its_scopes(service: ServiceProcess, browser: Browser) -> None:
    dataflow, token = register(service, nested_loops())
    page = browser.new_page(viewport={"width": 1400, "height": 1100})
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    page.goto(service.url + "/dashboard")
    page.fill("#token", ADMIN_TOKEN)
    page.click("#save-token")
    page.locator(f'#dataflows li[data-id="{dataflow}"]').click(timeout=WAIT_MS)
    # Ports: root 1 + 2 + 1, scope [1]: 2 boundary + 3 + 2 + 2, scope [1,2]: 2 boundary + 2.
    wait_js(page, "window.dashboard.cy && window.dashboard.cy.nodes('.port').length === 17")
    drawn = page.evaluate("""() => { const cy = window.dashboard.cy; return {
        scopes: cy.nodes('.scope').map(n => [n.id(), n.data('label')]),
        parent: cy.getElementById('op-1_2-1').parent().id(), crossing: cy.edges('.crossing').length}; }""")
    assert drawn["scopes"] == [["op-1", "loop #1 · iterative · in 0→out 0 +(0)"],
                               ["op-1-2", "rounds #2 · iterative · in 0→out 0 +(0, 0)"]]
    assert drawn["parent"] == "op-1-2" and drawn["crossing"] == 4  # an ingress and an egress per scope
    # Frontiers inside a scope, in its own time: the input's capability at (0) is (0, 0, 0) inside both loops.
    expect(frontier_cell(page, "1,2/1:0:target")).to_have_text("{(0, 0, 0)}", timeout=WAIT_MS)
    expect(frontier_cell(page, "1/1:1:target")).to_have_text("{(0, 1)}", timeout=WAIT_MS)
    with service.client(token) as client:
        assert client.post(f"/v1/dataflows/{dataflow}/progress", json={"worker": "w", "seq": 0, "updates": [
            update(0, 0, "source", [0], -1), update(0, 0, "source", [3], 1),
            {"location": {"scope": [1, 2], "node": 1, "port": 0, "kind": "source"}, "time": [1, 4, 2], "delta": 1},
        ]}).status_code == 200
    expect(frontier_cell(page, "2:0:target")).to_have_text("{(1)}", timeout=WAIT_MS)
    expect(frontier_cell(page, "1/1:1:target")).to_have_text("{(1, 5), (3, 1)}", timeout=WAIT_MS)
    wait_js(page, "window.dashboard.cy.getElementById('t-1-1-in-1').data('label') === 'in 1 {(1, 5), (3, 1)}'")
    page.locator('#frontiers tr[data-loc="2:0:target"]').click(timeout=WAIT_MS)
    expect(page.locator("#explain")).to_contain_text("[1,2](1,0,source)", timeout=WAIT_MS)
    expect(page.locator('#held tr[data-loc="2:0:target"]')).to_contain_text("[1,2](1,0,source)@(1, 4, 2)",
                                                                           timeout=WAIT_MS)
    OUTPUT.mkdir(exist_ok=True)
    page.wait_for_timeout(1600)
    page.screenshot(path=str(OUTPUT / "dashboard-scopes.png"), full_page=True)
    # Collapsing the inner scope hides its inside and keeps its own ports; opening it shows it again.
    page.evaluate("() => window.dashboard.cy.getElementById('op-1-2').emit('tap')")
    hidden = page.evaluate("() => [window.dashboard.cy.getElementById('op-1_2-1').visible(), "
                           "window.dashboard.cy.getElementById('t-2-0-in-1').visible()]")
    assert hidden == [False, True]
    page.screenshot(path=str(OUTPUT / "dashboard-scopes-collapsed.png"), full_page=True)
    page.evaluate("() => window.dashboard.cy.getElementById('op-1-2').emit('tap')")
    assert page.evaluate("() => window.dashboard.cy.getElementById('op-1_2-1').visible()")
    assert errors == [], errors
    page.close()


def test_a_running_worker_example_is_drawn_and_moves_on_screen(service: ServiceProcess, browser: Browser) -> None:
    """The real thing: `tracker example components` (worker processes over the WebSocket link)
    runs against the service while the page watches; its frontiers must move on screen."""
    import os
    import signal
    import subprocess
    import sys

    with service.client() as client:
        before = {d["id"] for d in client.get("/v1/dataflows").json()}
    env = {**os.environ, "TRACKER_ADMIN_TOKEN": ADMIN_TOKEN}
    example = subprocess.Popen(
        [sys.executable, "-m", "tracker.cli", "example", "components", "--url", service.url, "--workers", "2",
         "--epochs", "5000", "--delay", "0.02", "--timeout", "120"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True)  # its own process group: the worker processes are ended with it
    try:
        deadline = time.monotonic() + 30
        new: list[dict[str, Any]] = []
        while not new and time.monotonic() < deadline:
            with service.client() as client:
                new = [d for d in client.get("/v1/dataflows").json() if d["id"] not in before]
            time.sleep(0.1)
        assert new, "the example did not register its dataflow within 30 s"
        dataflow_id = new[0]["id"]
        page = browser.new_page(viewport={"width": 1400, "height": 1250})
        page.goto(service.url + "/dashboard")
        if page.locator("#login").is_visible():
            page.fill("#token", ADMIN_TOKEN)
            page.click("#save-token")
        page.locator(f'#dataflows li[data-id="{dataflow_id}"]').click(timeout=WAIT_MS)
        # edges, the loop scope (a compound node holding cc and the feedback), sink.
        wait_js(page, "window.dashboard.cy && window.dashboard.cy.nodes('.operator').length === 5 "
                               "&& window.dashboard.cy.nodes('.scope').length === 1")
        assert page.evaluate("window.dashboard.cy.edges('.loop').length") >= 1  # the feedback loop is drawn
        status = page.locator("#status")
        expect(status).to_contain_text("version", timeout=WAIT_MS)
        first = status.inner_text()
        # The workers keep reporting progress: the version shown must move without a reload.
        wait_js(page, "(t) => document.querySelector('#status').innerText !== t", first)
        page.screenshot(path=str(OUTPUT / "dashboard-example.png"), full_page=True)
        page.close()
    finally:
        os.killpg(example.pid, signal.SIGKILL)
        example.wait(timeout=10)


def test_history_route_uses_the_same_auth(service: ServiceProcess) -> None:
    example = Example(service)
    other = Example(service)
    route = f"{service.url}/dashboard/api/dataflows/{example.id}/history"
    assert httpx.get(route).status_code == 401
    assert httpx.get(route, headers={"Authorization": f"Bearer {other.token}"}).status_code == 403
    answer = httpx.get(route, headers={"Authorization": f"Bearer {example.token}"})
    assert answer.status_code == 200 and answer.json()["delta"] is True


def test_open_metrics_name_no_dataflow_by_default(service: ServiceProcess) -> None:
    """``/metrics`` needs no token: without ``--metrics-per-dataflow`` it aggregates, naming no
    dataflow (the labelled gauges are in tests/test_api_lag.py)."""
    Example(service).advance()
    with service.client() as client:
        ids = [d["id"] for d in client.get("/v1/dataflows").json()]
    text = httpx.get(service.url + "/metrics").text
    assert ids and not [i for i in ids if i in text] and "dataflow=" not in text
    assert "tracker_frontier_lag_seconds{" not in text
    lag = float(text.split("\ntracker_frontier_lag_max_seconds ")[1].split()[0])
    assert lag > 0  # the example's operators wait for its input


def open_dashboard(service: ServiceProcess, browser: Browser, path: str = "/dashboard", **viewport: int
                   ) -> tuple[Page, list[str]]:
    """A new page on the dashboard, logged in with the admin token; the list collects console
    errors, page errors and failed (4xx/5xx) responses."""
    page = browser.new_page(viewport={"width": 1400, "height": 1250, **viewport})
    problems: list[str] = []
    page.on("pageerror", lambda error: problems.append(str(error)))
    page.on("console", lambda msg: problems.append(msg.text) if msg.type == "error" else None)
    page.on("response", lambda r: problems.append(f"{r.status} {r.url}") if r.status >= 400 else None)
    page.goto(service.url + path)
    page.fill("#token", ADMIN_TOKEN)
    page.click("#save-token")
    expect(page.locator("#app")).to_be_visible(timeout=WAIT_MS)
    return page, problems


def test_a_stalled_dataflow_shows_its_lag_and_who_holds_it(service: ServiceProcess, browser: Browser) -> None:
    """The input moved to epoch 1 and worker w-2 holds a message at epoch 1 in op2; then nothing
    moves. The page shows op3's input waiting (amber, then red, with thresholds lowered
    through the URL) and the held-back row names the operators, the workers and the ages."""
    example = Example(service)
    example.advance()
    with service.client(example.token) as client:
        assert client.post(f"/v1/dataflows/{example.id}/progress", json={"worker": "w-2", "seq": 0, "updates": [
            update(2, 0, "source", [1], 1)]}).status_code == 200
    page, problems = open_dashboard(service, browser, "/dashboard?lag_warn=0.5&lag_bad=2")
    page.locator(f'#dataflows li[data-id="{example.id}"]').click(timeout=WAIT_MS)
    lag = page.locator('#frontiers tr[data-loc="3:0:target"] td.lag')
    expect(lag).to_have_class("lag lag-bad", timeout=WAIT_MS)
    assert float(lag.inner_text().split()[0]) >= 2.0
    # The port is outlined red in the graph, and the summary says how long the longest wait is.
    assert page.evaluate("window.dashboard.cy.getElementById('t-3-0').hasClass('lag-bad')")
    expect(page.locator("#lag-summary")).to_contain_text("longest wait", timeout=WAIT_MS)
    held = page.locator('#held tr[data-loc="3:0:target"]')
    expect(held).to_contain_text("(3,0,target) op3 in 0", timeout=WAIT_MS)
    expect(held).to_contain_text("1 × (2,0,source)@(1) — op2 out 0 · worker w-2 · ", timeout=WAIT_MS)
    expect(held).to_contain_text("1 × (0,0,source)@(1) — input out 0 · worker input · ", timeout=WAIT_MS)
    assert " s old" in held.inner_text()
    OUTPUT.mkdir(exist_ok=True)
    page.screenshot(path=str(OUTPUT / "dashboard-stalled.png"), full_page=True)
    assert problems == [], problems
    page.close()


def test_history_plots_survive_a_restart(service: ServiceProcess, browser: Browser) -> None:
    """After a restart the service's in-memory history starts at the compacted snapshot; the
    epochs plot still starts at the registration, from Delta, and nothing on the page fails."""
    example = Example(service)
    for _ in range(3):
        example.advance()
    example.wait_for_delta(3)
    before_restart = time.time()
    service.stop()
    service.restart()
    page, problems = open_dashboard(service, browser)
    page.locator(f'#dataflows li[data-id="{example.id}"]').click(timeout=WAIT_MS)
    expect(frontier_cell(page, "2:0:target")).to_have_text("{(3)}", timeout=WAIT_MS)
    wait_js(page, "window.dashboard.series.x.length >= 2")
    series = page.evaluate("() => window.dashboard.series")
    op2 = [y for y in series["ys"][series["keys"].index("2")] if y is not None]
    assert op2[0] == 0 and op2[-1] == 3 and sorted(op2) == op2  # epochs 0, 1, 2, 3 in order, from before the restart
    assert series["x"][0] < before_restart and series["x"] == sorted(series["x"])
    rate = page.evaluate("() => window.dashboard.rate")
    assert sum(rate["batches"]) >= 1 and rate["x"][0] < before_restart  # the throughput of before the restart
    page.wait_for_timeout(1600)
    page.screenshot(path=str(OUTPUT / "dashboard-restart.png"), full_page=True)
    assert problems == [], problems
    page.close()


def test_api_docs_work_offline_and_authorize_with_a_token(service: ServiceProcess, browser: Browser) -> None:
    """``/docs`` (Swagger UI) loads nothing from outside, and its Authorize button sends the
    bearer token: "Try it out" on the dataflow list gets a 200."""
    page = browser.new_page()
    elsewhere: list[str] = []
    page.on("request", lambda request: None if request.url.startswith((service.url, "data:"))
            else elsewhere.append(request.url))
    page.goto(service.url + "/docs")
    expect(page.locator(".opblock").first).to_be_visible(timeout=WAIT_MS)
    page.click(".btn.authorize")
    page.fill(".auth-container input", ADMIN_TOKEN)
    page.click(".auth-btn-wrapper .authorize")
    page.click(".btn-done")
    listing = page.locator("#operations-default-list_dataflows_v1_dataflows_get")
    listing.locator(".opblock-summary").click()
    listing.locator(".try-out__btn").click()
    listing.locator(".execute").click()
    status = listing.locator(".live-responses-table tr.response .response-col_status")
    expect(status).to_have_text("200", timeout=WAIT_MS)
    assert not elsewhere, elsewhere
    page.close()


def test_assets_are_shipped_with_their_licences() -> None:
    vendor = Path(__file__).resolve().parent.parent / "api" / "web" / "static" / "vendor"
    for asset, licence in (("cytoscape.min.js", "cytoscape.LICENSE"), ("uPlot.iife.min.js", "uPlot.LICENSE")):
        assert (vendor / asset).stat().st_size > 10_000
        assert "Permission is hereby granted" in (vendor / licence).read_text()
    assert (vendor / "swagger-ui-bundle.js").stat().st_size > 10_000  # /docs
    assert "Apache License" in (vendor / "swagger-ui.LICENSE").read_text()
    page = (vendor.parent / "dashboard.html").read_text()
    assert "http://" not in page and "https://" not in page  # no CDN


def test_history_keeps_the_last_versions_of_its_own_dataflow(tmp_path: Path) -> None:
    from api.delta.store import Store
    from api.streams.encoding import changes_json
    from api.web.dashboard import _history
    from tracker.graph import Location
    from tracker.reachability import FrontierChange

    store = Store(tmp_path)
    for dataflow_id in ("mine", "other"):
        store.append_changes([(dataflow_id, v, changes_json([FrontierChange(Location.target(1, 0), (v,), 1),
                                                              FrontierChange(Location.target(2, 0), (v,), -1)]), 0.0)
                              for v in range(1, 51)])
    got = _history(tmp_path, "mine", 10)["frontier_changes"]
    assert [c["version"] for c in got] == [46, 46, 47, 47, 48, 48, 49, 49, 50, 50]
    assert {tuple(c["time"]) for c in got} == {(v,) for v in range(46, 51)}
    # A limit that cuts a version leaves that version out rather than half of it.
    assert [c["version"] for c in _history(tmp_path, "mine", 5)["frontier_changes"]] == [49, 49, 50, 50]
    assert _history(tmp_path, "nobody", 10) == {"frontier_changes": [], "throughput": []}


def test_history_names_inner_scopes_with_their_inner_times(tmp_path: Path) -> None:
    from api.delta.store import Store
    from api.web.dashboard import _history

    inner = '{"location":{"scope":[1],"node":1,"port":0,"kind":"target"},"time":[3,0],"diff":1}'
    root = '{"location":{"node":2,"port":0,"kind":"target"},"time":[3],"diff":1}'
    Store(tmp_path).append_changes([("nested", 0, f"[{inner},{root}]", 0.0)])
    got = _history(tmp_path, "nested", 10)["frontier_changes"]
    assert [(c["version"], c["location"], c["time"]) for c in got] == [
        (0, {"scope": [1], "node": 1, "port": 0, "kind": "target"}, [3, 0]),
        (0, {"node": 2, "port": 0, "kind": "target"}, [3])]
