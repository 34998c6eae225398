// The dashboard's panels drawn from a frame, besides the graph and the plots: the state's box,
// what holds the longest waits back, the frontiers, the estimates, the selected location's
// explanation, and what "only what holds it back" shows with nothing selected. Loaded before
// dashboard.js, which calls them (and whose helpers they use). See docs/dashboard.md.
"use strict";

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
  const more = box.querySelector("p.more");
  if (more) more.remove();
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
  if (frame.asked !== state.selected) return;  // asked before this selection: the next frame explains it
  const row = state.rows.get(state.selected);
  if (!answer) {
    $("#explain").textContent = `${locText(keyLocation(state.selected))}: empty frontier, nothing holds it back` +
      (row ? "." : " (not a location of this dataflow).");
  } else {
    $("#explain").textContent = [answer.explanation, ...answer.blockers.map((b) => "• " + b.text)].join("\n");
  }
  focusRefresh(frame);
}

function defaultLocation(frame) {
  // What "only what holds it back" shows with nothing selected: what holds the dataflow's output
  // back, i.e. of the inputs of the root's operators without outputs, the one waiting longest;
  // failing that (no such operator, or all done) the location waiting longest; null when nothing
  // waits.
  const sinks = new Set(state.dataflow.nodes.filter((n) => n.outputs === 0 && n.inputs > 0).map((n) => n.id));
  let best = null;
  for (const row of frame.lag.locations) {
    const l = row.location;
    if (scopeOf(l).length || l.kind !== "target" || !sinks.has(l.node) || !row.frontier.length) continue;
    if (best === null || (row.lag_seconds || 0) > (best.lag_seconds || 0)) best = row;
  }
  if (best) return {key: locKey(best.location), why: "the dataflow's output waiting longest"};
  if (frame.held.length) return {key: locKey(frame.held[0].location), why: "the location waiting longest"};
  return null;
}

function focusButton(frame) {
  // Usable without a selection (then: defaultLocation); it says what it will show.
  const button = $("#focus"), fallback = defaultLocation(frame);
  button.disabled = !state.selected && !fallback;
  button.title = state.selected ? `only the operators holding ${locText(keyLocation(state.selected))} back`
    : fallback ? `nothing selected: the operators holding ${locText(keyLocation(fallback.key))} back (${fallback.why})`
      : "every frontier is empty: nothing is held back";
}
