"""ages: what the lag bookkeeping (api.live.ages) adds to a batch's apply-and-publish path.

A ring of ``operators`` operators fed by an input (``bench.workloads.loop_graph``), on the
compiled engine as the service runs it: each batch moves the input's capability to the next
epoch and adds and retires ``messages`` pointstamps, so every location's frontier moves (the
change batch is as large as it gets). Per batch, the same work is timed without and with the
bookkeeping: parse (``parse_indexed``), apply (``apply_indexed``), publish (encode, history)
and, with it, the changed locations' times (``Ages.frontier_moved``) and the durable batch
queued (``Ages.batch_durable``); both are folded in when their queues grow long, and once at
the end, as a reader would (the "in total" columns).
Everything is in-process (no HTTP, no log), so the difference is not hidden by I/O.

>>> row = _measure(3, 2, 40)
>>> row["overhead_pct"] < 100 and row["with_us"] > 0
True
"""

from __future__ import annotations

import json
import statistics
import time
from typing import Any

from api.live.ages import Ages
from api.schema.parsing import parse_indexed
from api.streams.publish import Publication
from bench.workloads import core_graph, loop_graph
from tracker.compiled import CompiledTracker

TARGET_OVERHEAD_PCT = 5.0
"""The bookkeeping may add at most this much to a batch's own in-process path."""


def _bodies(operators: int, messages: int, batches: int) -> list[bytes]:
    out = []
    for epoch in range(batches):
        updates = [{"location": {"node": 0, "port": 0, "kind": "source"}, "time": [epoch], "delta": -1},
                   {"location": {"node": 0, "port": 0, "kind": "source"}, "time": [epoch + 1], "delta": 1}]
        for i in range(messages):  # a message produced at one operator, consumed a batch later
            node = 1 + i % operators
            updates.append({"location": {"node": node, "port": 0, "kind": "source"}, "time": [epoch + 1], "delta": 1})
            if epoch:
                updates.append({"location": {"node": node, "port": 0, "kind": "source"}, "time": [epoch],
                                "delta": -1})
        out.append(json.dumps({"worker": f"w{epoch % 4}", "seq": epoch, "updates": updates}).encode())
    return out


def _run(operators: int, bodies: list[bytes], with_ages: bool) -> tuple[float, float]:
    """Seconds per batch over ``bodies``: on the batch's own path (the mean of the middle half
    of the batches after the first quarter, robust to the machine's other work, and leaving out
    the rare batch that folds the queues), and in total (everything, the folds and the final
    read included, divided by the batches)."""
    graph, initial = core_graph(loop_graph(operators))
    tracker = CompiledTracker(graph, cycles_checked=True)
    tracker.apply(initial, validated=True)
    engine = tracker.engine
    ages = Ages(time.time(), counts=tracker.pointstamps)
    publication = Publication(graph, 100_000, native=engine, moved=ages.frontier_moved if with_ages else None)
    publication.reset(tracker.frontiers(), 0)
    times = []
    begun = time.perf_counter()
    for version, body in enumerate(bodies, start=1):
        started = time.perf_counter()
        worker, _, updates = parse_indexed(body, graph)
        changes = engine.apply_indexed(updates.locations, updates.times, updates.deltas)
        if with_ages:
            ages.batch_durable(time.time(), worker, updates)
        publication.publish(version, changes, notify=False)
        times.append(time.perf_counter() - started)
    if with_ages:  # what the readers pay once: every queued batch folded in
        assert ages.oldest_by_location() and ages.moved_at(graph.locations()[0])
    total = (time.perf_counter() - begun) / len(bodies)
    kept = sorted(times[len(times) // 4:])
    return statistics.fmean(kept[len(kept) // 4: 3 * len(kept) // 4]), total


def _measure(operators: int, messages: int, batches: int, rounds: int = 5) -> dict[str, Any]:
    bodies = _bodies(operators, messages, batches)
    without, with_ = [], []
    for _ in range(rounds):  # interleaved, best of each: the machine's noise hits both alike
        without.append(_run(operators, bodies, False))
        with_.append(_run(operators, bodies, True))
    base, extra = min(p for p, _ in without), min(p for p, _ in with_)
    base_total, extra_total = min(t for _, t in without), min(t for _, t in with_)
    return {"operators": operators, "messages": messages, "without_us": round(base * 1e6, 1),
            "with_us": round(extra * 1e6, 1), "overhead_pct": round(100 * (extra - base) / base, 1),
            "total_without_us": round(base_total * 1e6, 1), "total_with_us": round(extra_total * 1e6, 1),
            "total_overhead_pct": round(100 * (extra_total - base_total) / base_total, 1)}


def run(quick: bool) -> dict[str, Any]:
    """Small and large rings, few and many messages per batch."""
    batches = 600 if quick else 3000
    rows = [_measure(ops, msgs, batches) for ops, msgs in ((10, 2), (10, 50), (200, 2), (200, 200))]
    print(f"{'operators':>9} {'messages':>8} | per batch: {'without':>8} {'with':>8} {'overhead':>8} | "
          f"in total: {'without':>8} {'with':>8} {'overhead':>8}  (us per batch)")
    for row in rows:
        print(f"{row['operators']:>9} {row['messages']:>8} | {'':>11}{row['without_us']:>8} {row['with_us']:>8} "
              f"{row['overhead_pct']:>7}% | {'':>10}{row['total_without_us']:>8} {row['total_with_us']:>8} "
              f"{row['total_overhead_pct']:>7}%")
    worst = max(row["overhead_pct"] for row in rows)
    return {"name": "ages", "figures": {"rows": rows, "worst_overhead_pct": worst,
                                        "worst_total_overhead_pct": max(row["total_overhead_pct"] for row in rows)},
            "targets": {"overhead_pct": TARGET_OVERHEAD_PCT, "met": worst <= TARGET_OVERHEAD_PCT}}
