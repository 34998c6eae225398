// The built-in dashboard's core: the token, the dataflow list, the frames and the panels drawn
// from them. Plain JavaScript, no build step; dashboard-graph.js draws the graph and
// dashboard-plots.js the plots (both loaded before this file, which starts the page).
// Every panel is drawn from one frame (GET /dashboard/api/dataflows/{id}/frame): the state of one
// published version, which the page names. See docs/dashboard.md.
"use strict";

const TOKEN_KEY = "tracker.token";
const FRAME_MIN_MS = 500;     // frames at most this often while the dataflow changes...
const FRAME_IDLE_MS = 2000;   // ...and at least this often (waits grow while nothing changes)
const MAX_ROWS = 300;         // rows of the frontier and estimate tables drawn at once (the search narrows them)
// Seconds after which a lag turns amber, then red; ?lag_warn=&lag_bad= in the page's URL override them.
const QUERY = new URLSearchParams(location.search);
const LAG_WARN = Number(QUERY.get("lag_warn")) || 5, LAG_BAD = Number(QUERY.get("lag_bad")) || 30;
const $ = (sel) => document.querySelector(sel);

const state = {
  token: localStorage.getItem(TOKEN_KEY),
  dataflow: null,           // GET /v1/dataflows/{id}
  scopes: [],               // GET /v1/dataflows/{id}/scopes
  abort: null,              // AbortController of the current dataflow's requests and stream
  frame: null,              // the frame drawn on screen (one version)
  rows: new Map(),          // "scope/node:port:kind" -> the frame's lag row (frontier, lag, oldest)
  selected: null,           // the location key whose explanation is shown
  search: "",               // what the search box holds (filters the tables, finds operators)
  changed: false,           // the stream saw a change since the last frame
  wake: null,               // resolves the frame loop's wait early
  clockOffset: 0,           // the service's clock minus the browser's (seconds)
  cy: null,
  graph: null,              // dashboard-graph.js's model
  plots: null,              // dashboard-plots.js's model
};
window.dashboard = state; // for debugging in the console (and the browser test)

// ---------------------------------------------------------------- helpers

// A location of a nested scope carries its scope path (`scope`, absent or [] at the root); its
// key is "3,1/node:port:kind", a root location's "node:port:kind" as in a flat dataflow.
const scopeOf = (l) => (l.scope && l.scope.length ? l.scope : []);
const locKey = (l) => (scopeOf(l).length ? `${scopeOf(l).join(",")}/` : "") + `${l.node}:${l.port}:${l.kind}`;
const locText = (l) => (scopeOf(l).length ? `[${scopeOf(l).join(",")}]` : "") + `(${l.node},${l.port},${l.kind})`;
const timeText = (t) => `(${t.join(", ")})`;
const serverNow = () => Date.now() / 1000 + state.clockOffset;

function keyLocation(key) {
  // The inverse of locKey.
  const slash = key.indexOf("/");
  const scope = slash < 0 ? [] : key.slice(0, slash).split(",").map(Number);
  const [node, port, kind] = key.slice(slash + 1).split(":");
  return scope.length ? {scope, node: Number(node), port: Number(port), kind} : {node: Number(node), port: Number(port), kind};
}

function frontierText(times, most = 4) {
  if (!times.length) return "{} (done)";
  const shown = times.slice(0, most).map(timeText).join(", ");
  return "{" + shown + (times.length > most ? `, … ${times.length - most} more` : "") + "}";
}

// Ages and lags: "≥" when the service counts them from a restart (they are at least that).
const seconds = (s) => (s < 60 ? `${s.toFixed(1)} s` : s < 3600 ? `${(s / 60).toFixed(1)} min` : `${(s / 3600).toFixed(1)} h`);
const lagText = (s, atLeast) => (s === null || s === undefined ? "—" : (atLeast ? "≥ " : "") + seconds(s));
const lagClass = (s) => (s === null || s === undefined ? "lag-none" : s < LAG_WARN ? "lag-ok" : s < LAG_BAD ? "lag-warn" : "lag-bad");

function paintLag(cell, s, atLeast) {
  cell.textContent = lagText(s, atLeast);
  cell.className = "lag " + lagClass(s);
}

function cell(row, text, cls) {
  const td = row.insertCell();
  td.textContent = text;
  if (cls) td.className = cls;
  return td;
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
setInterval(() => { if (state.token && !$("#app").hidden) loadList().catch(() => {}); }, 5000);

// ---------------------------------------------------------------- dataflow list

function badge(stateName) {
  const span = document.createElement("span");
  span.className = `state state-${stateName}`;
  span.textContent = stateName;
  return span;
}

async function loadList() {
  // Every state, deleted ones too (they keep answering reads): the list says which is which.
  const [flows, deleted] = await Promise.all([apiJson("/v1/dataflows"), apiJson("/v1/dataflows?state=deleted")]);
  const list = $("#dataflows");
  list.replaceChildren();
  for (const flow of [...flows, ...deleted]) {
    const item = document.createElement("li");
    item.dataset.id = flow.id;
    item.className = state.dataflow && state.dataflow.id === flow.id ? "selected" : "";
    const name = document.createElement("span");
    name.className = "name";
    name.textContent = flow.name;
    const meta = document.createElement("small");
    item.append(name, badge(flow.state), meta);
    const frame = state.frame && state.dataflow && state.dataflow.id === flow.id ? state.frame : null;
    listMeta(item, frame ? frame.status.state : flow.state, frame ? frame.version : flow.version, flow);
    item.addEventListener("click", () => { location.hash = encodeURIComponent(flow.id); });
    list.append(item);
  }
  if (!list.children.length) list.innerHTML = '<li class="hint">none registered yet</li>';
}

function listMeta(item, stateName, version, flow) {
  // The selected dataflow's entry says what the frame on screen says (state and version).
  item.querySelector(".state").replaceWith(badge(stateName));
  item.querySelector("small").textContent = `${flow.id.slice(0, 8)} · arity ${flow.timestamp_arity} · v${version}`;
  item.dataset.version = version;
}

async function openDataflow(id) {
  if (state.abort) state.abort.abort();
  const abort = new AbortController();
  state.abort = abort;
  state.frame = null;
  state.rows = new Map();
  state.selected = null;
  for (const item of document.querySelectorAll("#dataflows li")) item.classList.toggle("selected", item.dataset.id === id);
  const flow = await apiJson(`/v1/dataflows/${encodeURIComponent(id)}`, {signal: abort.signal});
  state.dataflow = flow;
  state.scopes = flow.nodes.some((n) => n.scope)
    ? await apiJson(`/v1/dataflows/${encodeURIComponent(id)}/scopes`, {signal: abort.signal}) : [];
  $("#empty").hidden = true;
  $("#view").hidden = false;
  $("#title").textContent = `${flow.name} (${flow.id})`;
  $("#explain").textContent = "";
  for (const body of document.querySelectorAll("#view tbody")) body.replaceChildren();
  drawGraph(flow);
  const version = await loadHistory(flow, abort.signal);
  streamFrontier(flow, abort.signal, version);  // from right after the history: no gap, no duplicate
  frameLoop(flow, abort.signal);
}

// ---------------------------------------------------------------- frames

async function frameLoop(flow, signal) {
  while (!signal.aborted) {
    const started = performance.now();
    try {
      const query = new URLSearchParams();
      const after = plotsThroughputAfter();
      if (after !== null) query.set("throughput_after", after);
      if (state.selected) {
        const loc = keyLocation(state.selected);
        query.set("node", loc.node); query.set("port", loc.port); query.set("kind", loc.kind);
        query.set("scope", scopeOf(loc).join(","));
      }
      const sent = Date.now() / 1000;
      const frame = await apiJson(`/dashboard/api/dataflows/${encodeURIComponent(flow.id)}/frame?${query}`, {signal});
      const received = Date.now() / 1000;
      state.clockOffset = frame.at - (sent + received) / 2;
      if (signal.aborted) return;
      renderFrame(frame);
    } catch (error) {
      if (signal.aborted) return;
      if (error instanceof AuthError) return handleError(error);
      setConn(String(error.message || error).slice(0, 80), "error");
    }
    // Bigger dataflows take longer to answer: never more than a third of the time in frames.
    const took = performance.now() - started;
    await nextFrame(Math.max(FRAME_MIN_MS, 3 * took), FRAME_IDLE_MS);
  }
}

function nextFrame(soonest, latest) {
  // After `soonest` ms if the stream saw a change by then, else as soon as it sees one, at the
  // latest after `latest` ms.
  return new Promise((resolve) => {
    const begun = performance.now();
    let finished = false;
    const wake = () => { if (performance.now() - begun >= soonest) done(); };
    const done = () => {
      if (finished) return;
      finished = true;
      clearTimeout(timer);
      if (state.wake === wake) state.wake = null;
      state.changed = false;
      resolve();
    };
    const timer = setTimeout(done, Math.max(latest, soonest));
    state.wake = wake;
    setTimeout(() => { if (state.changed) done(); }, soonest);
  });
}

function renderFrame(frame) {
  // Every panel from this frame: one version.
  state.frame = frame;
  state.rows = new Map(frame.lag.locations.map((row) => [locKey(row.location), row]));
  const v = frame.version;
  const status = frame.status;
  $("#state").replaceChildren(badge(status.state));
  const live = frame.lag.locations.filter((row) => row.frontier.length).length;
  const at = new Date(frame.at * 1000).toLocaleTimeString();
  $("#status").textContent = `version ${v} · at ${at} · ${live} of ${frame.lag.locations.length} locations ` +
    `have a non-empty frontier · arity ${state.dataflow.timestamp_arity}`;
  const item = document.querySelector(`#dataflows li[data-id="${state.dataflow.id}"]`);
  if (item) listMeta(item, status.state, v, state.dataflow);
  renderLifecycle(status);
  const worst = frame.lag.max_lag_seconds;
  $("#lag-summary").textContent = worst === null ? "every frontier is empty: nothing is awaited"
    : `longest wait: ${lagText(worst, frame.lag.max_lag_at_least)}` +
      (frame.lag.max_lag_at_least ? " (counted from the service's restart)" : "");
  $("#lag-summary").className = "hint " + lagClass(worst);
  paintGraph(frame);
  renderHeld(frame);
  renderFrontiers(frame);
  renderEstimates(frame);
  renderExplanation(frame);
  plotFrame(frame);
  for (const panel of document.querySelectorAll("[data-panel]")) panel.dataset.version = v;
  setConn("live", "live");
}

function renderLifecycle(status) {
  // States other than running say why; a violation names each location, time and count.
  const box = $("#lifecycle");
  const when = (iso) => (iso ? new Date(iso).toLocaleTimeString() : "—");
  const lines = {
    running: "",
    complete: "Complete: every frontier is empty, nothing can happen any more.",
    stalled: `Stalled: live pointstamps, but no frontier changed since ${when(status.last_frontier_change_at)} ` +
      "(an input never closed, a worker gone, a notification never taken, or a slow source). " +
      "\"Held back by\" says who holds them.",
    violation: `Protocol violation: ${status.violation_count} occurrence count(s) stayed negative after the last ` +
      `batch (${when(status.last_batch_at)}): a message consumed twice, or a capability dropped twice.`,
    deleted: `Deleted at ${when(status.deleted_at)}: progress is refused; what it last showed stays readable.`,
  };
  box.hidden = status.state === "running";
  box.className = `lifecycle state-${status.state}`;
  $("#lifecycle-text").textContent = lines[status.state] || "";
  const table = $("#violations");
  table.hidden = !status.violations.length;
  const body = table.tBodies[0];
  body.replaceChildren();
  for (const v of status.violations) {
    const row = body.insertRow();
    const key = locKey(v.location);
    row.dataset.loc = key;
    const where = state.rows.get(key);
    cell(row, locText(v.location));
    cell(row, where ? `${where.operator} ${where.port}` : "");
    cell(row, timeText(v.time), "frontier");
    cell(row, String(v.count), "count");
  }
}

function renderHeld(frame) {
  // The locations that have waited longest, each with the pointstamps holding it at its
  // earliest frontier time: "count × where@time — operator port · worker · age".
  const body = $("#held tbody");
  body.replaceChildren();
  for (const held of frame.held) {
    const key = locKey(held.location);
    const lag = state.rows.get(key);
    const row = body.insertRow();
    row.dataset.loc = key;
    cell(row, `${locText(held.location)} ${held.operator} ${held.port}`);
    cell(row, frontierText(held.frontier), "frontier");
    paintLag(row.insertCell(), lag ? lag.lag_seconds : null, lag && lag.lag_at_least);
    const blockers = held.blockers.map((b) => {
      const crossing = b.summary === null ? ` via ${b.via.join(", ")}`
        : b.summary.some((x) => x > 0) ? ` via +${timeText(b.summary)}` : "";
      // The service knows the worker that last changed a count, not every holder of a count of 2.
      const worker = b.worker ? (b.count > 1 ? `last reported by worker ${b.worker}` : `worker ${b.worker}`)
        : b.age_at_least ? "worker unknown (before the restart)" : "worker —";
      const age = b.age_seconds === null || b.age_seconds === undefined ? "" : ` · ${lagText(b.age_seconds, b.age_at_least)} old`;
      return `${b.count} × ${locText(b.location)}@${timeText(b.time)}${crossing} — ${b.operator} ${b.port} · ${worker}${age}`;
    });
    const more = held.blocker_count - held.blockers.length;
    cell(row, (blockers.join("; ") || "nothing") + (more > 0 ? `; and ${more} more` : ""));
    row.classList.toggle("selected", key === state.selected);
    row.addEventListener("click", () => selectLocation(key));
  }
}

function matchesSearch(text) {
  return !state.search || text.toLowerCase().includes(state.search.toLowerCase());
}

function renderFrontiers(frame) {
  const body = $("#frontiers tbody");
  body.replaceChildren();
  const rows = frame.lag.locations.filter((r) => matchesSearch(`${r.operator} ${r.port} ${locText(r.location)}`));
  for (const r of rows.slice(0, MAX_ROWS)) {
    const key = locKey(r.location);
    const row = body.insertRow();
    row.dataset.loc = key;
    cell(row, locText(r.location));
    cell(row, `${r.operator} ${r.port}`);
    cell(row, frontierText(r.frontier, 8), "frontier");
    paintLag(row.insertCell(), r.lag_seconds, r.lag_at_least);
    const oldest = r.oldest_pointstamp;
    cell(row, oldest === null ? "" : `${timeText(oldest.time)} · ${oldest.worker ? "last reported by " + oldest.worker
      : oldest.age_at_least ? "worker unknown (before the restart)" : "worker —"} · ${lagText(oldest.age_seconds, oldest.age_at_least)}`);
    row.classList.toggle("selected", key === state.selected);
    row.addEventListener("click", () => selectLocation(key));
  }
  $("#frontiers-note").textContent = rows.length > MAX_ROWS
    ? `${MAX_ROWS} of ${rows.length} locations shown: the search box narrows them` : "";
}

function renderEstimates(frame) {
  const estimate = frame.estimate;
  const body = $("#estimates tbody");
  body.replaceChildren();
  const rows = estimate.operators.filter((o) => matchesSearch(`${o.operator} #${o.node}`));
  for (const o of rows.slice(0, MAX_ROWS)) {
    const row = body.insertRow();
    row.dataset.op = (o.scope || []).concat([o.node]).join(",");
    cell(row, (o.scope ? `[${o.scope.join(",")}] ` : "") + `${o.operator} #${o.node}`);
    cell(row, o.epoch === null ? "done" : String(o.epoch), "frontier");
    cell(row, o.epochs_per_second === null ? "unknown" : `${o.epochs_per_second.toFixed(2)} /s`, "rate");
    cell(row, o.state === "done" ? "done" : o.eta_seconds === null ? "unknown" : `in ${seconds(o.eta_seconds)}`, "eta");
    cell(row, o.reason || "", "hint");
    row.className = `estimate-${o.state}`;
  }
  const last = estimate.last_epoch === null ? "no last epoch known (declare last_epoch at registration, or close the inputs)"
    : `last epoch ${estimate.last_epoch} (${estimate.last_epoch_source})`;
  $("#estimates-note").textContent = `rates over the last ${estimate.window_seconds.toFixed(1)} s · ${last}` +
    (rows.length > MAX_ROWS ? ` · ${MAX_ROWS} of ${rows.length} operators shown` : "");
}

function renderExplanation(frame) {
  // The selected location's explanation, from the frame (so of its version).
  const answer = frame.explained;
  if (!state.selected) { $("#explain").textContent = ""; return; }
  const row = state.rows.get(state.selected);
  if (!answer) {
    $("#explain").textContent = `${locText(keyLocation(state.selected))}: empty frontier, nothing holds it back` +
      (row ? "." : " (not a location of this dataflow).");
  } else {
    $("#explain").textContent = [answer.explanation, ...answer.blockers.map((b) => "• " + b.text)].join("\n");
  }
  focusRefresh(answer);
}

function selectLocation(key) {
  state.selected = key;
  for (const row of document.querySelectorAll("#held tr, #frontiers tr")) row.classList.toggle("selected", row.dataset.loc === key);
  $("#explain").textContent = `${locText(keyLocation(key))}: explained in the next frame…`;
  $("#focus").disabled = false;
  if (state.wake) { state.changed = true; state.wake(); }
}

$("#search").addEventListener("input", (event) => {
  state.search = event.target.value.trim();
  searchGraph(state.search);
  if (state.frame) { renderFrontiers(state.frame); renderEstimates(state.frame); }
});

bindGraphControls();
start();
