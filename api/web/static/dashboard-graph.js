// The dashboard's graph view (Cytoscape.js): draws what dashboard-layout.js places (boxes in
// wrapped bands, scopes collapsed until opened, edges routed around every label), puts a frame's
// frontiers and lags on it, and offers search, hover and "only what holds it back".
// See docs/dashboard.md.
"use strict";

const G = {
  MIN_ZOOM: 0.8,        // a big graph is drawn at least this large (it pans) so that labels stay readable
  MAX_ZOOM: 1.1,        // a small one at most this large
  DETAIL: 60,           // with more operators shown, only connections that advance time are drawn inside boxes
  TIP_TIMES: 64,        // times of an antichain the hover shows (the frontier table has them all)
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

function nodeConnections(path, node) {
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

function scopeSummaryText(path) {
  const info = (state.scopes || []).find((s) => s.scope.join(",") === path.join(","));
  if (!info) return "";
  const parts = info.summaries.map((r) => `in ${r.input}→out ${r.output} ${r.summaries.map((t) => "+" + timeText(t)).join(" ")}`);
  return ` · ${info.kind} · ${parts.join("; ") || "no path through"}`;
}

function titleOf(path, node) {
  const open = isOpen(path, node);
  const name = `${node.scope ? (open ? "▾ " : "▸ ") : ""}${node.name || (node.scope ? "scope" : "operator")} #${node.id}`;
  if (!node.scope) return name;
  const inside = state.graph.scopes.get(pathKey([...path, node.id])).count;
  return name + scopeSummaryText([...path, node.id]) + (open ? "" : ` · ${inside} inside`);
}

function layoutModel(detail) {
  return {shown, isOpen, detail, arity: scopeArity, title: titleOf, connections: nodeConnections};
}

function portElement(loc, parent, side, x, y, budget, labelSide, operator) {
  // `labelSide`: "right" for a port on a box's left side (its label inside, to its right), "left"
  // for one on a box's right side.
  return {data: {id: portId(loc), parent, key: locKey(loc), side, label: side, budget, operator}, position: {x, y},
    classes: `port ${side.split(" ")[0]} label-${labelSide}`};
}

function routedEdge(id, source, target, from, to, points, classes, extra = {}) {
  const {weights, distances} = segmentStyle(from, to, points);
  return {data: {id, source, target, weights, distances, ...extra}, classes};
}

function emitBox(path, box, x0, y0, parent, elements) {
  // An operator or a closed scope: a compound node (its title above it) holding an invisible
  // frame (its size), its ports, its internal connections and their summaries.
  const node = box.node, id = opId(path, node.id);
  elements.push({data: {id, label: box.shownTitle, full: box.title, key: opKey(path, node.id), ...(parent ? {parent} : {})},
    classes: node.scope ? `operator scope${box.kind === "open" ? "" : " collapsed"}` : "operator"});
  elements.push({data: {id: `frame-${id}`, parent: id, w: box.w, h: box.h}, position: {x: x0 + box.w / 2, y: y0 + box.h / 2},
    classes: "frame"});
  if (box.kind === "open") return id;
  const name = box.title;
  for (let p = 0; p < node.inputs; p++) {
    elements.push(portElement({scope: path, node: node.id, port: p, kind: "target"}, id, `in ${p}`,
      x0 + LAYOUT.INSET, y0 + box.inY(p), box.inZone, "right", name));
  }
  for (let p = 0; p < node.outputs; p++) {
    elements.push(portElement({scope: path, node: node.id, port: p, kind: "source"}, id, `out ${p}`,
      x0 + box.w - LAYOUT.INSET, y0 + box.outY(p), box.outZone, "left", name));
  }
  for (const lane of box.lanes) {
    const c = lane.connection, x = x0 + lane.x;
    const from = {x: x0 + LAYOUT.INSET, y: y0 + box.inY(c.input)}, to = {x: x0 + box.w - LAYOUT.INSET, y: y0 + box.outY(c.output)};
    elements.push(routedEdge(`c-${id}-${c.input}-${c.output}`,
      portId({scope: path, node: node.id, port: c.input, kind: "target"}),
      portId({scope: path, node: node.id, port: c.output, kind: "source"}),
      from, to, [[x, from.y], [x, to.y]], lane.label ? "internal loop" : "internal", {label: lane.label}));
    if (lane.label) {
      elements.push({data: {id: `tag-${id}-${c.input}-${c.output}`, parent: id, label: lane.label},
        position: {x, y: Math.max(from.y, to.y) + 11}, classes: "tag"});
    }
  }
  return id;
}

function emitBoundary(path, box, x0, y0, parent, name, elements) {
  // An open scope's entry (its inputs: its own port on its border, then the inside's `enter`
  // port) or exit (the inside's `leave` port, then its own output on its border). `name`: the
  // scope's title.
  const outer = path.slice(0, -1), owner = path[path.length - 1];
  const left = x0 + LAYOUT.INSET, right = x0 + box.w - LAYOUT.INSET;
  for (let p = 0; p < box.rows; p++) {
    const from = {x: left, y: y0 + box.inY(p)}, to = {x: right, y: y0 + box.outY(p)};
    const own = {scope: outer, node: owner, port: p, kind: box.kind === "entry" ? "target" : "source"};
    const inside = {scope: path, node: 0, port: p, kind: box.kind === "entry" ? "source" : "target"};
    const [first, second] = box.kind === "entry" ? [own, inside] : [inside, own];
    const [firstSide, secondSide] = box.kind === "entry" ? [`in ${p}`, `enter ${p}`] : [`leave ${p}`, `out ${p}`];
    elements.push(portElement(first, parent, firstSide, from.x, from.y, box.inZone, "right", name));
    elements.push(portElement(second, parent, secondSide, to.x, to.y, box.outZone, "left", name));
    elements.push(routedEdge(`${box.kind === "entry" ? "ingress" : "egress"}-${path.join("_")}-${p}`, portId(first),
      portId(second), from, to, [[to.x, from.y]], "edge crossing"));
  }
}

function emitLayout(path, layout, left, top, parent, title, elements) {
  // The boxes of one scope's layout (arrange()'s) with its top left corner at (left, top), then
  // its edges along their routes. `parent`, `title`: the open scope's compound node and title.
  for (const box of layout.boxes) {
    const x0 = left + box.x0, y0 = top + box.y0;
    if (box.kind === "entry" || box.kind === "exit") { emitBoundary(path, box, x0, y0, parent, title, elements); continue; }
    const id = emitBox(path, box, x0, y0, parent, elements);
    if (box.kind === "open") emitLayout([...path, box.node.id], box.inner, x0, y0, id, box.title, elements);
  }
  for (const r of layout.routes) {
    const e = r.edge;
    const boundary = e.source.node === 0 || e.target.node === 0;
    const back = !boundary && layout.rank.get(e.target.node) <= layout.rank.get(e.source.node);
    const wraps = r.from.band !== r.to.band;
    const shift = ([x, y]) => [left + x, top + y];
    elements.push(routedEdge(`e-${path.length ? path.join("_") + "-" : ""}${r.index}`,
      portId({scope: path, ...e.source, kind: "source"}), portId({scope: path, ...e.target, kind: "target"}),
      {x: left + r.source.x, y: top + r.source.y}, {x: left + r.target.x, y: top + r.target.y}, r.points.map(shift),
      back ? "edge back" : wraps ? "edge wraps" : "edge"));
  }
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

const FONT = {"font-family": LAYOUT.FAMILY, "min-zoomed-font-size": 6};
const GRAPH_STYLE = [
  {selector: "node.operator", style: {...FONT,
    "label": "data(label)", "text-valign": "top", "text-halign": "center", "font-weight": "bold", "text-margin-y": -3,
    "background-color": "#f1f3f5", "border-color": "#868e96", "border-width": 1, "padding": 0,
    "compound-sizing-wrt-labels": "exclude", "shape": "round-rectangle", "font-size": LAYOUT.TITLE_PX, "text-events": "yes"}},
  // An invisible child as large as the box: Cytoscape sizes a compound node by its children.
  {selector: "node.frame", style: {"width": "data(w)", "height": "data(h)", "background-opacity": 0, "border-width": 0,
    "events": "no", "shape": "rectangle"}},
  {selector: "node.port", style: {...FONT,
    "label": "data(label)", "font-size": LAYOUT.PORT_PX, "width": 14, "height": 14, "background-color": "#adb5bd",
    "text-valign": "top", "text-events": "yes"}},
  // Labels above their row's line, inside the box: an input's from its port rightwards, an output's leftwards.
  {selector: "node.port.label-right", style: {"text-halign": "right", "text-margin-x": -4}},
  {selector: "node.port.label-left", style: {"text-halign": "left", "text-margin-x": 4}},
  {selector: "node.tag", style: {...FONT, "label": "data(label)", "font-size": LAYOUT.PORT_PX, "color": "#c2410c",
    "text-valign": "center", "text-halign": "center",
    "width": 1, "height": 1, "background-opacity": 0, "border-width": 0, "events": "no"}},
  {selector: "node.port.live", style: {"background-color": "#4263eb"}},
  {selector: "node.port.lag-warn", style: {"border-width": 3, "border-color": "#f08c00"}},
  {selector: "node.port.lag-bad", style: {"border-width": 3, "border-color": "#e03131"}},
  {selector: "node.port.violation", style: {"background-color": "#c92a2a", "shape": "diamond", "width": 18,
    "height": 18}},
  {selector: "node.port.changed", style: {"background-color": "#fab005", "border-width": 3, "border-color": "#e67700"}},
  {selector: "node.port:selected", style: {"border-width": 3, "border-color": "#1d2433"}},
  {selector: "node.operator.found", style: {"border-width": 4, "border-color": "#ae3ec9", "background-color": "#f8f0fc"}},
  {selector: "edge", style: {"width": 2, "curve-style": "segments", "segment-weights": "data(weights)",
    "segment-distances": "data(distances)", "edge-distances": "node-position", "target-arrow-shape": "triangle",
    "line-color": "#495057", "target-arrow-color": "#495057", "arrow-scale": 0.9}},
  {selector: "edge.wraps, edge.back", style: {"line-color": "#868e96", "target-arrow-color": "#868e96", "width": 1.5}},
  {selector: "edge.internal", style: {"line-style": "dashed", "line-color": "#adb5bd", "target-arrow-color": "#adb5bd",
    "width": 1.5, "arrow-scale": 0.7}},
  {selector: "edge.loop", style: {"line-color": "#e8590c", "target-arrow-color": "#e8590c", "line-style": "solid", "width": 2.5}},
  {selector: "node.scope", style: {"background-color": "#e7f5ff", "border-color": "#1c7ed6",
    "border-width": 2, "border-style": "dashed"}},
  {selector: "node.scope.collapsed", style: {"background-color": "#d0ebff", "border-style": "solid"}},
  {selector: "edge.crossing", style: {"line-style": "dotted", "line-color": "#1c7ed6",
    "target-arrow-color": "#1c7ed6", "width": 1.5}},
];

function renderGraph(keep) {
  // (Re)build the drawing from the model: open scopes, focus. `keep`: an element to keep in view.
  const root = {nodes: state.dataflow.nodes, edges: state.dataflow.edges};
  const counts = {shown: countShown([], root)};
  const band = Math.max(900, ($("#graph").clientWidth - 60) / G.MIN_ZOOM);
  const elements = [];
  const layout = arrange([], root, band, layoutModel(counts.shown <= G.DETAIL), null);
  emitLayout([], layout, 0, 0, null, "", elements);
  // The drawing's bounds are the layout's (titles and labels inside it): asking Cytoscape would
  // measure every label of a big graph again.
  state.graph.bounds = {x1: 0, y1: 0, x2: layout.w, y2: layout.h, w: layout.w, h: layout.h};
  const zoom = state.cy ? state.cy.zoom() : G.MIN_ZOOM;
  if (state.cy) state.cy.destroy();
  hideTip();
  state.cy = cytoscape({container: $("#graph"), elements, style: GRAPH_STYLE, layout: {name: "preset", fit: false},
    autoungrabify: true,  // positions are the layout's: dragging a box would put it over its neighbours
    textureOnViewport: elements.length > 1500, hideEdgesOnViewport: elements.length > 3000});
  // The panel as tall as the drawing needs (at the largest zoom), within bounds: a small graph
  // leaves room for the rest, a big one pans.
  const height = Math.min(Math.max(layout.h * G.MAX_ZOOM + 40, 240), 620);
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
    view(state.graph.bounds);
  }
  graphNote(counts.shown);
  state.cy.on("tap", "node.port", (event) => selectLocation(event.target.data("key")));
  state.cy.on("tap", "node.scope", (event) => {
    if (event.target.hasClass("scope")) toggleScope(event.target.data("key"));  // not a port inside, bubbling up
  });
  state.cy.on("mouseover", "node.port, node.operator", (event) => showTip(event));
  state.cy.on("mousemove", "node.port, node.operator", (event) => showTip(event));
  state.cy.on("mouseout", "node", hideTip);
  state.cy.on("viewport", hideTip);
}

function graphNote(count) {
  const focus = state.graph.focus ? ` (only what holds ${state.selected ? locText(keyLocation(state.selected)) : "it"} back)` : "";
  $("#graph-note").textContent = `${count} of ${state.graph.scopes.get("").count} operators shown${focus}` +
    (state.graph.scopes.size > 1 ? " · tap a scope to open or close it" : "");
}

function view(box) {
  // Fit the drawing's bounds `box`, but never so small that labels are unreadable (then show its
  // top left part: the inputs, and pan from there) nor blown up beyond MAX_ZOOM.
  const cy = state.cy;
  if (!box.w || !box.h) return;
  const pad = 20;
  const fitted = Math.min((cy.width() - 2 * pad) / box.w, (cy.height() - 2 * pad) / box.h);
  cy.zoom(Math.min(Math.max(fitted, G.MIN_ZOOM), G.MAX_ZOOM));
  const zoom = cy.zoom();
  const wide = box.w * zoom > cy.width() - 2 * pad, tall = box.h * zoom > cy.height() - 2 * pad;
  cy.pan({x: wide ? pad - box.x1 * zoom : (cy.width() - box.w * zoom) / 2 - box.x1 * zoom,
    y: tall ? pad - box.y1 * zoom : (cy.height() - box.h * zoom) / 2 - box.y1 * zoom});
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

function paintGraph(frame) {
  // The frame's frontier on every drawn port (blue while non-empty; as many of its times as its
  // label's room holds, all of them on hover), its lag on operator inputs (amber, red), negative
  // counts (violations) as red diamonds; a port whose frontier changed since the last frame flashes.
  const cy = state.cy;
  if (!cy) return;
  const negative = new Set(frame.status.violations.map((v) => locKey(v.location)));
  const labels = state.graph.labels;
  cy.batch(() => cy.nodes(".port").forEach((el) => {
    const key = el.data("key");
    const row = state.rows.get(key);
    const times = row ? row.frontier : [];
    const text = fitFrontier(el.data("side"), times, el.data("budget"));
    el.data("label", text);
    el.toggleClass("live", times.length > 0);
    el.toggleClass("violation", negative.has(key));
    el.removeClass("lag-warn lag-bad");
    if (row && row.location.kind === "target" && row.lag_seconds !== null && row.lag_seconds >= LAG_WARN) {
      el.addClass(lagClass(row.lag_seconds));
    }
    const frontier = JSON.stringify(times);
    if (labels.has(key) && labels.get(key) !== frontier) {
      el.addClass("changed");
      setTimeout(() => el.removeClass("changed"), 900);
    }
    labels.set(key, frontier);
  }));
}

// ---------------------------------------------------------------- hover

function showTip(event) {
  // The whole of what a label may shorten: a port's full frontier, a box's full title.
  const el = event.target, tip = $("#graph-tip");
  let text;
  if (el.hasClass("port")) {
    const row = state.rows.get(el.data("key"));
    text = `${el.data("operator")} · ${el.data("side")} ${locText(keyLocation(el.data("key")))}\n` +
      (row ? `frontier ${frontierText(row.frontier, G.TIP_TIMES)}` : "no frame yet") +
      (row && row.frontier.length > 1 ? ` (${row.frontier.length} times)` : "");
  } else {
    text = el.data("full") + (el.hasClass("scope") ? (el.hasClass("collapsed") ? "\n(tap to open)" : "\n(tap to close)") : "");
  }
  tip.textContent = text;
  tip.hidden = false;
  const mouse = event.originalEvent;
  if (mouse) {
    const x = Math.min(mouse.clientX + 14, window.innerWidth - tip.offsetWidth - 8);
    tip.style.left = `${Math.max(4, x)}px`;
    tip.style.top = `${mouse.clientY + 16}px`;
  }
}

function hideTip() {
  const tip = $("#graph-tip");
  if (tip) tip.hidden = true;
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
  $("#focus").textContent = "Show only what holds it back";
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

function focusRefresh(frame) {
  // In focus mode, redraw when the set of operators holding the selected location back changes
  // (from a frame that explains the selected location: one asked before the selection is skipped).
  if (!$("#focus").classList.contains("on") || !state.selected || frame.asked !== state.selected) return;
  const keys = involved(frame.explained);
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
    if (on && !state.selected) {  // nothing selected: what holds the dataflow's output back (see defaultLocation)
      const fallback = state.frame && defaultLocation(state.frame);
      if (!fallback) return;
      selectLocation(fallback.key);
    }
    $("#focus").classList.toggle("on", on);
    $("#focus").textContent = on ? "Show the whole graph" : "Show only what holds it back";
    state.graph.focus = null;
    state.graph.focusKey = null;
    if (on && state.frame) focusRefresh(state.frame);
    if (!state.graph.focus) renderGraph();
  });

  $("#fit").addEventListener("click", () => state.cy && view(state.graph.bounds));
  $("#graph").addEventListener("mouseleave", hideTip);  // Cytoscape says nothing when the pointer leaves it
  $("#collapse").addEventListener("click", () => { state.graph.expanded.clear(); renderGraph(); });
  $("#expand").addEventListener("click", () => {
    for (const key of state.graph.scopes.keys()) if (key) state.graph.expanded.add(key);
    renderGraph();
  });
}
