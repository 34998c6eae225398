"""The dashboard stays readable at any size, in real headless Chromium against the real service.

* No label over another and no edge over a label, measured from the page: Cytoscape's own
  bounding box of every drawn label (operator and scope titles, port labels with their
  frontiers, loop summaries) and the drawn points of every edge, on a dataflow of 1,018
  operators in 56 scopes whose frontiers are long antichains, with every scope closed and then
  with every scope open; long antichains are shortened and hovering shows all of them.
* A small dataflow's page reads top-down (graph, what holds it back, plots, tables at full
  width) within two screens at 1400x900.
* "Show only what holds it back" works before anything is selected: it shows what holds the
  dataflow's output that has waited longest.
* A dataflow that recovery refused (a damaged log record) is listed as ``damaged`` with its
  reason, in readable contrast, and opening it shows the reason instead of a broken page.

Screenshots go to the test's tmp dir and to ``$TRACKER_SHOTS`` (default ``test-output/``).
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, Page, ViewportSize, expect, sync_playwright

from api.durability.marks import read_block
from api.durability.records import Batch, decode
from api.durability.segments import HEADER_SIZE, scan
from tests.helpers import ServiceProcess, ServiceStarter, edge, loop_graph, register, update
from tests.test_dashboard import CHROMIUM, CHROMIUM_ARGS, OUTPUT, WAIT_MS, nested_loops, open_dashboard, wait_js

pytestmark = pytest.mark.service(TRACKER_FLUSH_SECONDS="0.2", TRACKER_COMPACT_SECONDS="0.3",
                                 TRACKER_STALL_SECONDS="2")

SCREEN: ViewportSize = {"width": 1400, "height": 900}


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """Debian's Chromium, headless (as in tests/test_dashboard.py); fails when it is missing."""
    if not shutil.which(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: run bin/test (it installs it)", pytrace=False)
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


def shoot(page: Page, tmp_path: Path, name: str, full: bool = False) -> None:
    """A screenshot in the test's tmp dir and in ``$TRACKER_SHOTS``."""
    OUTPUT.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(tmp_path / name), full_page=full)
    shutil.copy(tmp_path / name, OUTPUT / name)


# ---------------------------------------------------------------- a big, varied dataflow

_LEVELS = ((50, 8, None), (24, 3, "iterative"), (15, 1, "region"), (15, 0, "iterative"))
"""Per nesting level of :func:`sprawling`: plain operators, child scopes, the level's scope kind."""


def _scope(level: int, prefix: str, arity: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    plain, children, kind = _LEVELS[level]
    nodes: list[dict[str, Any]] = []
    edges: list[dict[str, Any]] = []

    def add(name: str, inputs: int, outputs: int, **more: Any) -> int:
        nodes.append({"id": len(nodes) + (level > 0), "name": prefix + name, "inputs": inputs, "outputs": outputs,
                      **more})
        return int(nodes[-1]["id"])

    if level == 0:  # a source, then a join fed back from far down the pipeline (a loop at the root)
        source = add("source", 0, 1)
        head = add("retry-join", 2, 1)
        edges.append(edge((source, 0), (head, 0)))
    else:  # the boundary (node 0) feeds the head; in an iterative scope, so does the feedback
        head = add("head", 2 if kind == "iterative" else 1, 1)
        edges.append(edge((0, 0), (head, 0)))
    tail, used, made, step, skip = (head, 0), 2 if level == 0 else 1, 0, 0, None
    every = max(1, (plain - used) // (children + 1))
    reserved = 2 if level == 0 else int(kind == "iterative")  # added after the chain: retry and sink, or feedback
    while used < plain - reserved or made < children:
        if made < children and step and step % every == 0:
            made += 1
            inner_kind = _LEVELS[level + 1][2]
            inner = _scope(level + 1, f"{prefix}s{made}.", arity + (inner_kind == "iterative"))
            node = add(f"scope{made}", 1, 1, scope={"kind": inner_kind, "nodes": inner[0], "edges": inner[1]})
            edges.append(edge(tail, (node, 0)))
            tail = (node, 0)
        elif step % 7 == 3 and plain - used > 6:  # a diamond: a fork, two branches, a join
            fork, left, right, join = (add(f"fork{step}", 1, 2), add(f"left{step}", 1, 1), add(f"right{step}", 1, 1),
                                       add(f"join{step}", 2, 1))
            edges += [edge(tail, (fork, 0)), edge((fork, 0), (left, 0)), edge((fork, 1), (right, 0)),
                      edge((left, 0), (join, 0)), edge((right, 0), (join, 1))]
            tail, used, skip = (join, 0), used + 4, (fork, 1)
        elif step % 7 == 5 and skip is not None:  # two in, two out, one input fed from further back
            mix = add(f"mix{step}", 2, 2)
            edges += [edge(tail, (mix, 0)), edge(skip, (mix, 1))]
            tail, used, skip = (mix, 0), used + 1, None
        else:
            node = add(f"map{step}", 1, 1)
            edges.append(edge(tail, (node, 0)))
            tail, used = (node, 0), used + 1
        step += 1
    if level == 0:
        retry = add("retry", 1, 1, connections=[{"input": 0, "output": 0, "summaries": [[0, 1]]}])
        sink = add("sink", 1, 0)
        edges += [edge(tail, (retry, 0)), edge((retry, 0), (head, 1)), edge(tail, (sink, 0))]
    else:
        if kind == "iterative":
            loop = [0] * (arity - 1) + [1]
            feedback = add("feedback", 1, 1, connections=[{"input": 0, "output": 0, "summaries": [loop]}])
            edges += [edge(tail, (feedback, 0)), edge((feedback, 0), (head, 1))]
        edges.append(edge(tail, (0, 0)))
    return nodes, edges


def sprawling(name: str = "sprawling") -> dict[str, Any]:
    """A registration body of arity 2 with 1,018 operators (scope nodes included) in 56 scopes,
    nested four deep (iterative, region, iterative): chains with diamonds (a fork's two outputs,
    a join's two inputs), operators with two inputs and two outputs fed from further back, a
    feedback loop in every iterative scope and one at the root.

    >>> def count(nodes): return sum(1 + count(n["scope"]["nodes"]) if "scope" in n else 1 for n in nodes)
    >>> def scopes(nodes): return sum(1 + scopes(n["scope"]["nodes"]) for n in nodes if "scope" in n)
    >>> body = sprawling()
    >>> count(body["nodes"]), scopes(body["nodes"])
    (1018, 56)
    """
    nodes, edges = _scope(0, "", 2)
    return {"name": name, "timestamp_arity": 2, "nodes": nodes, "edges": edges}


# ---------------------------------------------------------------- measuring the drawing

MEASURE = """() => {
    // Every drawn label's box (Cytoscape's own, from the text it measured in this page) and
    // every drawn edge's segments, in the drawing's coordinates.
    const cy = window.dashboard.cy, only = {includeNodes: false, includeEdges: false, includeLabels: true};
    const labels = [];
    cy.nodes().forEach((n) => {
        if (!n.visible() || !n.data('label')) return;
        const b = n.boundingBox(only);
        labels.push([n.id(), n.hasClass('operator') ? 'title' : n.hasClass('port') ? 'port' : 'other',
                     b.x1, b.y1, b.x2, b.y2, n.data('label')]);
    });
    const segments = [];
    cy.edges().forEach((e) => {
        if (!e.visible()) return;
        const points = [e.sourceEndpoint(), ...(e.segmentPoints() || []), e.targetEndpoint()];
        for (let i = 1; i < points.length; i++) {
            segments.push([e.id(), points[i - 1].x, points[i - 1].y, points[i].x, points[i].y]);
        }
    });
    return {labels, segments, operators: cy.nodes('.operator').length, ports: cy.nodes('.port').length};
}"""

Box = tuple[str, str, float, float, float, float, str]


def overlapping(labels: list[Box]) -> list[tuple[str, str]]:
    """Pairs of label boxes that overlap (a sweep along x: each box is compared with those whose
    x-range it meets)."""
    pairs: list[tuple[str, str]] = []
    active: list[Box] = []
    for box in sorted(labels, key=lambda b: b[2]):
        active = [a for a in active if a[4] > box[2]]
        pairs += [(a[0], box[0]) for a in active if a[2] < box[4] and box[2] < a[4] and a[3] < box[5] and box[3] < a[5]]
        active.append(box)
    return pairs


def crossing(labels: list[Box], segments: list[list[Any]], cell: float = 200.0) -> list[tuple[str, str]]:
    """(edge, label) pairs where a drawn edge segment passes through a label's box. Edges are
    drawn as axis-parallel segments here, so a segment meets a box when their extents overlap."""
    grid: dict[tuple[int, int], list[Box]] = {}
    for box in labels:
        for gx in range(int(box[2] // cell), int(box[4] // cell) + 1):
            for gy in range(int(box[3] // cell), int(box[5] // cell) + 1):
                grid.setdefault((gx, gy), []).append(box)
    found = set()
    for name, ax, ay, bx, by in segments:
        x1, x2, y1, y2 = min(ax, bx), max(ax, bx), min(ay, by), max(ay, by)
        assert x1 == x2 or y1 == y2 or (x2 - x1 < 1 or y2 - y1 < 1), f"{name} has a slanted segment"
        for gx in range(int(x1 // cell), int(x2 // cell) + 1):
            for gy in range(int(y1 // cell), int(y2 // cell) + 1):
                for box in grid.get((gx, gy), []):
                    if x1 < box[4] and box[2] < x2 + 0.01 and y1 < box[5] and box[3] < y2 + 0.01:
                        found.add((name, box[0]))
    return sorted(found)


def assert_readable(page: Page, what: str) -> dict[str, Any]:
    """No two labels overlap and no edge crosses a label; returns the measure."""
    drawn = page.evaluate(MEASURE)
    labels: list[Box] = [tuple(b) for b in drawn["labels"]]
    kinds = {kind: sum(1 for b in labels if b[1] == kind) for kind in ("title", "port", "other")}
    assert kinds["title"] == drawn["operators"] and kinds["port"] == drawn["ports"], (what, kinds, drawn["operators"])
    both = overlapping(labels)
    assert not both, f"{what}: {len(both)} overlapping labels, e.g. {both[:5]}"
    crossed = crossing(labels, drawn["segments"])
    assert not crossed, f"{what}: {len(crossed)} edges over labels, e.g. {crossed[:5]}"
    return {**drawn, "kinds": kinds}


def drawn_all(page: Page, operators: int) -> None:
    """Until Cytoscape holds ``operators`` operator boxes and the frame's frontiers are on them."""
    wait_js(page, "(n) => window.dashboard.cy && window.dashboard.cy.nodes('.operator').length === n "
                  "&& window.dashboard.cy.nodes('.port').every(p => p.data('label') !== p.data('side'))",
            operators, timeout_ms=60_000)


def test_a_thousand_operators_in_56_scopes_have_no_label_over_another(service: ServiceProcess, browser: Browser,
                                                                      tmp_path: Path) -> None:
    body = sprawling()
    dataflow, token = register(service, body)
    antichain = [[a, 5 - a] for a in range(6)]  # six incomparable times: every frontier downstream holds them all
    with service.client(token) as client:
        assert client.post(f"/v1/dataflows/{dataflow}/progress", json={"worker": "input", "seq": 0, "updates": [
            update(0, 0, "source", [0, 0], -1), *(update(0, 0, "source", t, 1) for t in antichain)]}).status_code == 200
    page, problems = open_dashboard(service, browser, width=SCREEN["width"], height=SCREEN["height"])
    page.locator(f'#dataflows li[data-id="{dataflow}"]').click(timeout=WAIT_MS)
    drawn_all(page, len(body["nodes"]))  # the root's 50 operators and 8 scopes, closed
    closed = assert_readable(page, "scopes closed")
    assert closed["kinds"]["port"] >= 100 and closed["kinds"]["other"] >= 1  # ports, and the root loop's "+(0, 1)"
    # A long antichain is shortened to its room, and hovering the label shows all of it.
    label = page.evaluate("() => window.dashboard.cy.getElementById('t-2-0').data('label')")
    assert label.startswith("in 0 {(0, 5), ") and label.endswith("…}"), label
    box = page.evaluate("""() => { const cy = window.dashboard.cy, el = cy.getElementById('t-2-0');
        const b = el.renderedBoundingBox({includeNodes: false, includeLabels: true});
        const at = cy.container().getBoundingClientRect();
        return {x: at.left + (b.x1 + b.x2) / 2, y: at.top + (b.y1 + b.y2) / 2}; }""")
    page.mouse.move(box["x"], box["y"])
    tip = page.locator("#graph-tip")
    expect(tip).to_be_visible(timeout=WAIT_MS)
    expect(tip).to_contain_text("{(0, 5), (1, 4), (2, 3), (3, 2), (4, 1), (5, 0)} (6 times)")
    shoot(page, tmp_path, "layout-1018-closed.png")
    page.mouse.move(1, 1)
    expect(tip).to_be_hidden()

    page.click("#expand")
    drawn_all(page, 1018)
    opened = assert_readable(page, "scopes open")
    assert opened["kinds"]["title"] == 1018 and opened["kinds"]["port"] > 2000, opened["kinds"]
    # Inside the deepest scopes too (times of arity 4), antichains are shortened to their room.
    deep = page.evaluate("""() => window.dashboard.cy.nodes('.port').filter(
        (p) => p.data('key').split('/')[0].split(',').length === 3).map((p) => [p.id(), p.data('label')])""")
    assert len(deep) > 400 and all(label.endswith("…}") for _, label in deep if " {(" in label), deep[:5]
    page.evaluate("(id) => { const cy = window.dashboard.cy; cy.zoom(0.8); "
                  "cy.center(cy.getElementById(id).parent()); }", deep[len(deep) // 2][0])
    page.wait_for_timeout(500)
    shoot(page, tmp_path, "layout-1018-open.png")
    assert problems == [], problems
    page.close()


def test_a_small_dataflow_reads_top_down_within_two_screens(service: ServiceProcess, browser: Browser,
                                                            tmp_path: Path) -> None:
    """A 7-operator dataflow (two nested loops) at 1400x900: the graph, then what holds it back,
    then the plots and the tables, each as wide as the page's main column, all within two screens
    (with its scopes open, within two and a half)."""
    dataflow, _ = register(service, nested_loops())
    page, problems = open_dashboard(service, browser, width=SCREEN["width"], height=SCREEN["height"])
    page.locator(f'#dataflows li[data-id="{dataflow}"]').click(timeout=WAIT_MS)
    wait_js(page, "window.dashboard.frame !== null && document.querySelectorAll('#frontiers tbody tr').length === 17")
    page.wait_for_timeout(300)
    layout = page.evaluate("""() => {
        const top = (s) => document.querySelector(s).getBoundingClientRect().top + window.scrollY;
        const width = (s) => document.querySelector(s).getBoundingClientRect().width;
        return {height: document.scrollingElement.scrollHeight,
                order: ['#graph', '#held-panel', '.plots', '#estimates-panel', '#frontiers-panel'].map(top),
                main: width('#view'), tables: ['#held', '#estimates', '#frontiers'].map(width)}; }""")
    print(f"page height of a 7-operator dataflow at 1400x900, scopes closed: {layout['height']} px")
    assert layout["order"] == sorted(layout["order"]), layout
    assert all(w >= layout["main"] - 4 for w in layout["tables"]), layout  # full width (less the scroll box's border)
    assert layout["height"] <= 2 * SCREEN["height"], layout
    shoot(page, tmp_path, "layout-small-page.png", full=True)
    page.click("#expand")
    wait_js(page, "window.dashboard.cy.nodes('.operator').length === 7")
    page.wait_for_timeout(300)
    opened = page.evaluate("document.scrollingElement.scrollHeight")
    print(f"page height of a 7-operator dataflow at 1400x900, scopes open: {opened} px")
    assert opened <= 2.5 * SCREEN["height"], opened
    assert_readable(page, "a small dataflow, scopes open")
    shoot(page, tmp_path, "layout-small-page-open.png", full=True)
    assert problems == [], problems
    page.close()


def two_branches() -> dict[str, Any]:
    """in-a -> a -> out-a and in-b -> b -> out-b: two outputs, each with its own input."""
    shapes = [("in-a", 0, 1), ("a", 1, 1), ("out-a", 1, 0), ("in-b", 0, 1), ("b", 1, 1), ("out-b", 1, 0)]
    nodes = [{"id": i, "name": name, "inputs": inputs, "outputs": outputs}
             for i, (name, inputs, outputs) in enumerate(shapes)]
    return {"name": "two-branches", "nodes": nodes,
            "edges": [edge((0, 0), (1, 0)), edge((1, 0), (2, 0)), edge((3, 0), (4, 0)), edge((4, 0), (5, 0))]}


def test_only_what_holds_it_back_needs_no_selection(service: ServiceProcess, browser: Browser) -> None:
    """Branch b moves, branch a never does: with nothing selected, the button shows what holds
    back the output that has waited longest (out-a's input), so in-a, a and out-a alone."""
    dataflow, token = register(service, two_branches())
    with service.client(token) as client:
        for epoch in range(2):
            time.sleep(0.3)  # out-b's frontier moves after out-a's last did (at the registration)
            assert client.post(f"/v1/dataflows/{dataflow}/progress", json={"worker": "b", "seq": epoch, "updates": [
                update(3, 0, "source", [epoch], -1), update(3, 0, "source", [epoch + 1], 1)]}).status_code == 200
    page, problems = open_dashboard(service, browser, width=SCREEN["width"], height=SCREEN["height"])
    page.locator(f'#dataflows li[data-id="{dataflow}"]').click(timeout=WAIT_MS)
    button = page.locator("#focus")
    expect(button).to_be_enabled(timeout=WAIT_MS)
    assert page.evaluate("window.dashboard.selected") is None
    expect(button).to_have_attribute("title", "nothing selected: the operators holding (2,0,target) back "
                                              "(the dataflow's output waiting longest)")
    button.click()
    wait_js(page, "window.dashboard.graph.focus !== null")
    shown = page.evaluate("() => window.dashboard.cy.nodes('.operator').map(n => n.data('label')).sort()")
    assert shown == ["a #1", "in-a #0", "out-a #2"], shown
    assert page.evaluate("window.dashboard.selected") == "2:0:target"
    expect(page.locator("#graph-note")).to_contain_text("(only what holds (2,0,target) back)")
    expect(page.locator("#explain")).to_contain_text("(0,0,source)", timeout=WAIT_MS)
    button.click()  # and back to the whole graph
    wait_js(page, "window.dashboard.cy.nodes('.operator').length === 6")
    assert problems == [], problems
    page.close()


CONTRAST = """(selector) => {
    // WCAG's contrast ratio of an element's text against the first opaque background behind it.
    const rgb = (c) => c.match(/[0-9.]+/g).map(Number);
    const luminance = ([r, g, b]) => [r, g, b].map((v) => { v /= 255;
        return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; })
        .reduce((sum, v, i) => sum + v * [0.2126, 0.7152, 0.0722][i], 0);
    const element = document.querySelector(selector);
    let back = [255, 255, 255];
    for (let e = element; e; e = e.parentElement) {
        const c = rgb(getComputedStyle(e).backgroundColor);
        if (c.length < 4 || c[3] > 0) { back = c; break; }
    }
    const [light, dark] = [luminance(rgb(getComputedStyle(element).color)), luminance(back)].sort((a, b) => b - a);
    return (light + 0.05) / (dark + 0.05);
}"""


def _damage_a_batch(service: ServiceProcess, dataflow: str) -> None:
    """``kill -9``, then one flipped byte in the middle batch record of ``dataflow`` (as
    tests/test_api_damage.py does), then a restart: recovery refuses that dataflow."""
    service.kill9()
    [segment] = sorted(service.log_directory().glob("wal-*.log"))
    data = bytearray(segment.read_bytes())
    frames = scan(bytes(data), read_block(bytes(data)).size).payloads
    batches = [offset for offset, payload in frames if isinstance(record := decode(payload), Batch)
               and record.df == dataflow]
    data[batches[len(batches) // 2] + HEADER_SIZE + 12] ^= 0x5A
    segment.write_bytes(bytes(data))
    service.restart()


def test_a_damaged_dataflow_is_listed_with_its_reason_and_opens_to_it(start_service: ServiceStarter,
                                                                       browser: Browser, tmp_path: Path) -> None:
    service = start_service(TRACKER_DELTA="0")  # the log alone holds every batch: its damage is not repaired
    damaged, damaged_token = register(service, loop_graph(2, name="broken"))
    healthy, _ = register(service, loop_graph(2, name="healthy"))
    with service.client(damaged_token) as client:
        for step in range(3):
            assert client.post(f"/v1/dataflows/{damaged}/progress", json={"worker": "w", "seq": step, "updates": [
                update(1, 0, "target", [step], 1)]}).status_code == 200
    _damage_a_batch(service, damaged)
    refused = httpx.get(f"{service.url}/v1/dataflows/{damaged}", headers=service.admin_headers)
    assert refused.status_code == 503 and refused.json()["error"] == "dataflow_damaged"
    reason = refused.json()["detail"]
    listed = [d for d in httpx.get(service.url + "/v1/dataflows", headers=service.admin_headers).json()
              if d["state"] == "damaged"]
    assert [(d["id"], d["detail"]) for d in listed] == [(damaged, reason)]

    page, problems = open_dashboard(service, browser, width=SCREEN["width"], height=SCREEN["height"])
    page.click("#refresh")
    item = page.locator(f'#dataflows li[data-id="{damaged}"]')
    expect(item.locator(".state")).to_have_text("damaged", timeout=WAIT_MS)
    expect(item.locator(".detail")).to_have_text(reason)
    expect(item.locator("small")).to_contain_text("no version served")
    for selector in (f'#dataflows li[data-id="{damaged}"] .state', f'#dataflows li[data-id="{damaged}"] .detail'):
        assert page.evaluate(CONTRAST, selector) >= 4.5, selector
    item.click()
    expect(page.locator("#state .state")).to_have_text("damaged", timeout=WAIT_MS)
    expect(page.locator("#lifecycle")).to_contain_text(f"Damaged: {reason}")
    expect(page.locator("#title")).to_have_text(f"broken ({damaged})")
    assert page.locator("#live").is_hidden() and page.locator("#graph canvas").count() == 0
    for selector in ("#lifecycle-text", "#lifecycle p.more", "#state .state", "#conn"):
        assert page.evaluate(CONTRAST, selector) >= 4.5, selector
    shoot(page, tmp_path, "layout-damaged.png")
    # The other dataflow is served, and opening it after the damaged one draws its page again.
    page.locator(f'#dataflows li[data-id="{healthy}"]').click()
    wait_js(page, "window.dashboard.frame !== null && window.dashboard.cy.nodes('.operator').length === 3")
    assert page.locator("#live").is_visible() and page.locator("#lifecycle p.more").count() == 0
    # The refused dataflow's own token authenticates and gets the same reason (503), not a broken page.
    own = browser.new_page(viewport=SCREEN)  # a new context: no token stored yet
    own.goto(f"{service.url}/dashboard#{damaged}")
    own.fill("#token", damaged_token)
    own.click("#save-token")
    expect(own.locator("#lifecycle")).to_contain_text(f"Damaged: {reason}", timeout=WAIT_MS)
    expect(own.locator("#state .state")).to_have_text("damaged")
    own.close()
    # What the page reported as failing: the refused dataflow's 503s (opened twice), nothing else.
    assert [p for p in problems if "503" not in p and "Failed to load resource" not in p] == [], problems
    assert all(damaged in p for p in problems if p.startswith("503")), problems
    page.close()


def test_sprawling_has_its_advertised_shape() -> None:
    """The dataflow the layout is measured on: loops at the root and in scopes, multi-port operators."""
    body = sprawling()
    ids = [n["id"] for n in body["nodes"]]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    flat: list[dict[str, Any]] = []

    def walk(nodes: list[dict[str, Any]]) -> None:
        for n in nodes:
            flat.append(n)
            if "scope" in n:
                walk(n["scope"]["nodes"])

    walk(body["nodes"])
    assert sum(1 for n in flat if n["inputs"] == 2 and n["outputs"] == 2) >= 20
    # The root's retry, and the feedback of every iterative scope (8 at the first level, 24 at the third).
    assert sum(1 for n in flat if "connections" in n) == 1 + 8 + 24
    assert all(b == a + 1 for a, b in pairwise(ids))
