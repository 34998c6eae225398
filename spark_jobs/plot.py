"""``tracker report --plot FILE``: epochs cleared and lag over time, drawn with matplotlib
(headless, the ``Agg`` backend) as SVG or PNG, chosen by the file's suffix.

Two panels over the same time axis, from the report's figures and its ``frontier_changes``:

* **epochs cleared**: how many ``(operator, epoch)`` pairs had cleared by each moment (the
  report's epoch clear times, counted as they happen: a step up at each ``cleared_at``);
* **lag**: for each operator (the ``MAX_LINES`` whose lag peaked highest), the largest lag of its
  inputs: the seconds since that input's frontier last changed, while it is not empty, replayed
  version by version; a sawtooth that drops to 0 at every change and grows one second per
  second while nothing moves, up to the report's ``as_of``.

In an SVG each series is a group whose id names it: ``epochs-cleared``, and ``lag-<scope>-<node>``
(``lag--3`` for node 3 of the root, ``lag-1-2`` for node 2 inside scope node 1).
"""

from __future__ import annotations

from bisect import bisect_right
from collections import defaultdict
from datetime import datetime, timedelta
from pathlib import Path
from typing import Protocol

import polars as pl

MAX_LINES = 8
"""Operators drawn in the lag panel, the highest peaks first."""
FORMATS = (".svg", ".png")


Operator = tuple[tuple[int, ...], int]


class Plotted(Protocol):
    """What the plot reads of a report (:class:`spark_jobs.report.Report`)."""

    dataflow_id: str
    name: str
    created_at: datetime
    as_of: datetime
    epochs: pl.DataFrame
    changes: pl.DataFrame | None


def series_id(operator: Operator) -> str:
    """The SVG id of an operator's lag line.

    >>> series_id(((), 3)), series_id(((1,), 2))
    ('lag--3', 'lag-1-2')
    """
    scope, node = operator
    return f"lag-{'.'.join(map(str, scope))}-{node}"


def epochs_cleared(epochs: pl.DataFrame) -> list[tuple[datetime, int]]:
    """``(moment, epochs cleared by then)`` at every moment some cleared."""
    moments = sorted(t for t in epochs["cleared_at"].to_list() if t is not None) if not epochs.is_empty() else []
    counts: dict[datetime, int] = {}
    for number, moment in enumerate(moments, start=1):
        counts[moment] = number
    return sorted(counts.items())


def lag_series(changes: pl.DataFrame, created_at: datetime, as_of: datetime) -> dict[Operator, list[tuple[datetime,
                                                                                                          float]]]:
    """Per operator with inputs: ``(moment, seconds)`` of its largest input lag, exact at every
    change (just before it and at it) and at ``as_of``. An input's frontier holds its
    registration's elements (version 0) from ``created_at``.

    >>> from datetime import UTC
    >>> t0 = datetime(2026, 1, 1, tzinfo=UTC)
    >>> ch = pl.DataFrame({"scope": [[], [], []], "node": [1, 1, 1], "port": [0, 0, 0], "kind": ["target"] * 3,
    ...                    "version": [0, 1, 1], "time": [[0], [0], [1]], "diff": [1, -1, 1],
    ...                    "at": [t0, t0 + timedelta(seconds=4), t0 + timedelta(seconds=4)]})
    >>> [(int((t - t0).total_seconds() * 1000), s) for t, s in lag_series(ch, t0, t0 + timedelta(seconds=6))[((), 1)]]
    [(0, 0.0), (3999, 3.999), (4000, 0.0), (5999, 1.999), (6000, 2.0)]
    """
    inputs: dict[tuple[Operator, int], list[tuple[datetime, int]]] = {}  # -> [(applied at, elements after)]
    targets = changes.filter(pl.col("kind") == "target") if not changes.is_empty() else changes
    grouped: dict[tuple[Operator, int], dict[int, list[tuple[datetime, tuple[int, ...], int]]]] = defaultdict(
        lambda: defaultdict(list))
    for row in targets.iter_rows(named=True):
        key = ((tuple(row["scope"] or ()), row["node"]), row["port"])
        grouped[key][row["version"]].append((row["at"], tuple(row["time"]), row["diff"]))
    for key, versions in grouped.items():
        present: set[tuple[int, ...]] = set()
        states = [(created_at, 0)]
        for version in sorted(versions):
            batch = versions[version]
            for _, time_, diff in batch:
                if diff < 0 and time_ not in present:
                    # It leaves without having been seen to enter: it was there since registration.
                    present.add(time_)
                    states[0] = (created_at, states[0][1] + 1)
            for _, time_, diff in batch:
                (present.add if diff > 0 else present.discard)(time_)
            at = max(a for a, _, _ in batch)
            states.append((created_at if version == 0 else at, len(present)))
        inputs[key] = states
    moments = sorted({created_at, as_of, *(at for states in inputs.values() for at, _ in states)})
    tick = timedelta(milliseconds=1)
    samples = sorted({*moments, *(m - tick for m in moments if m - tick > created_at)})
    found: dict[Operator, list[tuple[datetime, float]]] = defaultdict(list)
    by_operator: dict[Operator, list[list[tuple[datetime, int]]]] = defaultdict(list)
    for (operator, _port), states in inputs.items():
        by_operator[operator].append(states)
    for operator, ports in sorted(by_operator.items()):
        for moment in samples:
            if moment > as_of:
                continue
            worst = 0.0
            for states in ports:
                index = bisect_right([at for at, _ in states], moment) - 1
                if index >= 0 and states[index][1] > 0:
                    worst = max(worst, (moment - states[index][0]).total_seconds())
            found[operator].append((moment, round(worst, 6)))
    return dict(found)


def plot(report: Plotted, path: Path) -> None:
    """Draw the report's epochs cleared and lag over time into ``path`` (``.svg`` or ``.png``)."""
    import matplotlib

    matplotlib.use("Agg")  # headless: no display, no GUI toolkit
    from matplotlib import pyplot

    names = {((tuple(r["scope"] or ())), r["node"]): r["name"] for r in report.epochs.iter_rows(named=True)}
    changes = report.changes if report.changes is not None else pl.DataFrame()
    lags = lag_series(changes, report.created_at, report.as_of)
    peaks = sorted(lags, key=lambda op: (-max(s for _, s in lags[op]), op))[:MAX_LINES]
    figure, (top, bottom) = pyplot.subplots(2, 1, sharex=True, figsize=(10, 6.5))
    simplify = matplotlib.rcParams["path.simplify"]
    matplotlib.rcParams["path.simplify"] = False  # every sample drawn: a sawtooth's points are not noise
    try:
        cleared = epochs_cleared(report.epochs)
        moments = [report.created_at, *(t for t, _ in cleared), report.as_of]
        counts = [0, *(n for _, n in cleared), cleared[-1][1] if cleared else 0]
        (line,) = top.step(moments, counts, where="post", color="tab:blue", label="epochs cleared")
        line.set_gid("epochs-cleared")
        top.set_ylabel("epochs cleared (operator, epoch)")
        top.set_title(f"{report.name} ({report.dataflow_id})")
        top.grid(alpha=0.3)
        for operator in peaks:
            scope, node = operator
            where = f"[{','.join(map(str, scope))}] " if scope else ""
            label = f"{where}{names.get(operator) or 'operator'} #{node}"
            points = lags[operator]
            (drawn,) = bottom.plot([t for t, _ in points], [s for _, s in points], label=label)
            drawn.set_gid(series_id(operator))
        bottom.set_ylabel("input lag (s)")
        bottom.set_xlabel("time (UTC)")
        bottom.grid(alpha=0.3)
        if peaks:
            bottom.legend(loc="upper left", fontsize="small")
        figure.autofmt_xdate()
        figure.tight_layout()
        figure.savefig(path, format=path.suffix.lstrip(".").lower())
    finally:
        matplotlib.rcParams["path.simplify"] = simplify
        pyplot.close(figure)
