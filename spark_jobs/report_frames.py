"""The figures of ``tracker report`` (:mod:`spark_jobs.report`), as Polars frames computed from
the Delta tables' rows: current frontiers, epoch clear times, stuck locations, blockers and
throughput, every location named by its scope path and its operator's name within its scope.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime

import polars as pl


def scoped(frame: pl.DataFrame) -> pl.DataFrame:
    """``frame`` with a ``scope`` column (``[]``, the root, where it has none).

    >>> scoped(pl.DataFrame({"node": [1]}))["scope"].to_list()
    [[]]
    """
    if "scope" in frame.columns:
        return frame
    return frame.with_columns(pl.Series("scope", [[]] * frame.height, dtype=pl.List(pl.Int32)))


def _names(nodes: pl.DataFrame) -> dict[tuple[tuple[int, ...], int], str]:
    """Each operator's name by ``(scope, node)``; a nested scope's boundary (node 0 inside it) is
    called after its scope node: ``loop boundary``."""
    if nodes.is_empty():
        return {}
    nodes = scoped(nodes)
    names = {(tuple(scope), node): name for scope, node, name in
             zip(nodes["scope"].to_list(), nodes["node"].to_list(), nodes["name"].to_list(), strict=True)}
    for (scope, node), name in list(names.items()):
        if scope and node == 0:
            names[(scope, 0)] = f"{names.get((scope[:-1], scope[-1]), 'scope')} {name or 'boundary'}"
    return names


def time_text(time: list[int] | tuple[int, ...]) -> str:
    return "(" + ", ".join(str(x) for x in time) + ")"


def current_frontiers(frontiers: pl.DataFrame, nodes: pl.DataFrame) -> pl.DataFrame:
    """One row per location that has a non-empty frontier: node, operator name, port, kind,
    the frontier's elements (sorted) and its text.

    >>> f = pl.DataFrame({"node": [1, 1], "port": [0, 0], "kind": ["target"] * 2, "time": [[4], [3]]})
    >>> n = pl.DataFrame({"node": [1], "name": ["map"]})
    >>> current_frontiers(f, n)["frontier"].to_list()
    ['{(3), (4)}']
    """
    if frontiers.is_empty():
        return pl.DataFrame(
            schema={
                "scope": pl.List(pl.Int32),
                "node": pl.Int32,
                "name": pl.String,
                "port": pl.Int32,
                "kind": pl.String,
                "times": pl.List(pl.List(pl.Int64)),
                "frontier": pl.String,
            }
        )
    names = _names(nodes)
    grouped = (
        scoped(frontiers).group_by("scope", "node", "port", "kind")
        .agg(pl.col("time").sort().alias("times"))
        .sort(pl.col("scope").list.len(), "scope", "node",
              pl.col("kind").replace_strict({"target": 0, "source": 1}, default=2), "port")
    )
    named = [names.get((tuple(scope), node)) for scope, node in zip(grouped["scope"].to_list(),
                                                                    grouped["node"].to_list(), strict=True)]
    texts = ["{" + ", ".join(time_text(t) for t in times) + "}" for times in grouped["times"].to_list()]
    return grouped.with_columns(pl.Series("name", named, dtype=pl.String), pl.Series("frontier", texts)).select(
        "scope", "node", "name", "port", "kind", "times", "frontier")


def epoch_clear_times(changes: pl.DataFrame, nodes: pl.DataFrame, created_at: datetime) -> pl.DataFrame:
    """Per operator and epoch: when the epoch first appeared in the operator's input frontier,
    when it left (null while it is still there) and the seconds in between.

    Changes are replayed version by version, so an element that moves within one batch (as
    ``(e, i)`` to ``(e, i+1)`` in a loop) does not make its epoch look cleared.

    >>> from datetime import UTC
    >>> t0 = datetime(2026, 1, 1, tzinfo=UTC)
    >>> at = [t0.replace(second=s) for s in (5, 5, 9)]
    >>> ch = pl.DataFrame({"version": [1, 1, 2], "node": [1] * 3, "port": [0] * 3, "kind": ["target"] * 3,
    ...                    "time": [[0], [1], [1]], "diff": [-1, 1, -1], "at": at})
    >>> epoch_clear_times(ch, pl.DataFrame({"node": [1], "name": ["op"]}), t0)["seconds"].to_list()
    [5.0, 4.0]
    """
    names = _names(nodes)
    targets = scoped(changes).filter(pl.col("kind") == "target").sort("version", maintain_order=True)
    Operator = tuple[tuple[int, ...], int]  # (scope, node)
    present: dict[Operator, set[tuple[int, tuple[int, ...]]]] = defaultdict(set)  # -> {(port, time)}
    appeared: dict[tuple[Operator, int], datetime] = {}
    cleared: dict[tuple[Operator, int], datetime] = {}

    def epochs_of(operator: Operator) -> set[int]:
        return {time[0] for _port, time in present[operator]}

    for (version,), batch in targets.group_by("version", maintain_order=True):
        del version  # only the grouping matters: one batch's changes are applied together
        rows = [((tuple(r["scope"]), r["node"]), r) for r in batch.iter_rows(named=True)]
        for operator, row in rows:
            element = (row["port"], tuple(row["time"]))
            if row["diff"] < 0 and element not in present[operator]:
                # It leaves without having been seen to enter: it was there since registration.
                present[operator].add(element)
                appeared.setdefault((operator, element[1][0]), created_at)
        at_by_operator: dict[Operator, datetime] = {}
        before = {operator: epochs_of(operator) for operator, _ in rows}
        for operator, row in rows:
            element = (row["port"], tuple(row["time"]))
            at_by_operator[operator] = max(at_by_operator.get(operator, row["at"]), row["at"])
            if row["diff"] > 0:
                present[operator].add(element)
            else:
                present[operator].discard(element)
        for operator, old in before.items():
            new = epochs_of(operator)
            for epoch in new - old:
                appeared.setdefault((operator, epoch), at_by_operator[operator])
                cleared.pop((operator, epoch), None)  # back again (a protocol violation): not cleared yet
            for epoch in old - new:
                cleared[(operator, epoch)] = at_by_operator[operator]
    found = []
    for ((scope, node), epoch), start in sorted(appeared.items(), key=lambda kv: (len(kv[0][0][0]), kv[0])):
        end = cleared.get(((scope, node), epoch))
        found.append(
            {
                "scope": list(scope),
                "node": node,
                "name": names.get((scope, node)),
                "epoch": epoch,
                "appeared_at": start,
                "cleared_at": end,
                "seconds": None if end is None else round((end - start).total_seconds(), 6),
            }
        )
    schema = {
        "scope": pl.List(pl.Int32),
        "node": pl.Int32,
        "name": pl.String,
        "epoch": pl.Int64,
        "appeared_at": pl.Datetime("us", "UTC"),
        "cleared_at": pl.Datetime("us", "UTC"),
        "seconds": pl.Float64,
    }
    return pl.DataFrame(found, schema=schema, orient="row") if found else pl.DataFrame(schema=schema)  # type: ignore[arg-type]


def stuck_locations(
    frontiers: pl.DataFrame, changes: pl.DataFrame, created_at: datetime, as_of: datetime, limit: int = 10,
    nodes: pl.DataFrame | None = None,
) -> pl.DataFrame:
    """The ``limit`` locations most likely stuck, in any scope: non-empty frontiers, oldest time
    first, then the longest unchanged (since their last frontier change, or registration),
    named by ``nodes`` if given."""
    nodes = pl.DataFrame({"node": [], "name": []}, schema={"node": pl.Int32, "name": pl.String}) if nodes is None \
        else nodes
    current = current_frontiers(frontiers, nodes)
    if current.is_empty():
        return current.select("scope", "node", "name", "port", "kind", "frontier").with_columns(
            pl.lit(None, pl.List(pl.Int64)).alias("oldest"),
            pl.lit(None, pl.Datetime("us", "UTC")).alias("since"),
            pl.lit(None, pl.Float64).alias("unchanged_seconds"),
        )
    last = scoped(changes).group_by("scope", "node", "port", "kind").agg(pl.col("at").max().alias("since"))
    result = (
        current.join(last, on=["scope", "node", "port", "kind"], how="left")
        .with_columns(pl.col("since").fill_null(created_at), pl.col("times").list.first().alias("oldest"))
        .with_columns(((pl.lit(as_of) - pl.col("since")).dt.total_microseconds() / 1e6).alias("unchanged_seconds"))
        .sort("oldest", "since", pl.col("scope").list.len(), "scope", "node", "port")
    )
    return result.select("scope", "node", "name", "port", "kind", "frontier", "oldest", "since",
                         "unchanged_seconds").head(limit)


def blockers(pointstamps: pl.DataFrame, nodes: pl.DataFrame, as_of: datetime, limit: int = 10) -> pl.DataFrame:
    """The ``limit`` live pointstamps that hold frontiers back longest, in any scope: the oldest
    time first, then the earliest born; each with its operator's name, the worker that last
    reported it and how long it has been live (``null`` where the table does not know).

    >>> from datetime import UTC
    >>> t0 = datetime(2026, 1, 1, tzinfo=UTC)
    >>> p = pl.DataFrame({"scope": [[], [1]], "node": [0, 1], "port": [0, 0], "kind": ["source"] * 2,
    ...                   "time": [[3], [2, 5]], "count": [1, 1], "born_at": [t0, t0], "worker": ["w0", "w1"]})
    >>> n = pl.DataFrame({"scope": [[], [], [1]], "node": [0, 1, 1], "name": ["input", "loop", "step"]})
    >>> blockers(p, n, t0.replace(second=9))[["scope", "name", "worker", "age_seconds"]].rows()
    [([1], 'step', 'w1', 9.0), ([], 'input', 'w0', 9.0)]
    """
    names = _names(nodes)
    frame = scoped(pointstamps)
    for column, kind in (("born_at", pl.Datetime("us", "UTC")), ("worker", pl.String)):
        if column not in frame.columns:  # a table written before these columns existed
            frame = frame.with_columns(pl.lit(None, kind).alias(column))
    frame = frame.filter(pl.col("count") != 0).sort("time", "born_at", pl.col("scope").list.len(), "scope", "node",
                                                     "port", nulls_last=True).head(limit)
    named = [names.get((tuple(scope), node)) for scope, node in zip(frame["scope"].to_list(), frame["node"].to_list(),
                                                                    strict=True)]
    return frame.with_columns(
        pl.Series("name", named, dtype=pl.String),
        ((pl.lit(as_of) - pl.col("born_at")).dt.total_microseconds() / 1e6).alias("age_seconds"),
    ).select("scope", "node", "name", "port", "kind", "time", "count", "worker", "born_at", "age_seconds")


def throughput(progress: pl.DataFrame) -> pl.DataFrame:
    """Applied batches and updates per second of arrival (``progress.received_at``)."""
    if progress.is_empty():
        return pl.DataFrame(schema={"second": pl.Datetime("us", "UTC"), "batches": pl.UInt32, "updates": pl.UInt32})
    return (
        progress.filter(pl.col("version") > 0)  # version 0 holds the initial pointstamps, not a batch
        .with_columns(pl.col("received_at").dt.truncate("1s").alias("second"))
        .group_by("second")
        .agg(pl.col("version").n_unique().alias("batches"), (pl.col("delta") != 0).sum().alias("updates"))
        .sort("second")
    )
