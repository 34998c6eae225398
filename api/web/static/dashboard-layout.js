// The dashboard graph's geometry: where every box, port, label and edge goes, with no label
// over another and no edge over a label, whatever the dataflow's size. Pure computation on the
// graph (no Cytoscape, no frame); dashboard-graph.js draws what this places. See docs/dashboard.md.
//
// The guarantee, and how it is kept:
// * A box (operator, closed scope, an open scope's entry and exit) has rows of ports: inputs on
//   its left side, outputs on its right side. A port's label sits above its row's line, inside
//   the box, in a zone of fixed width (its "budget": the painter shortens a frontier to fit it);
//   the input zone, a middle "spine" and the output zone never overlap. Connections inside a box
//   run along the row lines and cross rows in the spine, each in its own lane; a summary's label
//   sits in its lane, under the line, where no row line passes.
// * A box's title is above it and never wider than it (shortened, the whole on hover).
// * Boxes stand in columns, columns in bands (wrapped like lines of text). Between columns are
//   gaps, between bands corridors, and a margin runs down each side: no label is in any of them.
//   Every edge leaves its source port into the gap right of its column, travels in gaps,
//   corridors and margins only, and enters its target from the gap left of the target's column.
// * An open scope is a box holding a layout of its own; its inputs enter through an "entry" box at
//   its top left (the scope's port on its border, the inside's `enter` port), its outputs leave
//   through an "exit" box at its bottom right.
"use strict";

const LAYOUT = {
  FAMILY: "system-ui, sans-serif",  // the graph's font (Cytoscape's style uses the same)
  PORT_PX: 12,        // port labels and summaries
  TITLE_PX: 13,       // titles (bold)
  INSET: 8,           // a port's centre from its box's side (ports are 14 px)
  LABEL_IN: 11,       // a port label's near end from its box's side
  PITCH: 30,          // between two rows of ports
  FIRST: 24,          // from a box's top to its first row's line (the row's labels sit above the line)
  LAST: 22,           // from the last row's line to the box's bottom (summaries sit under the line)
  TITLE: 24,          // above a box, for its title
  ROW_GAP: 14,        // between a box and the next one's title in a column
  SPINE_PAD: 6,       // between a label zone and the spine's lanes
  SPINE_MIN: 24,      // the spine's least width
  LANE: 7,            // between two edges side by side in a gap, corridor or margin
  COL_GAP: 56,        // between two columns
  BAND_GAP: 44,       // between two bands: a corridor
  END: 24,            // above the first band and below the last: corridors too
  MARGIN: 30,         // down each side of a layout
  PER_COLUMN: 12,     // boxes per column at most: a wider rank is split into several columns
  TITLE_MAX: 420,     // a box grows to show its title up to this width, then the title is shortened
  BUDGET_MIN: 90,     // a port label's least width...
  BUDGET_MAX: 150,    // ...and its largest (antichains are shortened to fit)
};

const measureContext = document.createElement("canvas").getContext("2d");
const measured = new Map();

function textWidth(text, px = LAYOUT.PORT_PX, bold = false) {
  // As Cytoscape measures a label (same font string, rounded up), so that what fits here fits there.
  const font = `normal ${bold ? "bold" : "normal"} ${px}px ${LAYOUT.FAMILY}`;
  const key = font + "\n" + text;
  let width = measured.get(key);
  if (width === undefined) {
    measureContext.font = font;
    width = Math.ceil(measureContext.measureText(text).width);
    if (measured.size > 50000) measured.clear();
    measured.set(key, width);
  }
  return width;
}

function fitText(text, width, px = LAYOUT.PORT_PX, bold = false) {
  // `text`, or its longest beginning that fits `width` with "…" after it.
  if (textWidth(text, px, bold) <= width) return text;
  let lo = 0, hi = text.length;
  while (lo < hi) {
    const mid = Math.ceil((lo + hi) / 2);
    if (textWidth(text.slice(0, mid) + "…", px, bold) <= width) lo = mid; else hi = mid - 1;
  }
  return text.slice(0, lo) + "…";
}

const layoutTime = (t) => `(${t.join(", ")})`;

function fitFrontier(side, times, width) {
  // "side {t1, t2, …}": as many of the antichain's times as fit `width`, then "…"; cut inside the
  // first time if even that one does not fit.
  if (!times.length) return `${side} {}`;
  const text = (k) => `${side} {${times.slice(0, k).map(layoutTime).join(", ")}${k < times.length ? ", …" : ""}}`;
  if (textWidth(text(1)) > width) return fitText(`${side} {${layoutTime(times[0])}`, width);
  let k = 1;
  while (k < times.length && textWidth(text(k + 1)) <= width) k += 1;
  return text(k);
}

function portBudget(arity) {
  // Room for a port's name and two times of this arity (one digit each): labels of one scope line up.
  const time = `(${new Array(arity).fill("0").join(", ")})`;
  return Math.min(Math.max(textWidth(`out 0 {${time}, ${time}}`), LAYOUT.BUDGET_MIN), LAYOUT.BUDGET_MAX);
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

const rowY = (r) => LAYOUT.FIRST + r * LAYOUT.PITCH;
const rowsHeight = (rows) => LAYOUT.FIRST + (Math.max(rows, 1) - 1) * LAYOUT.PITCH + LAYOUT.LAST;

function portBox(kind, rowsIn, rowsOut, budgetIn, budgetOut, lanes, title) {
  // A box of rows of ports (an operator, a closed scope, an entry or exit): its width holds the
  // input zone, the spine (its lanes) and the output zone, or its title if wider (up to TITLE_MAX);
  // spare width goes to the label zones.
  const rows = Math.max(rowsIn, rowsOut, 1);
  const spine = Math.max(LAYOUT.SPINE_MIN, 2 * LAYOUT.SPINE_PAD + lanes.reduce((s, l) => s + l.w, 0));
  let inZone = rowsIn ? budgetIn : 0, outZone = rowsOut ? budgetOut : 0;
  const base = 2 * LAYOUT.LABEL_IN + inZone + spine + outZone;
  const w = Math.max(base, title ? Math.min(textWidth(title, LAYOUT.TITLE_PX, true) + 12, LAYOUT.TITLE_MAX) : 0);
  const spare = w - base;
  if (inZone && outZone) { inZone += spare / 2; outZone += spare / 2; } else if (inZone) inZone += spare; else if (outZone) outZone += spare;
  const box = {kind, w, h: rowsHeight(rows), rows, inRow: Math.floor((rows - rowsIn) / 2),
    outRow: Math.floor((rows - rowsOut) / 2), inZone, outZone, lanes, title: title || "",
    shownTitle: title ? fitText(title, w - 8, LAYOUT.TITLE_PX, true) : ""};
  // The lanes' centres, left to right, from the spine's start.
  let x = LAYOUT.LABEL_IN + inZone + LAYOUT.SPINE_PAD + Math.max(0, (spine - 2 * LAYOUT.SPINE_PAD - lanes.reduce((s, l) => s + l.w, 0)) / 2);
  for (const lane of lanes) { lane.x = x + lane.w / 2; x += lane.w; }
  box.inY = (p) => rowY(box.inRow + p);
  box.outY = (p) => rowY(box.outRow + p);
  return box;
}

function boundaryBox(kind, count, leftBudget, rightBudget) {
  // An open scope's entry (its input p on its left border, row 2p; the inside's `enter p` on
  // the right, row 2p + 1) or exit (`leave q` on the left, row 2q; its output q on its right
  // border, row 2q + 1): the dotted crossing runs along the upper row's line, then down into
  // the lower port, clear of both labels, so the box is as narrow as one label.
  const w = 2 * LAYOUT.LABEL_IN + Math.max(leftBudget, rightBudget) + LAYOUT.SPINE_MIN;
  const box = {kind, w, h: rowsHeight(2 * count), rows: count, inZone: w - 2 * LAYOUT.LABEL_IN - LAYOUT.SPINE_MIN,
    outZone: w - 2 * LAYOUT.LABEL_IN - LAYOUT.SPINE_MIN, lanes: [], title: "", shownTitle: ""};
  box.inY = (p) => rowY(2 * p);
  box.outY = (p) => rowY(2 * p + 1);
  return box;
}

function arrange(path, body, band, model, owner, least = 0) {
  // One scope's layout (the root's: path [], owner null): boxes in columns by rank (a crowded
  // rank split), columns packed into bands at most `band` wide, and every edge's route, all
  // relative to the layout's top left corner. `model` answers what the graph view decides: which
  // operators are shown, which scopes open, their titles, arities and internal connections.
  // `least`: the layout's least width (an open scope's title may be wider than its inside).
  const nested = path.length > 0;
  const nodes = body.nodes.filter((n) => model.shown(path, n)).sort((a, b) => a.id - b.id);
  const ids = new Set(nodes.map((n) => n.id));
  const edges = (body.edges || []).filter((e) => (e.source.node === 0 && nested) || ids.has(e.source.node))
    .filter((e) => (e.target.node === 0 && nested) || ids.has(e.target.node));
  const rank = ranks(nodes, edges, nested);
  const arity = model.arity(path);
  const boxes = new Map();  // node id -> its box; 0 inside a scope: "entry" (sources) and "exit" (targets)
  const byRank = [];
  for (const node of nodes) {
    const r = rank.get(node.id);
    while (byRank.length <= r) byRank.push([]);
    const box = nodeBox(path, node, band, model, arity);
    boxes.set(node.id, box);
    byRank[r].push(box);
  }
  const columns = [];
  let entry = null, exit = null;
  if (nested && owner.inputs) {
    entry = boundaryBox("entry", owner.inputs, portBudget(model.arity(path.slice(0, -1))), portBudget(arity));
    columns.push([entry]);
  }
  if (nested && owner.outputs) {
    exit = boundaryBox("exit", owner.outputs, portBudget(arity), portBudget(model.arity(path.slice(0, -1))));
  }
  for (const boxesOfRank of byRank) {
    for (let i = 0; i < boxesOfRank.length; i += LAYOUT.PER_COLUMN) columns.push(boxesOfRank.slice(i, i + LAYOUT.PER_COLUMN));
  }

  // Bands: the entry box (if any) at the very left of the first one, on the scope's border; every
  // other band after the left margin; the exit box at the very right of the last one.
  const bands = [];
  let current = {columns: [], x: entry ? 0 : LAYOUT.MARGIN};
  for (const boxesOfColumn of columns) {
    const w = Math.max(...boxesOfColumn.map((b) => b.w));
    if (current.columns.length && current.x + w + LAYOUT.COL_GAP + LAYOUT.MARGIN > band) {
      bands.push(current);
      current = {columns: [], x: LAYOUT.MARGIN};
    }
    current.columns.push({boxes: boxesOfColumn, x0: current.x, x1: current.x + w});
    current.x += w + LAYOUT.COL_GAP;
  }
  bands.push(current);
  let width = Math.max(least, ...bands.map((b) => b.x + LAYOUT.MARGIN));
  if (exit) {
    const last = bands[bands.length - 1];
    width = Math.max(width, last.x + exit.w);
    last.columns.push({boxes: [exit], x0: width - exit.w, x1: width});
  }
  let y = LAYOUT.END;
  bands.forEach((b, index) => {
    b.top = y;
    let height = 0;
    b.columns.forEach((column, c) => {
      let yy = y;
      for (const box of column.boxes) {
        box.x0 = column.x0 + (column.x1 - column.x0 - box.w) / 2;
        box.y0 = yy + LAYOUT.TITLE;
        box.band = index;
        box.column = c;
        yy = box.y0 + box.h + LAYOUT.ROW_GAP;
      }
      height = Math.max(height, yy - LAYOUT.ROW_GAP - y);
    });
    b.bottom = y + height;
    y = b.bottom + LAYOUT.BAND_GAP;
  });
  const height = bands[bands.length - 1].bottom + LAYOUT.END;
  const layout = {w: width, h: height, boxes: [...(entry ? [entry] : []), ...boxes.values(), ...(exit ? [exit] : [])],
    bands, entry, exit, rank, routes: []};
  layout.routes = edges.map((e) => ({edge: e, index: body.edges.indexOf(e),
    ...route(layout, e.source.node === 0 && nested ? entry : boxes.get(e.source.node), e.source.port,
      e.target.node === 0 && nested ? exit : boxes.get(e.target.node), e.target.port)}));
  return layout;
}

function nodeBox(path, node, band, model, arity) {
  // An operator's or a closed scope's box, or an open scope's (its inside's layout).
  if (model.isOpen(path, node)) {
    const title = model.title(path, node);
    const least = Math.min(textWidth(title, LAYOUT.TITLE_PX, true) + 12, LAYOUT.TITLE_MAX);
    const inner = arrange([...path, node.id], node.scope, Math.max(band - 2 * LAYOUT.MARGIN - LAYOUT.COL_GAP, 480), model, node, least);
    const w = inner.w;
    const box = {kind: "open", node, w, h: inner.h, inner, title, shownTitle: fitText(title, w - 8, LAYOUT.TITLE_PX, true)};
    box.inY = (p) => inner.entry.y0 + inner.entry.inY(p);
    box.outY = (p) => inner.exit.y0 + inner.exit.outY(p);
    return box;
  }
  const lanes = [];
  if (!node.scope) {
    for (const c of model.connections(path, node)) {
      const label = c.summaries.some((t) => t.some((v) => v > 0)) ? c.summaries.map((t) => "+" + layoutTime(t)).join(" ") : "";
      if (label || model.detail) lanes.push({connection: c, label, w: label ? textWidth(label) + 10 : LAYOUT.LANE});
    }
  }
  const budget = portBudget(arity);
  const box = portBox("operator", node.inputs, node.outputs, budget, budget, lanes, model.title(path, node));
  box.node = node;
  return box;
}

function route(layout, from, fromPort, to, toPort) {
  // The waypoints of an edge from output `fromPort` of box `from` to input `toPort` of box `to`,
  // through gaps, corridors and margins only (see the top of this file). Each use of a channel
  // takes the next lane in it, so that parallel edges run side by side.
  const lanes = layout.lanes || (layout.lanes = new Map());
  const lane = (key, lo, hi) => {
    const n = lanes.get(key) || 0;
    lanes.set(key, n + 1);
    const count = Math.max(1, Math.floor((hi - lo - 2 * LAYOUT.LANE) / LAYOUT.LANE) + 1);
    return lo + LAYOUT.LANE + (n % count) * LAYOUT.LANE;
  };
  const bands = layout.bands;
  const gapAfter = (b, c) => {
    const columns = bands[b].columns;
    const x0 = columns[c].x1, x1 = c + 1 < columns.length ? columns[c + 1].x0 : x0 + LAYOUT.COL_GAP;
    return lane(`g${b}:${c}`, x0, x1);
  };
  const gapBefore = (b, c) => (c === 0 ? lane("left", 0, LAYOUT.MARGIN) : gapAfter(b, c - 1));
  const corridor = (k) => {  // above band k (k = bands.length: below the last)
    const y0 = k === 0 ? 0 : bands[k - 1].bottom, y1 = k === bands.length ? layout.h : bands[k].top;
    return lane(`c${k}`, y0, y1);
  };
  const s = {x: from.x0 + from.w - LAYOUT.INSET, y: from.y0 + from.outY(fromPort)};
  const t = {x: to.x0 + LAYOUT.INSET, y: to.y0 + to.inY(toPort)};
  const bs = from.band, cs = from.column, bt = to.band, ct = to.column;
  let points;
  if (bs === bt && ct === cs + 1) {
    const x = gapAfter(bs, cs);
    points = [[x, s.y], [x, t.y]];
  } else if (bs === bt) {  // back (a loop) under the band, forward over it
    const x = gapAfter(bs, cs), y = corridor(ct > cs ? bs : bs + 1), xt = gapBefore(bt, ct);
    points = [[x, s.y], [x, y], [xt, y], [xt, t.y]];
  } else if (bt === bs + 1) {  // to the next band (a wrapped line): through the corridor between them
    const x = gapAfter(bs, cs), y = corridor(bt), xt = gapBefore(bt, ct);
    points = [[x, s.y], [x, y], [xt, y], [xt, t.y]];
  } else if (bt > bs) {  // further down: down the left margin
    const x = gapAfter(bs, cs), y = corridor(bs + 1), m = lane("left", 0, LAYOUT.MARGIN), y2 = corridor(bt);
    const xt = ct === 0 ? m : gapBefore(bt, ct);
    points = [[x, s.y], [x, y], [m, y], [m, y2], [xt, y2], [xt, t.y]];
  } else {  // up to an earlier band: up the right margin (the last band, which holds the exit, is never passed)
    const x = gapAfter(bs, cs), y = corridor(bs), m = lane("right", layout.w - LAYOUT.MARGIN, layout.w), y2 = corridor(bt);
    const xt = gapBefore(bt, ct);
    points = [[x, s.y], [x, y], [m, y], [m, y2], [xt, y2], [xt, t.y]];
  }
  return {from, fromPort, to, toPort, source: s, target: t, points};
}

function segmentStyle(source, target, points) {
  // Cytoscape's "segments" edges take their bends as weights along, and distances across, the
  // line from the source's centre to the target's ("edge-distances: node-position").
  const dx = target.x - source.x, dy = target.y - source.y, length = Math.hypot(dx, dy) || 1;
  const ux = dx / length, uy = dy / length;
  return {
    weights: points.map(([x, y]) => ((x - source.x) * ux + (y - source.y) * uy) / length),
    distances: points.map(([x, y]) => (x - source.x) * -uy + (y - source.y) * ux),
  };
}
