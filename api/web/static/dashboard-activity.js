// The "Why slow" panel: the program's statistics (GET /v1/dataflows/{id}/stats), beside the
// frontiers: the busiest operators first (share of the workers' time, over the last 10 s of
// reports) and the channels carrying the most records per second. Statistics are sent by the
// program itself (a timely program attached with `.statistics(...)`), not part of a frame: the
// panel polls them while the dataflow is open, and stays hidden while there are none. Loaded before dashboard.js, which starts it.
// See docs/dashboard.md.
"use strict";

const ACTIVITY_MS = 2000;   // how often the panel asks for the statistics
const ACTIVITY_ROWS = 15;   // operators and channels shown (the busiest)

async function activityLoop(flow, signal) {
  $("#activity-panel").hidden = true;
  while (!signal.aborted) {
    try {
      const view = await apiJson(`/v1/dataflows/${encodeURIComponent(flow.id)}/stats`, {signal});
      if (signal.aborted) return;
      renderActivity(view);
    } catch (error) {
      if (signal.aborted) return;
      if (error instanceof AuthError) return handleError(error);
      $("#activity-panel").hidden = false;
      $("#activity-note").textContent = `statistics unavailable: ${String(error.message || error).slice(0, 120)}`;
    }
    await new Promise((resolve) => setTimeout(resolve, ACTIVITY_MS));
  }
}

function shareBar(row, share) {
  // A bar as wide as the share, and the share in per cent.
  const td = row.insertCell();
  td.className = "share";
  const bar = document.createElement("span");
  bar.className = "bar" + (share >= 0.5 ? " hot" : "");
  bar.style.width = `${Math.min(100, Math.max(share * 100, 0.5)).toFixed(1)}%`;
  const text = document.createElement("span");
  text.textContent = `${(share * 100).toFixed(share < 0.1 ? 1 : 0)}%`;
  td.append(bar, text);
}

function rateText(n) {
  return n >= 1e6 ? `${(n / 1e6).toFixed(1)}M/s` : n >= 1e3 ? `${(n / 1e3).toFixed(1)}k/s` : `${n.toFixed(n < 10 ? 1 : 0)}/s`;
}

function renderActivity(view) {
  const panel = $("#activity-panel");
  panel.dataset.reports = String(view.reports);
  const note = $("#activity-note");
  const ops = $("#activity-operators tbody"), chans = $("#activity-channels tbody");
  ops.replaceChildren();
  chans.replaceChildren();
  panel.hidden = !view.reports;
  if (!view.reports) return;
  const ago = Math.max(0, serverNow() - view.as_of);
  note.textContent = `over the last ${view.window_seconds.toFixed(1)} s of reports from ${view.workers.length} ` +
    `worker(s) (${view.reports} reports in all; the last ${ago < 2 ? "just now" : `${ago.toFixed(0)} s ago`}); ` +
    `the workers spent ${(view.dataflow_busy_share * 100).toFixed(0)}% of their time in this dataflow`;
  for (const op of view.operators.filter((o) => !o.is_scope).slice(0, ACTIVITY_ROWS)) {
    const row = ops.insertRow();
    cell(row, op.label);
    shareBar(row, op.busy_share);
    cell(row, `${op.busy_seconds.toFixed(3)} s`, "num");
    cell(row, String(op.schedules), "num");
    cell(row, `${op.total_busy_seconds.toFixed(3)} s`, "num");
  }
  for (const ch of view.channels.slice(0, ACTIVITY_ROWS)) {
    const row = chans.insertRow();
    cell(row, `${ch.from} → ${ch.to}`);
    cell(row, rateText(ch.records_per_second), "num");
    cell(row, rateText(ch.messages_per_second), "num");
    cell(row, ch.total_records.toLocaleString(), "num");
  }
}
