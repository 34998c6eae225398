// The built-in dashboard: plain JavaScript, no build step. Cytoscape.js draws the graph and
// uPlot the plots (both vendored under /static/vendor). Data come from the /v1 API with the
// user's bearer token; the live frontier from the SSE stream, read with fetch() because
// EventSource cannot send an Authorization header. See docs/dashboard.md.
"use strict";

const TOKEN_KEY = "tracker.token";
const MAX_SERIES = 10;        // frontier plot: one line per operator input, at most this many
const MAX_POINTS = 2000;      // per plot; older points are dropped
const MAX_EXPLAINED = 30;     // "held back by" queries per refresh
const MAX_ZOOM = 1.1;         // a small graph is not blown up beyond this (its labels stay readable)
// Seconds after which a lag turns amber, then red; ?lag_warn=&lag_bad= in the page's URL override them.
const QUERY = new URLSearchParams(location.search);
const LAG_WARN = Number(QUERY.get("lag_warn")) || 5, LAG_BAD = Number(QUERY.get("lag_bad")) || 30;
const $ = (sel) => document.querySelector(sel);

const state = {
  token: localStorage.getItem(TOKEN_KEY),
  dataflow: null,           // GET /v1/dataflows/{id}
  frontiers: new Map(),     // "node:port:kind" -> Map(timeKey -> time array)
  version: 0,
  abort: null,              // AbortController of the current dataflow's requests and stream
  cy: null,
  plots: {frontier: null, throughput: null},
  series: {keys: [], x: [], ys: []},
  rate: {x: [], batches: [], lastVersion: null, lastAt: null},
  lag: new Map(),           // "node:port:kind" -> GET .../lag row
  names: new Map(),         // "path/node" -> operator name
  selected: null,
  explainTimer: null,
};
window.dashboard = state; // for debugging in the console (and the browser test)

// ---------------------------------------------------------------- helpers

// A location of a nested scope carries its scope path (`scope`, absent or [] at the root); its
// key is "3,1/node:port:kind", a root location's "node:port:kind" as in a flat dataflow.
const scopeOf = (l) => (l.scope && l.scope.length ? l.scope : []);
const locKey = (l) => (scopeOf(l).length ? `${scopeOf(l).join(",")}/` : "") + `${l.node}:${l.port}:${l.kind}`;
const locText = (l) => (scopeOf(l).length ? `[${scopeOf(l).join(",")}]` : "") + `(${l.node},${l.port},${l.kind})`;
const timeText = (t) => `(${t.join(", ")})`;
const portId = (l) => `${l.kind === "target" ? "t" : "s"}-${l.node}-${l.port}` +
  (scopeOf(l).length ? `-in-${scopeOf(l).join("_")}` : "");
const opId = (path, id) => (path.length ? `op-${path.join("_")}-${id}` : `op-${id}`);

function keyLocation(key) {
  // The inverse of locKey.
  const slash = key.indexOf("/");
  const scope = slash < 0 ? [] : key.slice(0, slash).split(",").map(Number);
  const [node, port, kind] = key.slice(slash + 1).split(":");
  return scope.length ? {scope, node: Number(node), port: Number(port), kind} : {node, port, kind};
}

function compareTimes(a, b) {
  for (let i = 0; i < Math.min(a.length, b.length); i++) if (a[i] !== b[i]) return a[i] - b[i];
  return a.length - b.length;
}

function frontierOf(key) {
  return [...(state.frontiers.get(key) || new Map()).values()].sort(compareTimes);
}

function frontierText(times) {
  return times.length ? "{" + times.map(timeText).join(", ") + "}" : "{} (done)";
}

class AuthError extends Error {}

async function api(path, options = {}) {
  const headers = {...(options.headers || {}), Authorization: `Bearer ${state.token}`};
  const response = await fetch(path, {...options, headers});
  if (response.status === 401) throw new AuthError("the token was refused");
  return response;
}

async function apiJson(path, options = {}) {
  const response = await api(path, options);
  if (!response.ok) throw new Error(`${path}: HTTP ${response.status} ${await response.text()}`);
  return response.json();
}

function setConn(text, cls) {
  const pill = $("#conn");
  pill.textContent = text;
  pill.className = "pill " + (cls || "");
}

function handleError(error) {
  if (error.name === "AbortError") return;
  if (error instanceof AuthError) {
    localStorage.removeItem(TOKEN_KEY);
    state.token = null;
    showLogin("That token was refused (401). Enter the admin token or a dataflow's token.");
    return;
  }
  console.error(error);
  setConn(String(error.message || error).slice(0, 80), "error");
}

// ---------------------------------------------------------------- token

function showLogin(message) {
  $("#login").hidden = false;
  $("#app").hidden = true;
  $("#forget-token").hidden = true;
  $("#login-error").textContent = message || "";
  $("#token").focus();
}

async function start() {
  if (!state.token) return showLogin();
  $("#login").hidden = true;
  $("#app").hidden = false;
  $("#forget-token").hidden = false;
  try {
    await loadList();
    const wanted = decodeURIComponent(location.hash.slice(1));
    if (wanted) await openDataflow(wanted);
  } catch (error) {
    handleError(error);
  }
}

$("#token-form").addEventListener("submit", (event) => {
  event.preventDefault();
  state.token = $("#token").value.trim();
  localStorage.setItem(TOKEN_KEY, state.token);
  $("#token").value = "";
  start();
});

$("#forget-token").addEventListener("click", () => {
  localStorage.removeItem(TOKEN_KEY);
  state.token = null;
  if (state.abort) state.abort.abort();
  showLogin();
});

$("#refresh").addEventListener("click", () => loadList().catch(handleError));
window.addEventListener("hashchange", () => {
  const id = decodeURIComponent(location.hash.slice(1));
  if (id && (!state.dataflow || state.dataflow.id !== id)) openDataflow(id).catch(handleError);
});

// ---------------------------------------------------------------- dataflow list

async function loadList() {
  const flows = await apiJson("/v1/dataflows");
  const list = $("#dataflows");
  list.replaceChildren();
  for (const flow of flows) {
    const item = document.createElement("li");
    item.dataset.id = flow.id;
    item.className = state.dataflow && state.dataflow.id === flow.id ? "selected" : "";
    item.append(flow.name);
    const meta = document.createElement("small");
    meta.textContent = `${flow.id.slice(0, 8)} · arity ${flow.timestamp_arity} · v${flow.version}`;
    item.append(meta);
    item.addEventListener("click", () => { location.hash = encodeURIComponent(flow.id); });
    list.append(item);
  }
  if (!flows.length) list.innerHTML = '<li class="hint">none registered yet</li>';
}

async function openDataflow(id) {
  if (state.abort) state.abort.abort();
  const abort = new AbortController();
  state.abort = abort;
  state.frontiers = new Map();
  state.selected = null;
  state.rate = {x: [], batches: [], lastVersion: null, lastAt: null};
  state.lag = new Map();
  for (const item of document.querySelectorAll("#dataflows li")) {
    item.classList.toggle("selected", item.dataset.id === id);
  }
  const flow = await apiJson(`/v1/dataflows/${encodeURIComponent(id)}`, {signal: abort.signal});
  state.dataflow = flow;
  state.scopes = flow.nodes.some((n) => n.scope)
    ? await apiJson(`/v1/dataflows/${encodeURIComponent(id)}/scopes`, {signal: abort.signal}) : [];
  $("#empty").hidden = true;
  $("#view").hidden = false;
  $("#title").textContent = `${flow.name} (${flow.id})`;
  $("#explain").textContent = "";
  drawGraph(flow);
  buildFrontierTable(flow);
  await loadHistory(flow, abort.signal);
  await refreshLag(flow, abort.signal);  // before the first "held back by" refresh, which shows names and lags
  streamFrontier(flow, abort.signal);  // runs until the dataflow changes (reconnects on its own)
  pollThroughput(flow, abort.signal);
}

// ---------------------------------------------------------------- graph drawing

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

function nodeConnections(node, path = []) {
  // Omitted connections mean every input to every output with the zero summary (DESIGN 3).
  if (node.connections) return node.connections;
  const zero = new Array(scopeArity(path)).fill(0);
  const all = [];
  for (let i = 0; i < node.inputs; i++) for (let o = 0; o < node.outputs; o++) {
    all.push({input: i, output: o, summaries: [zero]});
  }
  return all;
}

function ranks(flow, nested = false) {
  // Breadth-first depth from the operators without inputs (inside a scope: from those its
  // boundary, node 0, feeds): left to right, loops go back.
  const next = new Map(flow.nodes.map((n) => [n.id, []]));
  if (nested) next.set(0, []);
  for (const e of flow.edges) if (next.has(e.source.node)) next.get(e.source.node).push(e.target.node);
  const rank = new Map();
  let queue = nested ? [...new Set(next.get(0))].filter((id) => id !== 0)
    : flow.nodes.filter((n) => n.inputs === 0).map((n) => n.id);
  if (!queue.length && flow.nodes.length) queue = [flow.nodes[0].id];
  for (const id of queue) rank.set(id, 0);
  while (queue.length) {
    const id = queue.shift();
    for (const to of next.get(id) || []) {
      if (!rank.has(to)) { rank.set(to, rank.get(id) + 1); queue.push(to); }
    }
  }
  for (const n of flow.nodes) if (!rank.has(n.id)) rank.set(n.id, 0);
  return rank;
}

const ROW_GAP = 50, PORT = 46, PAD = 50;
// A nested dataflow's frontiers (times of several coordinates, shown beside the ports) need more room.
const spread = () => ((state.scopes || []).length ? {col: 200, op: 300} : {col: 80, op: 220});

function nodeSize(path, node) {
  // An operator's box, or a scope's: its inside laid out, with room for its own ports.
  if (!node.scope) return {w: spread().op, h: Math.max(node.inputs, node.outputs, 1) * PORT + 40};
  const inner = arrange([...path, node.id], node.scope);
  return {w: inner.w + 2 * PAD + 60, h: Math.max(inner.h, Math.max(node.inputs, node.outputs, 1) * PORT) + 2 * PAD};
}

function arrange(path, body) {
  // Columns by rank, each node's size known (scopes recursively); positions relative to (0, 0).
  const rank = ranks(body, path.length > 0);
  const columns = [];
  for (const node of [...body.nodes].sort((a, b) => a.id - b.id)) {
    const r = rank.get(node.id);
    while (columns.length <= r) columns.push([]);
    columns[r].push({node, ...nodeSize(path, node)});
  }
  const placed = [];
  let x = 0, height = 0;
  for (const column of columns) {
    const width = Math.max(...column.map((c) => c.w), 0);
    let y = 0;
    for (const c of column) { placed.push({...c, x: x + width / 2, y: y + c.h / 2}); y += c.h + ROW_GAP; }
    height = Math.max(height, y - ROW_GAP);
    x += width + spread().col;
  }
  return {w: Math.max(x - spread().col, 0), h: height, placed};
}

function scopeSummaryText(path) {
  const info = (state.scopes || []).find((s) => s.scope.join(",") === path.join(","));
  if (!info) return "";
  const parts = info.summaries.map((r) => `in ${r.input}→out ${r.output} ${r.summaries.map((t) => "+" + timeText(t)).join(" ")}`);
  return ` · ${info.kind} · ${parts.join("; ") || "no path through"}`;
}

function portElement(loc, parent, side, x, y, extra = {}) {
  return {data: {id: portId(loc), parent, key: locKey(loc), side, label: side, frontier: "", ...extra},
    position: {x, y}, classes: "port"};
}

function emitScope(path, body, ox, oy, parent, elements) {
  // Operators and scopes of one scope, centred on (ox, oy); a scope node is a compound node
  // holding its own ports and its inside (boundary ports, ingress and egress edges included).
  const layout = arrange(path, body);
  const left = ox - layout.w / 2, top = oy - layout.h / 2;
  for (const {node, x, y, w} of layout.placed) {
    const cx = left + x, cy = top + y, id = opId(path, node.id);
    const label = `${node.name || (node.scope ? "scope" : "operator")} #${node.id}` +
      (node.scope ? scopeSummaryText([...path, node.id]) : "");
    elements.push({data: {id, label, ...(parent ? {parent} : {})}, classes: node.scope ? "operator scope" : "operator"});
    const half = node.scope ? w / 2 - 20 : spread().op / 2 - 50;
    const place = (count, i) => cy + (i - (count - 1) / 2) * PORT;
    for (let p = 0; p < node.inputs; p++) {
      elements.push(portElement({scope: path, node: node.id, port: p, kind: "target"}, id, `in ${p}`, cx - half,
        place(node.inputs, p), {own: "yes"}));
    }
    for (let p = 0; p < node.outputs; p++) {
      elements.push(portElement({scope: path, node: node.id, port: p, kind: "source"}, id, `out ${p}`, cx + half,
        place(node.outputs, p), {own: "yes"}));
    }
    if (node.scope) {
      const inner = [...path, node.id];
      const gap = w / 2 - PAD;
      for (let p = 0; p < node.inputs; p++) {  // the boundary's output p: the scope's input p, inside
        const loc = {scope: inner, node: 0, port: p, kind: "source"};
        elements.push(portElement(loc, id, `enter ${p}`, cx - gap, place(node.inputs, p)));
        elements.push({data: {id: `ingress-${inner.join("_")}-${p}`, source: portId({scope: path, node: node.id, port: p,
          kind: "target"}), target: portId(loc)}, classes: "edge crossing"});
      }
      for (let p = 0; p < node.outputs; p++) {
        const loc = {scope: inner, node: 0, port: p, kind: "target"};
        elements.push(portElement(loc, id, `leave ${p}`, cx + gap, place(node.outputs, p)));
        elements.push({data: {id: `egress-${inner.join("_")}-${p}`, source: portId(loc), target: portId({scope: path,
          node: node.id, port: p, kind: "source"})}, classes: "edge crossing"});
      }
      emitScope(inner, node.scope, cx, cy, id, elements);
      continue;
    }
    for (const c of nodeConnections(node, path)) {
      const advances = c.summaries.some((t) => t.some((v) => v > 0));
      elements.push({data: {
        id: `c-${id}-${c.input}-${c.output}`,
        source: portId({scope: path, node: node.id, port: c.input, kind: "target"}),
        target: portId({scope: path, node: node.id, port: c.output, kind: "source"}),
        label: advances ? c.summaries.map((t) => "+" + timeText(t)).join(" ") : "",
      }, classes: advances ? "internal loop" : "internal"});
    }
  }
  const rank = ranks(body, path.length > 0);
  body.edges.forEach((e, i) => {
    const back = e.source.node !== 0 && e.target.node !== 0 && rank.get(e.target.node) <= rank.get(e.source.node);
    elements.push({data: {id: `e-${path.length ? path.join("_") + "-" : ""}${i}`,
      source: portId({scope: path, ...e.source, kind: "source"}),
      target: portId({scope: path, ...e.target, kind: "target"})}, classes: back ? "edge back" : "edge"});
  });
}

function drawGraph(flow) {
  const elements = [];
  emitScope([], flow, 0, 0, null, elements);
  if (state.cy) state.cy.destroy();
  state.cy = cytoscape({
    container: $("#graph"),
    elements,
    layout: {name: "preset", fit: true, padding: 30},
    style: [
      {selector: "node.operator", style: {
        "label": "data(label)", "text-valign": "top", "text-halign": "center", "font-weight": "bold",
        "background-color": "#f1f3f5", "border-color": "#868e96", "border-width": 1, "padding": "18px",
        "shape": "round-rectangle", "font-size": 13}},
      {selector: "node.port", style: {
        "label": "data(label)", "text-wrap": "wrap", "font-size": 11, "width": 16, "height": 16,
        "background-color": "#adb5bd", "text-valign": "center", "text-margin-y": 0,
        "text-background-color": "#fff", "text-background-opacity": 0.85, "text-background-padding": 2}},
      {selector: "node.port[side ^= 'in']", style: {"text-halign": "left", "text-margin-x": -4}},
      {selector: "node.port[side ^= 'out']", style: {"text-halign": "right", "text-margin-x": 4}},
      {selector: "node.port.live", style: {"background-color": "#4263eb"}},
      {selector: "node.port.lag-warn", style: {"border-width": 3, "border-color": "#f08c00"}},
      {selector: "node.port.lag-bad", style: {"border-width": 3, "border-color": "#e03131"}},
      {selector: "node.port.changed", style: {"background-color": "#fab005", "border-width": 3,
        "border-color": "#e67700"}},
      {selector: "node.port:selected", style: {"border-width": 3, "border-color": "#1d2433"}},
      {selector: "edge", style: {"width": 2, "curve-style": "bezier", "target-arrow-shape": "triangle",
        "line-color": "#495057", "target-arrow-color": "#495057", "arrow-scale": 0.9}},
      {selector: "edge.back", style: {"curve-style": "unbundled-bezier", "control-point-distances": [-110],
        "control-point-weights": [0.5]}},
      {selector: "edge.internal", style: {"line-style": "dashed", "line-color": "#adb5bd",
        "target-arrow-color": "#adb5bd", "width": 1.5, "label": "data(label)", "font-size": 11,
        "color": "#e8590c", "text-background-color": "#fff", "text-background-opacity": 0.9}},
      {selector: "edge.loop", style: {"line-color": "#e8590c", "target-arrow-color": "#e8590c",
        "line-style": "solid", "width": 2.5}},
      {selector: "node.scope", style: {"background-color": "#e7f5ff", "border-color": "#1c7ed6",
        "border-width": 2, "border-style": "dashed", "text-wrap": "wrap", "text-max-width": "600px"}},
      {selector: "node.scope.collapsed", style: {"background-color": "#d0ebff"}},
      {selector: "edge.crossing", style: {"line-style": "dotted", "line-color": "#1c7ed6",
        "target-arrow-color": "#1c7ed6", "width": 1.5}},
    ],
  });
  // fit() blows a small graph up until its labels are huge: cap the zoom and centre it.
  if (state.cy.zoom() > MAX_ZOOM) { state.cy.zoom(MAX_ZOOM); state.cy.center(); }
  state.cy.on("tap", "node.port", (event) => selectLocation(event.target.data("key")));
  // A tap on a scope collapses it to its own ports (its summary stays in its label), or opens it.
  state.cy.on("tap", "node.scope", (event) => {
    if (event.target.hasClass("scope")) toggleScope(event.target);  // not a tap on a port inside, bubbling up
  });
}

function toggleScope(scope) {
  const collapsed = !scope.hasClass("collapsed");
  scope.toggleClass("collapsed", collapsed);
  const inside = scope.descendants().filter((el) => !(el.parent().same(scope) && el.data("own") === "yes"));
  inside.style("display", collapsed ? "none" : "element");
  // A collapsed scope inside a scope that opens again stays collapsed.
  if (!collapsed) scope.descendants(".scope.collapsed").forEach((inner) => {
    inner.removeClass("collapsed");
    toggleScope(inner);
  });
}

function showFrontier(key, changed) {
  const times = frontierOf(key);
  const text = frontierText(times);
  if (state.cy) {
    const el = state.cy.getElementById(portId(keyLocation(key)));
    if (el.nonempty()) {
      el.data("frontier", text);
      el.data("label", `${el.data("side")} ${times.length ? frontierText(times) : "{}"}`);
      el.toggleClass("live", times.length > 0);
      if (changed) {
        el.addClass("changed");
        setTimeout(() => el.removeClass("changed"), 1500);
      }
    }
  }
  const row = document.querySelector(`#frontiers tr[data-loc="${key}"]`);
  if (row) {
    row.querySelector("td.frontier").textContent = text;
    if (changed) {
      row.classList.add("changed");
      setTimeout(() => row.classList.remove("changed"), 1500);
    }
  }
}

function buildFrontierTable(flow) {
  const body = $("#frontiers tbody");
  body.replaceChildren();
  const addRow = (loc, text) => {
    const row = document.createElement("tr");
    row.dataset.loc = locKey(loc);
    row.innerHTML = "<td></td><td></td><td class='frontier'></td><td class='lag'></td>";
    row.cells[0].textContent = locText(loc);
    row.cells[1].textContent = text;
    row.addEventListener("click", () => selectLocation(locKey(loc)));
    body.append(row);
  };
  const addScope = (path, scope, boundary) => {  // root first, then each scope after its node
    if (boundary) {
      for (let port = 0; port < boundary.inputs; port++) addRow({scope: path, node: 0, port, kind: "source"}, `enter ${port}`);
      for (let port = 0; port < boundary.outputs; port++) addRow({scope: path, node: 0, port, kind: "target"}, `leave ${port}`);
    }
    for (const node of [...scope.nodes].sort((a, b) => a.id - b.id)) {
      const name = node.name || (node.scope ? "scope" : "operator");
      for (const [kind, count] of [["target", node.inputs], ["source", node.outputs]]) {
        for (let port = 0; port < count; port++) {
          addRow({scope: path, node: node.id, port, kind}, `${name} ${kind === "target" ? "in" : "out"} ${port}`);
        }
      }
      if (node.scope) addScope([...path, node.id], node.scope, node);
    }
  };
  addScope([], flow, null);
}

// ---------------------------------------------------------------- frontier state and stream

function applySnapshot(snapshot) {
  state.frontiers = new Map();
  for (const row of snapshot.locations) {
    const times = new Map(row.frontier.map((t) => [JSON.stringify(t), t]));
    state.frontiers.set(locKey(row.location), times);
  }
  state.version = snapshot.version;
  for (const row of snapshot.locations) showFrontier(locKey(row.location), false);
}

function applyChanges(event) {
  const touched = new Set();
  for (const c of event.changes) {
    const key = locKey(c.location);
    if (!state.frontiers.has(key)) state.frontiers.set(key, new Map());
    const times = state.frontiers.get(key);
    if (c.diff > 0) times.set(JSON.stringify(c.time), c.time); else times.delete(JSON.stringify(c.time));
    touched.add(key);
  }
  state.version = event.version;
  for (const key of touched) showFrontier(key, true);
}

function parseSse(block) {
  const event = {event: "message", data: [], id: null};
  for (const line of block.split("\n")) {
    if (!line || line.startsWith(":")) continue;  // comments are keep-alive pings
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    const value = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
    if (field === "event") event.event = value;
    else if (field === "data") event.data.push(value);
    else if (field === "id") event.id = value;
  }
  return event;
}

async function streamFrontier(flow, signal) {
  let lastId = null;
  let delay = 500;
  while (!signal.aborted) {
    try {
      const headers = {Accept: "text/event-stream"};
      if (lastId !== null) headers["Last-Event-ID"] = lastId;  // resume without gap or duplicate
      const response = await api(`/v1/dataflows/${encodeURIComponent(flow.id)}/frontier/stream`, {headers, signal});
      if (!response.ok) throw new Error(`stream: HTTP ${response.status}`);
      setConn("live", "live");
      delay = 500;
      const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
      let buffer = "";
      for (;;) {
        const {value, done} = await reader.read();
        if (done) break;
        buffer += value;
        // Normalise CRLF; hold back a trailing CR, its LF may be in the next chunk.
        const hold = buffer.endsWith("\r") ? 1 : 0;
        let text = buffer.slice(0, buffer.length - hold).replace(/\r\n?/g, "\n");
        let cut;
        while ((cut = text.indexOf("\n\n")) >= 0) {
          const event = parseSse(text.slice(0, cut));
          text = text.slice(cut + 2);
          if (event.id !== null) lastId = event.id;
          if (!event.data.length) continue;
          const data = JSON.parse(event.data.join("\n"));
          if (event.event === "snapshot") { applySnapshot(data); sampleFrontier(Date.now() / 1000); }
          else if (event.event === "changes") { applyChanges(data); sampleFrontier(Date.now() / 1000); }
          refreshStatus();
          scheduleExplain();
        }
        buffer = text + (hold ? "\r" : "");
      }
      throw new Error("stream closed");
    } catch (error) {
      if (signal.aborted) return;
      if (error instanceof AuthError) return handleError(error);
      setConn("reconnecting…", "error");
      await new Promise((resolve) => setTimeout(resolve, delay));
      delay = Math.min(delay * 2, 10000);
    }
  }
}

function refreshStatus() {
  const live = [...state.frontiers.values()].filter((t) => t.size > 0).length;
  $("#status").textContent = `version ${state.version} · ${live} of ${state.frontiers.size} locations ` +
    `have a non-empty frontier · arity ${state.dataflow.timestamp_arity}`;
}

// ---------------------------------------------------------------- plots

function minEpoch(keys) {
  // The earliest epoch (first coordinate: the root's time, in every scope) still open at any
  // of an operator's inputs; null once they are all done.
  let best = null;
  for (const key of keys) for (const t of frontierOf(key)) if (best === null || t[0] < best) best = t[0];
  return best;
}

function plotWidth() {
  return Math.max(320, Math.floor(($("#view").clientWidth - 40) / 2));
}

function makePlot(target, title, labels, colors, data, stepped) {
  // A frontier holds its value until the next change: drawn as steps, not slopes. With no
  // data yet the time axis shows the last minute (uPlot alone would pick an arbitrary range).
  const paths = stepped ? uPlot.paths.stepped({align: 1}) : undefined;
  // Both plots span the same wall time (from the earliest point either has to now), so that
  // epochs and throughput line up; with no data yet, the last minute.
  const shared = (u, min, max) => {
    const now = Date.now() / 1000;
    const firsts = [state.series.x[0], state.rate.x[0], min].filter((v) => v !== undefined && v !== null);
    const from = firsts.length ? Math.min(...firsts) : now - 60;
    return [Math.min(from, now - 60 * (firsts.length ? 0 : 1)), Math.max(now, max || now)];
  };
  const series = [{label: "time"}, ...labels.map((label, i) => ({
    label, stroke: colors[i % colors.length], width: 2, spanGaps: false, paths, points: {show: true, size: 4}}))];
  return new uPlot({width: plotWidth(), height: 220, title, series, scales: {x: {time: true, range: shared}},
    axes: [{}, {label: title}], legend: {live: false}}, data, target);
}

const COLORS = ["#4263eb", "#e8590c", "#2f9e44", "#ae3ec9", "#1098ad", "#f08c00", "#c2255c", "#5c940d",
  "#364fc7", "#862e9c"];

function resetFrontierPlot() {
  // One series per root operator with inputs (up to MAX_SERIES): its earliest open epoch.
  const operators = state.dataflow.nodes.filter((n) => n.inputs > 0).slice(0, MAX_SERIES);
  const keys = operators.map((n) => `${n.id}`);
  const inputs = operators.map((n) => Array.from({length: n.inputs}, (_, p) => locKey({node: n.id, port: p, kind: "target"})));
  state.series = {keys, inputs, x: [], ys: keys.map(() => [])};
  if (state.plots.frontier) state.plots.frontier.destroy();
  const labels = operators.map((n) => `${n.name || "operator"} #${n.id}`);
  state.plots.frontier = makePlot($("#frontier-plot"), "earliest open epoch", labels, COLORS,
    [[], ...keys.map(() => [])], true);
}

function sampleFrontier(at, redraw = true) {
  // A sample whose values equal the previous one's only moves the last point to `at` (the
  // step then reaches the present), so that idle time costs no points.
  const s = state.series;
  const values = s.inputs.map((keys) => minEpoch(keys));
  const n = s.x.length;
  if (n >= 2 && s.ys.every((y, i) => y[n - 1] === values[i] && y[n - 2] === values[i])) {
    s.x[n - 1] = Math.max(s.x[n - 1], at);
  } else {
    s.x.push(Math.max(at, n ? s.x[n - 1] : at));
    values.forEach((v, i) => s.ys[i].push(v));
  }
  if (s.x.length > MAX_POINTS) { s.x.shift(); s.ys.forEach((y) => y.shift()); }
  if (redraw) state.plots.frontier.setData([s.x, ...s.ys]);
}

function withIdleSeconds(rows) {
  // Per-second counts exist only for seconds with batches: an idle stretch gets zeros at its
  // ends, so the line drops to 0 there instead of running straight across it.
  const x = [], batches = [];
  rows.forEach((r, i) => {
    if (i > 0 && r.second - rows[i - 1].second > 1) {
      x.push(rows[i - 1].second + 1); batches.push(0);
      if (r.second - rows[i - 1].second > 2) { x.push(r.second - 1); batches.push(0); }
    }
    x.push(r.second); batches.push(r.batches);
  });
  if (x.length) { x.push(x[x.length - 1] + 1); batches.push(0); }
  return {x, batches};
}

function resetThroughputPlot(history) {
  const filled = withIdleSeconds(history);
  state.rate.x = filled.x;
  state.rate.batches = filled.batches;
  if (state.plots.throughput) state.plots.throughput.destroy();
  state.plots.throughput = makePlot($("#throughput-plot"), "batches/s", ["batches/s"], ["#2f9e44"],
    [state.rate.x, state.rate.batches], true);
}

async function loadHistory(flow, signal) {
  resetFrontierPlot();
  let history = {frontier_changes: [], throughput: []};
  try {
    history = await apiJson(`/dashboard/api/dataflows/${encodeURIComponent(flow.id)}/history`, {signal});
  } catch (error) {
    if (error instanceof AuthError || error.name === "AbortError") throw error;
    console.warn("no history", error);  // the plots then start with the live stream
  }
  resetThroughputPlot(history.throughput);
  const changes = history.frontier_changes;
  if (!changes.length || !history.base) return;
  // Replay the compacted changes forward from the frontier just before the first of them,
  // which the history route folds from the older rows (the Delta tables survive restarts;
  // the service's in-memory history does not reach back that far after one).
  state.frontiers = new Map();
  for (const row of history.base.locations) {
    state.frontiers.set(locKey(row.location), new Map(row.frontier.map((t) => [JSON.stringify(t), t])));
  }
  // The state before the first compacted change held since that version was applied; for
  // version 0 or 1 that is the registration.
  const first = changes[0].version <= 1 ? Date.parse(flow.created_at) / 1000 : changes[0].at;
  sampleFrontier(Math.min(first, changes[0].at), false);
  let i = 0;
  while (i < changes.length) {
    const version = changes[i].version, at = changes[i].at, batch = [];
    while (i < changes.length && changes[i].version === version) batch.push(changes[i++]);
    for (const c of batch) {
      const key = locKey(c.location);
      if (!state.frontiers.has(key)) state.frontiers.set(key, new Map());
      if (c.diff > 0) state.frontiers.get(key).set(JSON.stringify(c.time), c.time);
      else state.frontiers.get(key).delete(JSON.stringify(c.time));
    }
    sampleFrontier(at, false);
  }
  state.plots.frontier.setData([state.series.x, ...state.series.ys]);
}

async function pollThroughput(flow, signal) {
  // Batches per second from the dataflow's version (it counts applied batches), every 2 s;
  // the lag with it.
  let polls = 0;
  while (!signal.aborted) {
    try {
      const now = await apiJson(`/v1/dataflows/${encodeURIComponent(flow.id)}`, {signal});
      const at = Date.now() / 1000;
      const r = state.rate;
      if (r.lastVersion !== null && at > r.lastAt) {
        // The rate over [lastAt, at), drawn as a step from lastAt (after the history's last second).
        r.x.push(r.x.length ? Math.max(r.lastAt, r.x[r.x.length - 1] + 0.001) : r.lastAt);
        r.batches.push((now.version - r.lastVersion) / (at - r.lastAt));
        if (r.x.length > MAX_POINTS) { r.x.shift(); r.batches.shift(); }
        state.plots.throughput.setData([r.x, r.batches]);
      }
      r.lastVersion = now.version;
      r.lastAt = at;
      sampleFrontier(at);  // the steps reach the present even while nothing changes
      await refreshLag(flow, signal);
      if (++polls % 3 === 0) scheduleExplain();  // the blockers' ages grow while nothing changes
      const meta = document.querySelector(`#dataflows li[data-id="${flow.id}"] small`);
      if (meta) meta.textContent = `${flow.id.slice(0, 8)} · arity ${flow.timestamp_arity} · v${now.version}`;
    } catch (error) {
      if (signal.aborted) return;
      if (error instanceof AuthError) return handleError(error);
    }
    await new Promise((resolve) => setTimeout(resolve, 2000));
  }
}

// ---------------------------------------------------------------- lag

const lagText = (seconds) => (seconds === null || seconds === undefined ? "—"
  : seconds < 60 ? `${seconds.toFixed(1)} s` : seconds < 3600 ? `${(seconds / 60).toFixed(1)} min`
    : `${(seconds / 3600).toFixed(1)} h`);
const lagClass = (seconds) => (seconds === null || seconds === undefined ? "lag-none"
  : seconds < LAG_WARN ? "lag-ok" : seconds < LAG_BAD ? "lag-warn" : "lag-bad");

function paintLag(cell, seconds) {
  cell.textContent = lagText(seconds);
  cell.className = "lag " + lagClass(seconds);
}

async function refreshLag(flow, signal) {
  // GET .../lag: how long each frontier has gone without changing, and its oldest pointstamp.
  const report = await apiJson(`/v1/dataflows/${encodeURIComponent(flow.id)}/lag`, {signal});
  state.lag = new Map(report.locations.map((row) => [locKey(row.location), row]));
  for (const [key, row] of state.lag) {
    for (const cell of document.querySelectorAll(`#frontiers tr[data-loc="${key}"] td.lag, #held tr[data-loc="${key}"] td.lag`)) {
      paintLag(cell, row.lag_seconds);
    }
    if (state.cy) {
      const el = state.cy.getElementById(portId(keyLocation(key)));
      if (el.nonempty()) {
        el.removeClass("lag-warn lag-bad");
        if (row.location.kind === "target" && row.lag_seconds !== null && row.lag_seconds >= LAG_WARN) {
          el.addClass(lagClass(row.lag_seconds));
        }
      }
    }
  }
  const worst = report.max_lag_seconds;
  $("#lag-summary").textContent = worst === null ? "every frontier is empty: nothing is awaited"
    : `longest wait: ${lagText(worst)}`;
  $("#lag-summary").className = "hint " + lagClass(worst);
}

// ---------------------------------------------------------------- held back by (explain)

function scheduleExplain() {
  clearTimeout(state.explainTimer);
  state.explainTimer = setTimeout(() => refreshHeld().catch(handleError), 300);
}

async function explainFor(key, time, signal) {
  const loc = keyLocation(key);
  const query = new URLSearchParams({node: loc.node, port: loc.port, kind: loc.kind, time: time.join(",")});
  if (loc.scope) query.set("scope", loc.scope.join(","));
  return apiJson(`/v1/dataflows/${encodeURIComponent(state.dataflow.id)}/frontier/explain?${query}`, {signal});
}

async function refreshHeld() {
  const signal = state.abort.signal;
  const version = state.version;
  const keys = [...state.frontiers.keys()].filter((k) => state.frontiers.get(k).size > 0).slice(0, MAX_EXPLAINED);
  const rows = [];
  for (const key of keys) {
    const times = frontierOf(key);
    // What holds a location back at its earliest frontier time: the pointstamps that could
    // still result in that time there.
    const answer = await explainFor(key, times[0], signal);
    rows.push({key, times, answer});
    if (state.version !== version) return scheduleExplain();  // outdated: a newer refresh follows
  }
  const body = $("#held tbody");
  body.replaceChildren();
  for (const {key, times, answer} of rows) {
    const row = document.createElement("tr");
    row.dataset.loc = key;
    row.innerHTML = "<td></td><td class='frontier'></td><td class='lag'></td><td></td>";
    const lag = state.lag.get(key);
    row.cells[0].textContent = locText(keyLocation(key)) + (lag ? ` ${lag.operator} ${lag.port}` : "");
    row.cells[1].textContent = frontierText(times);
    paintLag(row.cells[2], lag ? lag.lag_seconds : null);
    // Each blocker: count × where@time, its operator and port, the worker that last reported
    // it and how long it has been live (its age).
    row.cells[3].textContent = answer.blockers.map((b) =>
      `${b.count} × ${locText(b.location)}@${timeText(b.time)}` +
      (b.summary === null ? ` via ${b.path.filter((p) => p.via === "ingress" || p.via === "egress").map((p) => p.via).join(", ")}`
        : b.summary.some((v) => v > 0) ? ` via +${timeText(b.summary)}` : "") +
      ` — ${b.operator} ${b.port}` + (b.worker ? ` · worker ${b.worker}` : " · worker —") +
      (b.age_seconds === null || b.age_seconds === undefined ? "" : ` · ${lagText(b.age_seconds)} old`)).join("; ") ||
      "nothing";
    row.classList.toggle("selected", key === state.selected);
    row.addEventListener("click", () => selectLocation(key));
    body.append(row);
  }
  if (state.selected) showExplanation(state.selected);
}

async function selectLocation(key) {
  state.selected = key;
  for (const row of document.querySelectorAll("#held tr, #frontiers tr")) {
    row.classList.toggle("selected", row.dataset.loc === key);
  }
  await showExplanation(key).catch(handleError);
}

async function showExplanation(key) {
  const times = frontierOf(key);
  if (!times.length) {
    $("#explain").textContent = `${locText(keyLocation(key))}: empty frontier, nothing holds it back.`;
    return;
  }
  const answer = await explainFor(key, times[0], state.abort.signal);
  $("#explain").textContent = [answer.explanation, ...answer.blockers.map((b) => "• " + b.text)].join("\n");
}

window.addEventListener("resize", () => {
  for (const plot of Object.values(state.plots)) if (plot) plot.setSize({width: plotWidth(), height: 220});
});

start();
