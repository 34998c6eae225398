// The dashboard's graph view (Cytoscape.js): a layered layout that wraps into bands, scopes
// collapsed until opened, search, and "only what holds the selected frontier back". Drawn from
// the graph alone; paintGraph() puts a frame's frontiers and lags on it. See docs/dashboard.md.
"use strict";

const G = {
  OP_W: 230,            // an operator's box (its ports' labels sit inside it)
  PORT_GAP: 30,         // between two ports of one side
  COL_GAP: 70,          // between two columns (ranks)
  ROW_GAP: 34,          // between two boxes of one column
  BAND_GAP: 80,         // between two bands of wrapped columns
  PAD: 24,              // inside an open scope, around its operators
  SIDE: 50,             // inside an open scope, beside its operators: its ports and its boundary's
  PER_COLUMN: 12,       // boxes per column at most: a wider rank is split into several columns
  MIN_ZOOM: 0.8,        // a big graph is drawn at least this large (it pans) so that labels stay readable
  MAX_ZOOM: 1.1,        // a small one at most this large
  DETAIL: 60,           // with more operators shown, only connections that advance time are drawn inside boxes
};

const pathKey = (path) => path.join(",");
const opKey = (path, id) => `${pathKey(path)}/${id}`;
const opId = (path, id) => (path.length ? `op-${path.join("_")}-${id}` : `op-${id}`);
const portId = (l) => `${l.kind === "target" ? "t" : "s"}-${l.node}-${l.port}` +
  (scopeOf(l).length ? `-in-${scopeOf(l).join("_")}` : "");

function drawGraph(flow) {
  // The model: every scope's body by path, and how many operators each holds (nested included).
  const scopes = new Map();
  const visit = (path, body) => {
    let count = 0;
    scopes.set(pathKey(path), {path, body});
    for (const node of body.nodes) count += node.scope ? 1 + visit([...path, node.id], node.scope) : 1;
    scopes.get(pathKey(path)).count = count;
    return count;
  };
  visit([], flow);
  state.graph = {scopes, expanded: new Set(), focus: null, focusKey: null, found: null, labels: new Map()};
  renderGraph();
}

function scopeArity(path) {
  // The arity of times in scope `path`: the root's, plus one per iterative scope on the way.
  let arity = state.dataflow.timestamp_arity, nodes = state.dataflow.nodes;
  for (const id of path) {
    const node = nodes.find((n) => n.id === id);
    if (node.scope.kind === "iterative") arity += 1;
    nodes = node.scope.nodes;
  }
  return arity;
}

function nodeConnections(node, path) {
  // Omitted connections mean every input to every output with the zero summary.
  if (node.connections) return node.connections;
  const zero = new Array(scopeArity(path)).fill(0);
  const all = [];
  for (let i = 0; i < node.inputs; i++) for (let o = 0; o < node.outputs; o++) all.push({input: i, output: o, summaries: [zero]});
  return all;
}

function shown(path, node) {
  // In focus mode only the operators on the blockers' paths (and the scopes holding them).
  const focus = state.graph.focus;
  if (!focus) return true;
  if (focus.has(opKey(path, node.id))) return true;
  const inner = pathKey([...path, node.id]) + ",";
  return !!node.scope && [...focus].some((key) => (key.split("/")[0] + ",").startsWith(inner));
}

function isOpen(path, node) {
  return !!node.scope && state.graph.expanded.has(pathKey([...path, node.id]));
}

function ranks(nodes, edges, nested) {
  // Breadth-first depth from the entries (operators without inputs, or those the scope's
  // boundary feeds, or else those nothing shown feeds): left to right; loops go back.
  const next = new Map(nodes.map((n) => [n.id, []]));
  const fed = new Set();
  for (const e of edges) {
    if (e.source.node !== 0 || !nested) {
      if (next.has(e.source.node)) next.get(e.source.node).push(e.target.node);
      if (e.source.node !== e.target.node) fed.add(e.target.node);
    }
  }
  const entries = nested ? edges.filter((e) => e.source.node === 0).map((e) => e.target.node) : [];
  const rank = new Map();
  const bfs = (start) => {
    const queue = start.filter((id) => next.has(id) && !rank.has(id));
    for (const id of queue) rank.set(id, 0);
    while (queue.length) {
      const id = queue.shift();
      for (const to of next.get(id) || []) {
        if (next.has(to) && !rank.has(to)) { rank.set(to, rank.get(id) + 1); queue.push(to); }
      }
    }
  };
  bfs([...entries, ...nodes.filter((n) => n.inputs === 0 || !fed.has(n.id)).map((n) => n.id)]);
  for (const n of nodes) if (!rank.has(n.id)) bfs([n.id]);
  return rank;
}

function boxSize(path, node, band) {
  const ports = Math.max(node.inputs, node.outputs, 1) * G.PORT_GAP;
  if (!isOpen(path, node)) return {w: G.OP_W, h: ports + 26};
  const inner = arrange([...path, node.id], node.scope, band - 2 * (G.PAD + G.SIDE));
  // Its inputs' rows above its inside, its outputs' below (see emitScope).
  const h = 2 * G.PAD + (Math.max(node.inputs, 1) + Math.max(node.outputs, 1) + 1) * G.PORT_GAP + inner.h;
  return {w: inner.w + 2 * (G.PAD + G.SIDE), h, inner};
}

function arrange(path, body, band) {
  // Columns by rank (a crowded rank split into several), packed left to right into bands at most
  // `band` wide, bands stacked downwards; positions relative to the top left corner.
  const nodes = body.nodes.filter((n) => shown(path, n)).sort((a, b) => a.id - b.id);
  const ids = new Set(nodes.map((n) => n.id));
  const edges = (body.edges || []).filter((e) => (e.source.node === 0 && path.length) || ids.has(e.source.node))
    .filter((e) => (e.target.node === 0 && path.length) || ids.has(e.target.node));
  const rank = ranks(nodes, edges, path.length > 0);
  const byRank = [];
  for (const node of nodes) {
    const r = rank.get(node.id);
    while (byRank.length <= r) byRank.push([]);
    byRank[r].push({node, ...boxSize(path, node, band)});
  }
  const columns = [];
  for (const boxes of byRank) for (let i = 0; i < boxes.length; i += G.PER_COLUMN) columns.push(boxes.slice(i, i + G.PER_COLUMN));
  const placed = [];
  const band_of = new Map();
  let x = 0, top = 0, bandHeight = 0, width = 0, bandIndex = 0;
  for (const column of columns) {
    const w = Math.max(...column.map((c) => c.w));
    if (x > 0 && x + w > band) { top += bandHeight + G.BAND_GAP; x = 0; bandHeight = 0; bandIndex += 1; }
    let y = top;
    for (const c of column) {
      placed.push({...c, x: x + w / 2, y: y + c.h / 2});
      band_of.set(c.node.id, bandIndex);
      y += c.h + G.ROW_GAP;
    }
    bandHeight = Math.max(bandHeight, y - G.ROW_GAP - top);
    width = Math.max(width, x + w);
    x += w + G.COL_GAP;
  }
  return {w: width, h: top + bandHeight, placed, edges, rank, band_of};
}

function scopeSummaryText(path) {
  const info = (state.scopes || []).find((s) => s.scope.join(",") === path.join(","));
  if (!info) return "";
  const parts = info.summaries.map((r) => `in ${r.input}→out ${r.output} ${r.summaries.map((t) => "+" + timeText(t)).join(" ")}`);
  return ` · ${info.kind} · ${parts.join("; ") || "no path through"}`;
}

function portElement(loc, parent, side, x, y, extra = {}) {
  return {data: {id: portId(loc), parent, key: locKey(loc), side, label: side, ...extra}, position: {x, y},
    classes: `port ${side.split(" ")[0]}`};
}

function emitScope(path, body, layout, left, top, parent, elements, counts) {
  // The operators and scopes of one scope (`layout`: arrange()'s), its top left corner at (left,
  // top). An operator, or a scope, is a compound node holding its ports; an open scope holds its
  // inside too.
  const detail = counts.shown <= G.DETAIL;
  for (const {node, x, y, w, h, inner} of layout.placed) {
    const cx = left + x, cy = top + y, id = opId(path, node.id);
    const open = isOpen(path, node);
    const inside = node.scope ? state.graph.scopes.get(pathKey([...path, node.id])).count : 0;
    const label = `${node.scope ? (open ? "▾ " : "▸ ") : ""}${node.name || (node.scope ? "scope" : "operator")} #${node.id}` +
      (node.scope ? scopeSummaryText([...path, node.id]) + (open ? "" : ` · ${inside} inside (tap to open)`) : "");
    elements.push({data: {id, label, key: opKey(path, node.id), ...(parent ? {parent} : {})},
      classes: node.scope ? `operator scope${open ? "" : " collapsed"}` : "operator"});
    // An operator's ports are centred on its sides; an open scope's inputs are at its top left and
    // its outputs at its bottom right, where its inside starts and ends (its bands read like lines).
    const place = (count, i) => cy + (i - (count - 1) / 2) * G.PORT_GAP;
    const first = (count, i) => cy - h / 2 + G.PAD + i * G.PORT_GAP;
    const last = (count, i) => cy + h / 2 - G.PAD - (count - 1 - i) * G.PORT_GAP;
    const inputAt = open ? first : place, outputAt = open ? last : place;
    const half = w / 2 - 8;
    for (let p = 0; p < node.inputs; p++) {
      elements.push(portElement({scope: path, node: node.id, port: p, kind: "target"}, id, `in ${p}`, cx - half, inputAt(node.inputs, p)));
    }
    for (let p = 0; p < node.outputs; p++) {
      elements.push(portElement({scope: path, node: node.id, port: p, kind: "source"}, id, `out ${p}`, cx + half, outputAt(node.outputs, p)));
    }
    if (open) {
      const within = [...path, node.id];
      for (let p = 0; p < node.inputs; p++) {  // the boundary's output p: the scope's input p, inside
        const loc = {scope: within, node: 0, port: p, kind: "source"};
        // A row below the scope's own port (a row above, on the way out): their labels do not overlap.
        elements.push(portElement(loc, id, `enter ${p}`, cx - half + G.SIDE, inputAt(node.inputs, p) + G.PORT_GAP / 1.5));
        elements.push({data: {id: `ingress-${within.join("_")}-${p}`, source: portId({scope: path, node: node.id, port: p,
          kind: "target"}), target: portId(loc)}, classes: "edge crossing"});
      }
      for (let p = 0; p < node.outputs; p++) {
        const loc = {scope: within, node: 0, port: p, kind: "target"};
        elements.push(portElement(loc, id, `leave ${p}`, cx + half - G.SIDE, outputAt(node.outputs, p) - G.PORT_GAP / 1.5));
        elements.push({data: {id: `egress-${within.join("_")}-${p}`, source: portId(loc), target: portId({scope: path,
          node: node.id, port: p, kind: "source"})}, classes: "edge crossing"});
      }
      const below = cy - h / 2 + G.PAD + (Math.max(node.inputs, 1) + 0.5) * G.PORT_GAP;
      emitScope(within, node.scope, inner, cx - inner.w / 2, below, id, elements, counts);
      continue;
    }
    if (node.scope) continue;
    for (const c of nodeConnections(node, path)) {
      const advances = c.summaries.some((t) => t.some((v) => v > 0));
      if (!advances && !detail) continue;
      elements.push({data: {
        id: `c-${id}-${c.input}-${c.output}`,
        source: portId({scope: path, node: node.id, port: c.input, kind: "target"}),
        target: portId({scope: path, node: node.id, port: c.output, kind: "source"}),
        label: advances ? c.summaries.map((t) => "+" + timeText(t)).join(" ") : "",
      }, classes: advances ? "internal loop" : "internal"});
    }
  }
  layout.edges.forEach((e) => {
    const i = body.edges.indexOf(e);
    const boundary = e.source.node === 0 || e.target.node === 0;
    const back = !boundary && layout.rank.get(e.target.node) <= layout.rank.get(e.source.node);
    const wraps = !boundary && layout.band_of.get(e.target.node) !== layout.band_of.get(e.source.node);
    elements.push({data: {id: `e-${path.length ? path.join("_") + "-" : ""}${i}`,
      source: portId({scope: path, ...e.source, kind: "source"}),
      target: portId({scope: path, ...e.target, kind: "target"})},
    classes: back ? "edge back" : wraps ? "edge wraps" : "edge"});
  });
}

function countShown(path, body) {
  let count = 0;
  for (const node of body.nodes) {
    if (!shown(path, node)) continue;
    count += 1;
    if (isOpen(path, node)) count += countShown([...path, node.id], node.scope);
  }
  return count;
}

const GRAPH_STYLE = [
  {selector: "node.operator", style: {
    "label": "data(label)", "text-valign": "top", "text-halign": "center", "font-weight": "bold",
    "background-color": "#f1f3f5", "border-color": "#868e96", "border-width": 1, "padding": "10px",
    "shape": "round-rectangle", "font-size": 13, "text-wrap": "ellipsis", "text-max-width": "420px",
    "min-zoomed-font-size": 6}},
  {selector: "node.port", style: {
    "label": "data(label)", "font-size": 12, "width": 14, "height": 14, "background-color": "#adb5bd",
    "text-valign": "center", "text-wrap": "ellipsis", "text-max-width": "95px", "min-zoomed-font-size": 6}},
  // Labels inside the box: an input's to its right, an output's to its left; edges stay clear.
  {selector: "node.port.in, node.port.enter", style: {"text-halign": "right", "text-margin-x": 4}},
  {selector: "node.port.out, node.port.leave", style: {"text-halign": "left", "text-margin-x": -4}},
  {selector: "node.port.live", style: {"background-color": "#4263eb"}},
  {selector: "node.port.lag-warn", style: {"border-width": 3, "border-color": "#f08c00"}},
  {selector: "node.port.lag-bad", style: {"border-width": 3, "border-color": "#e03131"}},
  {selector: "node.port.violation", style: {"background-color": "#c92a2a", "shape": "diamond", "width": 18,
    "height": 18}},
  {selector: "node.port.changed", style: {"background-color": "#fab005", "border-width": 3, "border-color": "#e67700"}},
  {selector: "node.port:selected", style: {"border-width": 3, "border-color": "#1d2433"}},
  {selector: "node.operator.found", style: {"border-width": 4, "border-color": "#ae3ec9", "background-color": "#f8f0fc"}},
  {selector: "edge", style: {"width": 2, "curve-style": "bezier", "target-arrow-shape": "triangle",
    "line-color": "#495057", "target-arrow-color": "#495057", "arrow-scale": 0.9}},
  {selector: "edge.back", style: {"curve-style": "unbundled-bezier", "control-point-distances": [-110],
    "control-point-weights": [0.5]}},
  {selector: "edge.wraps", style: {"curve-style": "taxi", "taxi-direction": "vertical", "line-color": "#868e96",
    "target-arrow-color": "#868e96", "width": 1.5}},
  {selector: "edge.internal", style: {"line-style": "dashed", "line-color": "#adb5bd",
    "target-arrow-color": "#adb5bd", "width": 1.5, "label": "data(label)", "font-size": 12,
    "color": "#e8590c", "text-background-color": "#fff", "text-background-opacity": 0.9}},
  {selector: "edge.loop", style: {"line-color": "#e8590c", "target-arrow-color": "#e8590c", "line-style": "solid", "width": 2.5}},
  {selector: "node.scope", style: {"background-color": "#e7f5ff", "border-color": "#1c7ed6",
    "border-width": 2, "border-style": "dashed"}},
  {selector: "node.scope.collapsed", style: {"background-color": "#d0ebff", "border-style": "solid"}},
  {selector: "edge.crossing", style: {"line-style": "dotted", "line-color": "#1c7ed6", "target-arrow-color": "#1c7ed6", "width": 1.5}},
];

function renderGraph(keep) {
  // (Re)build the drawing from the model: open scopes, focus. `keep`: an element to keep in view.
  const root = {nodes: state.dataflow.nodes, edges: state.dataflow.edges};
  const counts = {shown: countShown([], root)};
  const band = Math.max(900, ($("#graph").clientWidth - 60) / G.MIN_ZOOM);
  const elements = [];
  emitScope([], root, arrange([], root, band), 0, 0, null, elements, counts);
  const zoom = state.cy ? state.cy.zoom() : G.MIN_ZOOM;
  if (state.cy) state.cy.destroy();
  state.cy = cytoscape({container: $("#graph"), elements, style: GRAPH_STYLE, layout: {name: "preset", fit: false},
    textureOnViewport: elements.length > 1500, hideEdgesOnViewport: elements.length > 3000});
  // The panel as tall as the drawing needs (at the largest zoom), within bounds: a small graph
  // leaves room for the rest, a big one pans.
  const height = Math.min(Math.max(state.cy.elements().boundingBox().h * G.MAX_ZOOM + 80, 240), 620);
  if (Math.abs($("#graph").clientHeight - height) > 2) {
    $("#graph").style.height = `${height}px`;
    state.cy.resize();
  }
  state.graph.labels = new Map();
  if (state.frame) paintGraph(state.frame);
  if (keep) {  // an opened or closed scope, a found operator: at the zoom the user had, centred
    state.cy.zoom(Math.min(Math.max(zoom, G.MIN_ZOOM), G.MAX_ZOOM));
    state.cy.center(state.cy.getElementById(keep));
  } else {
    view(state.cy.elements());
  }
  $("#graph-note").textContent = `${counts.shown} of ${state.graph.scopes.get("").count} operators shown` +
    (state.graph.focus ? " (only what holds the selected location back)" : "") +
    (state.graph.scopes.size > 1 ? " · tap a scope to open or close it" : "");
  state.cy.on("tap", "node.port", (event) => selectLocation(event.target.data("key")));
  state.cy.on("tap", "node.scope", (event) => {
    if (event.target.hasClass("scope")) toggleScope(event.target.data("key"));  // not a port inside, bubbling up
  });
}

function view(eles) {
  // Fit `eles`, but never so small that labels are unreadable (then show their top left part:
  // the inputs, and pan from there) nor blown up beyond MAX_ZOOM.
  const cy = state.cy;
  if (eles.empty()) return;
  cy.fit(eles, 30);
  if (cy.zoom() > G.MAX_ZOOM) { cy.zoom(G.MAX_ZOOM); cy.center(eles); }
  if (cy.zoom() < G.MIN_ZOOM) {
    const box = eles.boundingBox();
    cy.zoom(G.MIN_ZOOM);
    const wide = box.w * G.MIN_ZOOM > cy.width(), tall = box.h * G.MIN_ZOOM > cy.height();
    cy.pan({x: wide ? 20 - box.x1 * G.MIN_ZOOM : (cy.width() - box.w * G.MIN_ZOOM) / 2 - box.x1 * G.MIN_ZOOM,
      y: tall ? 20 - box.y1 * G.MIN_ZOOM : (cy.height() - box.h * G.MIN_ZOOM) / 2 - box.y1 * G.MIN_ZOOM});
  }
}

function toggleScope(key) {
  // key: "path/id" of the scope node; its inside's path is path + id.
  const [path, id] = key.split("/");
  const inner = path ? `${path},${id}` : id;
  const expanded = state.graph.expanded;
  if (expanded.has(inner)) {
    for (const open of [...expanded]) if (open === inner || open.startsWith(inner + ",")) expanded.delete(open);
  } else {
    expanded.add(inner);
  }
  renderGraph(opId(path ? path.split(",").map(Number) : [], Number(id)));
}

function reveal(path) {
  // Open every scope on the way to `path` (a scope path).
  for (let i = 1; i <= path.length; i++) state.graph.expanded.add(pathKey(path.slice(0, i)));
}

function shortFrontier(times) {
  if (!times.length) return "{}";
  return "{" + times.slice(0, 2).map(timeText).join(", ") + (times.length > 2 ? ", …" : "") + "}";
}

function paintGraph(frame) {
  // The frame's frontier on every drawn port (blue while non-empty), its lag on operator inputs
  // (amber, red), negative counts (violations) as red diamonds; a port whose frontier changed
  // since the last frame flashes.
  const cy = state.cy;
  if (!cy) return;
  const negative = new Set(frame.status.violations.map((v) => locKey(v.location)));
  const labels = state.graph.labels;
  cy.batch(() => cy.nodes(".port").forEach((el) => {
    const key = el.data("key");
    const row = state.rows.get(key);
    const times = row ? row.frontier : [];
    const text = shortFrontier(times);
    el.data("label", `${el.data("side")} ${text}`);
    el.toggleClass("live", times.length > 0);
    el.toggleClass("violation", negative.has(key));
    el.removeClass("lag-warn lag-bad");
    if (row && row.location.kind === "target" && row.lag_seconds !== null && row.lag_seconds >= LAG_WARN) {
      el.addClass(lagClass(row.lag_seconds));
    }
    if (labels.has(key) && labels.get(key) !== text) {
      el.addClass("changed");
      setTimeout(() => el.removeClass("changed"), 900);
    }
    labels.set(key, text);
  }));
}

// ---------------------------------------------------------------- search and focus

function searchGraph(text) {
  // Operators anywhere (inside closed scopes too) whose name or #id matches; Enter or a click
  // opens the scopes on the way and centres the operator.
  const box = $("#search-results");
  box.replaceChildren();
  if (state.cy) state.cy.nodes(".found").removeClass("found");
  if (!text || !state.graph) return [];
  const wanted = text.toLowerCase();
  const found = [];
  for (const {path, body} of state.graph.scopes.values()) {
    for (const node of body.nodes) {
      const name = `${node.name || (node.scope ? "scope" : "operator")} #${node.id}`;
      if (name.toLowerCase().includes(wanted)) found.push({path, node, name});
    }
  }
  for (const hit of found.slice(0, 12)) {
    const button = document.createElement("button");
    button.type = "button";
    button.textContent = (hit.path.length ? `[${hit.path.join(",")}] ` : "") + hit.name;
    button.addEventListener("click", () => goTo(hit.path, hit.node.id));
    box.append(button);
  }
  if (found.length > 12) box.append(` and ${found.length - 12} more`);
  state.graph.found = found;
  return found;
}

function goTo(path, id) {
  state.graph.focus = null;
  $("#focus").classList.remove("on");
  reveal(path);
  renderGraph(opId(path, id));
  state.cy.getElementById(opId(path, id)).addClass("found");
}

function involved(answer) {
  // The operators an explanation names: the explained location's, and every operator on its
  // blockers' paths (the frame lists them; a scope's boundary stands for the scope node).
  const keys = new Set();
  const add = (l) => {
    const path = scopeOf(l);
    if (l.node === 0 && path.length) keys.add(opKey(path.slice(0, -1), path[path.length - 1]));
    else keys.add(opKey(path, l.node));
  };
  add(keyLocation(state.selected));
  for (const op of (answer ? answer.operators : [])) keys.add(opKey(scopeOf(op), op.node));
  return keys;
}

function focusRefresh(answer) {
  // In focus mode, redraw when the set of operators holding the selected location back changes.
  if (!$("#focus").classList.contains("on") || !state.selected) return;
  const keys = involved(answer);
  const signature = [...keys].sort().join(" ");
  if (signature === state.graph.focusKey) return;
  state.graph.focus = keys;
  state.graph.focusKey = signature;
  for (const key of keys) reveal(key.split("/")[0] ? key.split("/")[0].split(",").map(Number) : []);
  renderGraph();
}

function bindGraphControls() {
  // Called by dashboard.js once every script is loaded (it defines $).
  $("#search").addEventListener("keydown", (event) => {
    const found = state.graph && state.graph.found;
    if (event.key === "Enter" && found && found.length) goTo(found[0].path, found[0].node.id);
  });

  $("#focus").addEventListener("click", () => {
    const on = !$("#focus").classList.contains("on");
    $("#focus").classList.toggle("on", on);
    $("#focus").textContent = on ? "Show the whole graph" : "Show only what holds it back";
    state.graph.focus = null;
    state.graph.focusKey = null;
    if (on && state.frame) focusRefresh(state.frame.explained);
    else renderGraph();
  });

  $("#fit").addEventListener("click", () => state.cy && view(state.cy.elements()));
  $("#collapse").addEventListener("click", () => { state.graph.expanded.clear(); renderGraph(); });
  $("#expand").addEventListener("click", () => {
    for (const key of state.graph.scopes.keys()) if (key) state.graph.expanded.add(key);
    renderGraph();
  });
}
