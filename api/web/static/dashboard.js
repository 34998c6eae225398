// The built-in dashboard's core: the token, the dataflow list and the frames. Plain JavaScript,
// no build step; dashboard-layout.js places the graph, dashboard-graph.js draws it,
// dashboard-plots.js draws the plots and dashboard-panels.js the other panels of a frame, and
// dashboard-activity.js the program's statistics (all loaded before this file, which starts the page).
// Every panel is drawn from one frame (GET /dashboard/api/dataflows/{id}/frame): the state of one
// published version, which the page names. A dataflow the service refused at recovery (damaged)
// shows its reason instead. See docs/dashboard.md.
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
  dataflow: null,           // GET /v1/dataflows/{id} (or the list's entry of a damaged one)
  opening: null,            // the id of the dataflow shown or being opened (null after a failed open)
  listed: [],               // the list's entries (GET /v1/dataflows, deleted ones too)
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
    // The hash may have changed while the list loaded (a click on it): opened once, by whichever came first.
    const wanted = decodeURIComponent(location.hash.slice(1));
    if (wanted && state.opening !== wanted) await openDataflow(wanted);
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
  state.opening = null;
  if (state.abort) state.abort.abort();
  showLogin();
});

$("#refresh").addEventListener("click", () => loadList().catch(handleError));
window.addEventListener("hashchange", () => {
  const id = decodeURIComponent(location.hash.slice(1));
  if (id && state.opening !== id) openDataflow(id).catch(handleError);
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
  // Every state, deleted ones too (they keep answering reads), and for the admin token the
  // damaged ones (refused at recovery, with the reason): the list says which is which.
  const [flows, deleted] = await Promise.all([apiJson("/v1/dataflows"), apiJson("/v1/dataflows?state=deleted")]);
  const seen = new Set();
  state.listed = [...flows, ...deleted].filter((flow) => !seen.has(flow.id) && seen.add(flow.id));
  const list = $("#dataflows");
  list.replaceChildren();
  for (const flow of state.listed) {
    const item = document.createElement("li");
    item.dataset.id = flow.id;
    item.className = state.dataflow && state.dataflow.id === flow.id ? "selected" : "";
    const name = document.createElement("span");
    name.className = "name";
    name.textContent = flow.name;
    const meta = document.createElement("small");
    item.append(name, badge(flow.state), meta);
    if (flow.state === "damaged") {
      const detail = document.createElement("span");
      detail.className = "detail";
      detail.textContent = flow.detail || "refused at recovery";
      detail.title = detail.textContent;
      item.append(detail);
    }
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
  item.querySelector("small").textContent = `${flow.id.slice(0, 8)} · arity ${flow.timestamp_arity} · ` +
    (version === null || version === undefined ? "no version served" : `v${version}`);
  item.dataset.version = version;
}

async function openDataflow(id) {
  state.opening = id;  // the dataflow shown (or on its way): opening it again would reset its drawing
  if (state.abort) state.abort.abort();
  const abort = new AbortController();
  state.abort = abort;
  state.frame = null;
  state.rows = new Map();
  state.selected = null;
  for (const item of document.querySelectorAll("#dataflows li")) item.classList.toggle("selected", item.dataset.id === id);
  const response = await api(`/v1/dataflows/${encodeURIComponent(id)}`, {signal: abort.signal})
    .catch((error) => { if (state.opening === id) state.opening = null; throw error; });
  if (response.status === 503) {
    const body = await response.json().catch(() => ({}));
    if (body.error === "dataflow_damaged") return showDamaged(id, body.detail);
  }
  if (!response.ok) {
    if (state.opening === id) state.opening = null;
    throw new Error(`/v1/dataflows/${id}: HTTP ${response.status} ${await response.text()}`);
  }
  const flow = await response.json();
  state.dataflow = flow;
  state.scopes = flow.nodes.some((n) => n.scope)
    ? await apiJson(`/v1/dataflows/${encodeURIComponent(id)}/scopes`, {signal: abort.signal}) : [];
  $("#empty").hidden = true;
  $("#view").hidden = false;
  $("#live").hidden = false;
  $("#lifecycle").hidden = true;
  $("#state").replaceChildren();
  $("#status").textContent = "";
  $("#focus").disabled = true;
  $("#focus").classList.remove("on");  // a new dataflow starts with its whole graph
  $("#focus").textContent = "Show only what holds it back";
  $("#title").textContent = `${flow.name} (${flow.id})`;
  $("#explain").textContent = "";
  for (const body of document.querySelectorAll("#view tbody")) body.replaceChildren();
  drawGraph(flow);
  const version = await loadHistory(flow, abort.signal);
  streamFrontier(flow, abort.signal, version);  // from right after the history: no gap, no duplicate
  frameLoop(flow, abort.signal);
  activityLoop(flow, abort.signal);
}

function showDamaged(id, detail) {
  // Recovery refused this dataflow (its routes answer 503 dataflow_damaged): its reason, in
  // plain sight, and nothing that would need its state.
  const listed = state.listed.find((flow) => flow.id === id);
  state.dataflow = {...(listed || {id, name: "dataflow", timestamp_arity: null}), state: "damaged", detail};
  $("#empty").hidden = true;
  $("#view").hidden = false;
  $("#live").hidden = true;
  $("#title").textContent = `${state.dataflow.name} (${id})`;
  $("#state").replaceChildren(badge("damaged"));
  $("#status").textContent = "not served: the service refused this dataflow when it recovered its log";
  const box = $("#lifecycle");
  box.hidden = false;
  box.className = "lifecycle state-damaged";
  $("#lifecycle-text").textContent = `Damaged: ${detail || "refused at recovery"}`;
  let more = box.querySelector("p.more");
  if (!more) {
    more = document.createElement("p");
    more.className = "more";
    $("#lifecycle-text").after(more);
  }
  more.textContent = "Its log's records stay where they are (no segment is deleted while a dataflow is refused); " +
    "its routes answer 503 until the log is repaired and the service restarted. Every other dataflow is served.";
  $("#violations").hidden = true;
  setConn("damaged: not streamed", "");
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
      const sent = Date.now() / 1000, asked = state.selected;
      const frame = await apiJson(`/dashboard/api/dataflows/${encodeURIComponent(flow.id)}/frame?${query}`, {signal});
      frame.asked = asked;  // the location this frame explains (the selection may have changed since)
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
  focusButton(frame);
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

function selectLocation(key) {
  state.selected = key;
  for (const row of document.querySelectorAll("#held tr, #frontiers tr")) row.classList.toggle("selected", row.dataset.loc === key);
  $("#explain").textContent = `${locText(keyLocation(key))}: explained in the next frame…`;
  $("#focus").disabled = false;
  $("#focus").title = `only the operators holding ${locText(keyLocation(key))} back`;
  if (state.wake) { state.changed = true; state.wake(); }
}

$("#search").addEventListener("input", (event) => {
  state.search = event.target.value.trim();
  searchGraph(state.search);
  if (state.frame) { renderFrontiers(state.frame); renderEstimates(state.frame); }
});

bindGraphControls();
start();
