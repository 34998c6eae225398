// The dashboard's plots (uPlot): the epoch each plotted operator's inputs have cleared, and the
// batches applied per second, over the service's clock. Their past comes from the history route
// (Delta and the service's memory) up to a version; the live part from the SSE stream resumed
// right after that version (Last-Event-ID: no gap, no duplicate). Stream events are folded in
// frame by frame, up to the frame's version, so the plots show what the frame shows.
// See docs/dashboard.md.
"use strict";

const PLOT = {SERIES: 10, POINTS: 4000, HEIGHT: 180};
const COLORS = ["#4263eb", "#e8590c", "#2f9e44", "#ae3ec9", "#1098ad", "#f08c00", "#c2255c", "#5c940d",
  "#364fc7", "#862e9c"];

function plottedOperators(flow) {
  // Up to PLOT.SERIES operators of the root scope with inputs, spread along the graph (by rank),
  // so that a long pipeline shows its head, its middle and its tail.
  const rank = ranks(flow.nodes, flow.edges, false);
  const candidates = flow.nodes.filter((n) => n.inputs > 0).sort((a, b) => rank.get(a.id) - rank.get(b.id) || a.id - b.id);
  if (candidates.length <= PLOT.SERIES) return candidates;
  return Array.from({length: PLOT.SERIES}, (_, i) => candidates[Math.round(i * (candidates.length - 1) / (PLOT.SERIES - 1))]);
}

function minEpoch(frontier, keys) {
  // The earliest epoch (first coordinate: the root's time) still open at any of these inputs;
  // null once they are all done.
  let best = null;
  for (const key of keys) for (const t of (frontier.get(key) || new Map()).values()) if (best === null || t[0] < best) best = t[0];
  return best;
}

function plotWidth() {
  return Math.max(320, Math.floor(($("#view").clientWidth - 40) / 2));
}

function makePlot(target, title, labels, colors, data) {
  // Steps, not slopes: a value holds until the next change. Both plots span the same time (from
  // the earliest point either has to the service's now), so that epochs and throughput line up.
  // (uPlot's own min and max are not used: it pads a single point's range by years.)
  const shared = () => {
    const p = state.plots, now = serverNow();
    const xs = [p.series.x[0], p.rate.x[0], p.series.x[p.series.x.length - 1], p.rate.x[p.rate.x.length - 1]]
      .filter((v) => v !== undefined);
    const from = xs.length ? Math.min(...xs) : now - 60;
    return [Math.min(from, now - 10), Math.max(now, ...xs)];
  };
  const series = [{label: "time"}, ...labels.map((label, i) => ({label, stroke: colors[i % colors.length], width: 2,
    spanGaps: false, paths: uPlot.paths.stepped({align: 1}), points: {show: true, size: 4}}))];
  // No uPlot title: the figure's caption says what it is.
  return new uPlot({width: plotWidth(), height: PLOT.HEIGHT, series, scales: {x: {time: true, range: shared}},
    axes: [{}, {label: title}], legend: {live: false}}, data, target);
}

function sample(at) {
  // A sample equal to the two before it only moves the last point to `at` (the step reaches
  // the present), so that idle time costs no points.
  const p = state.plots, s = p.series;
  const values = s.inputs.map((keys) => minEpoch(p.frontier, keys));
  const n = s.x.length;
  const x = n ? Math.max(at, s.x[n - 1]) : at;
  if (n >= 2 && s.ys.every((y, i) => y[n - 1] === values[i] && y[n - 2] === values[i])) {
    s.x[n - 1] = x;
  } else {
    s.x.push(x);
    values.forEach((v, i) => s.ys[i].push(v));
  }
  if (s.x.length > PLOT.POINTS) { s.x.shift(); s.ys.forEach((y) => y.shift()); }
}

function applyChange(frontier, c) {
  const key = locKey(c.location);
  if (!frontier.has(key)) frontier.set(key, new Map());
  if (c.diff > 0) frontier.get(key).set(JSON.stringify(c.time), c.time);
  else frontier.get(key).delete(JSON.stringify(c.time));
}

function addSeconds(rows, upTo) {
  // Per-second counts exist only for seconds with batches: the seconds between them (and up to
  // `upTo`, the last complete one) had none, and are drawn at 0.
  const r = state.plots.rate;
  for (const row of rows) {
    if (row.second > upTo || (r.x.length && row.second <= r.x[r.x.length - 1])) continue;
    let next = r.x.length ? r.x[r.x.length - 1] + 1 : row.second;
    for (; next < row.second; next++) { r.x.push(next); r.batches.push(0); }
    r.x.push(row.second);
    r.batches.push(row.batches);
  }
  if (r.x.length) for (let next = r.x[r.x.length - 1] + 1; next <= upTo; next++) { r.x.push(next); r.batches.push(0); }
  while (r.x.length > PLOT.POINTS) { r.x.shift(); r.batches.shift(); }
  state.plots.lastSecond = Math.max(state.plots.lastSecond || 0, upTo);
}

function plotsThroughputAfter() {
  return state.plots && state.plots.lastSecond !== null ? state.plots.lastSecond : null;
}

async function loadHistory(flow, signal) {
  // The plots' past, up to a version (returned: the stream resumes after it; null: no past).
  const operators = plottedOperators(flow);
  const inputs = operators.map((n) => Array.from({length: n.inputs}, (_, p) => locKey({node: n.id, port: p, kind: "target"})));
  const wanted = [...new Set(inputs.flat())];
  state.plots = {wanted, series: {keys: operators.map((n) => `${n.id}`), inputs,
    x: [], ys: operators.map(() => [])}, frontier: new Map(), version: -1, pending: [], rate: {x: [], batches: []},
    lastSecond: null, frontierPlot: null, throughputPlot: null};
  const p = state.plots;
  for (const plot of document.querySelectorAll("#frontier-plot, #throughput-plot")) plot.replaceChildren();
  p.frontierPlot = makePlot($("#frontier-plot"), "earliest open epoch", operators.map((n) => `${n.name || "operator"} #${n.id}`),
    COLORS, [[], ...operators.map(() => [])]);
  p.throughputPlot = makePlot($("#throughput-plot"), "batches/s", ["batches/s"], ["#2f9e44"], [[], []]);
  if (!wanted.length) return null;
  const query = new URLSearchParams({locations: wanted.join(",")});
  const history = await apiJson(`/dashboard/api/dataflows/${encodeURIComponent(flow.id)}/history?${query}`, {signal});
  state.clockOffset = history.at - Date.now() / 1000;
  addSeconds(history.throughput, Math.floor(history.at) - 1);
  if (!history.base) return null;  // nothing known yet: the stream starts with a snapshot
  for (const row of history.base.locations) p.frontier.set(locKey(row.location), new Map(row.frontier.map((t) => [JSON.stringify(t), t])));
  const changes = history.frontier_changes;
  // The frontier before the first change held since the registration if that is where it starts.
  if (history.base.version >= 0) sample(history.base.version === 0 ? Date.parse(flow.created_at) / 1000 : (changes.length ? changes[0].at : history.at));
  for (let i = 0; i < changes.length;) {
    const version = changes[i].version, at = changes[i].at;
    while (i < changes.length && changes[i].version === version) applyChange(p.frontier, changes[i++]);
    sample(at);
  }
  p.version = history.version;
  redrawPlots();
  return history.version;
}

function redrawPlots() {
  const p = state.plots;
  p.frontierPlot.setData([p.series.x, ...p.series.ys]);
  p.throughputPlot.setData([p.rate.x, p.rate.batches]);
}

function plotFrame(frame) {
  // Fold in the stream's events up to the frame's version, then the frame's own frontier at the
  // plotted inputs (exact at its version, whatever the stream has delivered so far).
  const p = state.plots;
  if (!p) return;
  p.pending.sort((a, b) => a.version - b.version);
  while (p.pending.length && p.pending[0].version <= frame.version) {
    const event = p.pending.shift();
    if (event.version <= p.version) continue;  // the history or an earlier frame had it
    if (event.snapshot) {
      p.frontier = new Map();
      for (const row of event.snapshot) p.frontier.set(locKey(row.location), new Map(row.frontier.map((t) => [JSON.stringify(t), t])));
    } else {
      for (const c of event.changes) applyChange(p.frontier, c);
    }
    sample(event.at);
  }
  for (const key of p.wanted) {
    const row = state.rows.get(key);
    p.frontier.set(key, new Map((row ? row.frontier : []).map((t) => [JSON.stringify(t), t])));
  }
  sample(frame.at);
  p.version = Math.max(p.version, frame.version);
  addSeconds(frame.throughput, Math.floor(frame.at) - 1);
  redrawPlots();
  $("#plots-note").textContent = `through version ${frame.version}`;
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

async function streamFrontier(flow, signal, fromVersion) {
  // The plotted inputs' changes, from right after `fromVersion`; each one wakes the frame loop.
  const p = state.plots;
  if (!p.wanted.length) return;
  let lastId = fromVersion === null ? null : String(fromVersion);
  let delay = 500;
  const query = new URLSearchParams({locations: p.wanted.join(",")});
  while (!signal.aborted) {
    try {
      const headers = {Accept: "text/event-stream"};
      if (lastId !== null) headers["Last-Event-ID"] = lastId;  // resume without gap or duplicate
      const response = await api(`/v1/dataflows/${encodeURIComponent(flow.id)}/frontier/stream?${query}`, {headers, signal});
      if (!response.ok) throw new Error(`stream: HTTP ${response.status}`);
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
          if (!event.data.length || (event.event !== "snapshot" && event.event !== "changes")) continue;
          const data = JSON.parse(event.data.join("\n"));
          p.pending.push(event.event === "snapshot" ? {version: data.version, snapshot: data.locations, at: serverNow()}
            : {version: data.version, changes: data.changes, at: serverNow()});
          state.changed = true;
          if (state.wake) state.wake();
        }
        buffer = text + (hold ? "\r" : "");
      }
      throw new Error("stream closed");
    } catch (error) {
      if (signal.aborted) return;
      if (error instanceof AuthError) return handleError(error);
      await new Promise((resolve) => setTimeout(resolve, delay));
      delay = Math.min(delay * 2, 10000);
    }
  }
}

window.addEventListener("resize", () => {
  if (!state.plots) return;
  for (const plot of [state.plots.frontierPlot, state.plots.throughputPlot]) if (plot) plot.setSize({width: plotWidth(), height: PLOT.HEIGHT});
});
