"""The semi-naive fixed point shared by ``summarize`` and ``propagate``: merge new candidates
into a per-key lower envelope and report which rows are genuinely new.

Each round the state and the candidates are grouped once per key (``unionByName`` + ``groupBy``,
a shape measured flat), the result is cut from its lineage with an eager
``localCheckpoint`` and the loop stops when ``count()`` of the new rows is zero.

>>> # merged, new = merge(state, candidates, ["dataflow_id", "loc"], "time", arity_one=True)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from spark_jobs.frames import Progress, cut


def merge(
    state: DataFrame, candidates: DataFrame, keys: Sequence[str], col: str, arity_one: bool
) -> tuple[DataFrame, DataFrame]:
    """``(state', new)``: ``state'`` is the per-key envelope of ``state`` and ``candidates``;
    ``new`` are its rows absent from ``state`` (the next round's delta).

    One shuffle: the union is grouped once, and each surviving element is flagged new unless it
    came from ``state``; the flagged frame is checkpointed once and both results are projections
    of it, so neither recomputes anything. ``state`` must already be an envelope.
    """
    keys = list(keys)
    tagged = state.select(*keys, col, F.lit(True).alias("_old")).unionByName(
        candidates.select(*keys, col, F.lit(False).alias("_old"))
    )
    if arity_one:
        # Old rows are each key's unique minimum, so the min is new iff it beats the old one.
        grouped = tagged.groupBy(*keys).agg(
            F.min(col).alias(col), F.min(F.when(F.col("_old"), F.col(col))).alias("_was")
        )
        flagged = grouped.select(*keys, col, (F.col("_was").isNull() | (F.col(col) < F.col("_was"))).alias("_new"))
    else:
        dominated = "exists(_all, u -> u != t AND forall(zip_with(u, t, (a, b) -> a <= b), x -> x))"
        grouped = tagged.groupBy(*keys).agg(
            F.collect_set(col).alias("_all"), F.collect_set(F.when(F.col("_old"), F.col(col))).alias("_olds")
        )
        flagged = grouped.select(*keys, F.explode(F.expr(f"filter(_all, t -> NOT {dominated})")).alias(col), "_olds")
        flagged = flagged.select(*keys, col, (~F.array_contains(F.col("_olds"), F.col(col))).alias("_new"))
    flagged = cut(flagged)
    return flagged.select(*keys, col), flagged.where(F.col("_new")).select(*keys, col)


def fixed_point(
    state: DataFrame,
    delta: DataFrame,
    step: Callable[[DataFrame, DataFrame], DataFrame],
    keys: Sequence[str],
    col: str,
    arity_one: bool,
    progress: Progress | None = None,
    max_rounds: int = 100_000,
) -> DataFrame:
    """Iterate ``candidates = step(delta, state)`` and :func:`merge` until nothing new appears.

    ``state`` and ``delta`` must be envelopes (``delta`` within ``state``). Returns the final state.
    Raises ``RuntimeError`` after ``max_rounds`` (only possible with a non-incrementing cycle).
    """
    progress = progress or Progress()
    state, delta = cut(state), cut(delta)
    pending = delta.count()
    while pending:
        if progress.rounds >= max_rounds:
            raise RuntimeError(f"{progress.label}: no fixed point after {max_rounds} rounds")
        candidates = step(delta, state)
        state, delta = merge(state, candidates, keys, col, arity_one)
        pending = delta.count()
        progress.round(pending, state, candidates)
    return state
