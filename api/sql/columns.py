"""``live_lag`` from the compiled engine's columns, computed by Arrow's kernels.

A dataflow on the compiled engine (not nested) gives its frontiers (``Frontiers.list_columns``)
and when each location last moved (``MovedAt.stamps``) as buffers; every other column of its
``live_lag`` rows is computed from them by Arrow's compute kernels, which run without the GIL.
What is left in Python is per live pointstamp (the oldest of each location holding some), per
location a restart seeded, and a few rows whose rounding Arrow could get wrong: no Python object
per location, so a query's copy of a 100,000-location dataflow barely touches the event loop's
interpreter.

Guarantees: the rows equal those read a location at a time (:func:`api.sql.live._lag_slice`'s
other path, which computes its columns with :func:`lag_of` too), including every instant's
microsecond and every age's rounding to 1 ms (``round(x, 3)``, as the REST answers).

May import: pyarrow, progress_engine (types only).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

if TYPE_CHECKING:
    from progress_engine import Frontiers, MovedAt

_LONG = pa.int64()
_INT = pa.int32()
_TS = pa.timestamp("us", tz="UTC")
_NEAR_TIE = 1e-3
"""How close (in units of the last kept digit) a scaled age may come to a tie before it is
rounded by Python instead: ``round(x * 1000)`` can differ from ``round(x, 3)`` only within an
ulp of a tie, and the ulp of ``x * 1000`` is under this up to ``x`` of 139 years."""

Oldest = tuple[Sequence[int], float, str | None]
"""A location's oldest live pointstamp: ``(time, born at, worker)``."""


def micros(at: pa.Array) -> pa.Array:
    """POSIX seconds (``float64``, no nulls) as ``timestamp[us, UTC]``, rounded as
    ``datetime.fromtimestamp`` rounds (the whole seconds, then the fraction's microseconds half
    to even): the same instants as :func:`api.sql.live._micros`, a row at a time.

    >>> micros(pa.array([1796555945.2706954, 0.0000005, 0.0000015])).cast(pa.int64()).to_pylist()
    [1796555945270695, 0, 2]
    """
    whole = pc.trunc(at)  # at - trunc(at) is exact, as math.modf's fraction
    fraction = pc.round(pc.multiply(pc.subtract(at, whole), 1_000_000.0), 0, round_mode="half_to_even")
    return pc.add(pc.multiply(pc.cast(whole, _LONG), 1_000_000), pc.cast(fraction, _LONG)).cast(_TS)


def milliseconds(seconds: pa.Array) -> pa.Array:
    """Each value rounded to 3 decimals exactly as Python's ``round(x, 3)`` (the decimal
    nearest, half to even): Arrow's kernel, with the values near a tie rounded by Python.

    >>> milliseconds(pa.array([0.0005, 0.0015, 2.6745, 1.0004999])).to_pylist() == [
    ...     round(x, 3) for x in (0.0005, 0.0015, 2.6745, 1.0004999)]
    True
    """
    rounded = pc.round(seconds, 3, round_mode="half_to_even")
    scaled = pc.multiply(seconds, 1000.0)
    near = pc.less_equal(pc.abs(pc.subtract(pc.subtract(scaled, pc.floor(scaled)), 0.5)), _NEAR_TIE)
    if not pc.any(near).as_py():
        return rounded
    exact = [None if x is None else round(x, 3) for x in seconds.filter(near).to_pylist()]
    return pc.replace_with_mask(rounded, near, pa.array(exact, pa.float64()))


def frontier_column(engine: Frontiers, indices: list[int]) -> pa.Array:
    """The ``frontier`` column (``list<list<int64>>``) of the locations at ``indices``, from the
    buffers the engine writes."""
    offsets, time_offsets, coordinates = engine.list_columns(indices)
    values = pa.Array.from_buffers(_LONG, len(coordinates) // 8, [None, pa.py_buffer(coordinates)])
    times = pa.ListArray.from_arrays(
        pa.Array.from_buffers(_INT, len(time_offsets) // 4, [None, pa.py_buffer(time_offsets)]), values)
    return pa.ListArray.from_arrays(pa.Array.from_buffers(_INT, len(indices) + 1, [None, pa.py_buffer(offsets)]), times)


def oldest_columns(oldest: Mapping[Any, Oldest], position: Callable[[Any], int | None], rows: int,
                   now: float, unknown: float | None) -> dict[str, pa.Array]:
    """The ``oldest_*`` columns of ``rows`` locations (``position``: a location's row, or
    ``None`` if it has none), null where a location holds
    no live pointstamp: built per pointstamp-holding location, then spread by Arrow's kernels
    (no Python object per location)."""
    held = sorted((row, location) for location in oldest if (row := position(location)) is not None)
    times = [list(oldest[location][0]) for _, location in held]
    born_at = pa.array([oldest[location][1] for _, location in held], pa.float64())
    workers = pa.array([oldest[location][2] for _, location in held], pa.string())
    # Each row's entry (by rank among the rows that hold one), null for the others.
    numbers = pc.subtract(pc.cumulative_sum(pa.repeat(pa.scalar(1, _INT), rows)), 1)  # 0..rows-1, in Arrow
    take = pc.replace_with_mask(pa.nulls(rows, _INT), pc.is_in(numbers, pa.array([row for row, _ in held], _INT)),
                                pa.array(range(len(held)), _INT))
    age = milliseconds(pc.max_element_wise(pc.subtract(now, born_at), 0.0))
    at_least = (pc.less_equal(born_at, unknown) if unknown is not None
                else pa.repeat(pa.scalar(False), len(held)))
    entries = {"oldest_time": pa.array(times, pa.list_(_LONG)), "oldest_worker": workers,
               "oldest_born_at": micros(born_at), "oldest_age_seconds": age, "oldest_age_at_least": at_least}
    return {name: column.take(take) for name, column in entries.items()}


def lag_columns(engine: Frontiers, stamps: MovedAt | None, indices: list[int],
                fallback: Callable[[], float | list[float]], now: float, unknown: float | None) -> dict[str, pa.Array]:
    """:func:`lag_of` the locations at the engine's ``indices``: a location's last move is its
    stamp, or where it has none (never moved here), what ``fallback()`` gives for it (called
    only then: one instant for all, or one per location)."""
    count = len(indices)
    if stamps is None:
        otherwise = fallback()
        moved: pa.Array = (pa.repeat(pa.scalar(otherwise, pa.float64()), count) if isinstance(otherwise, float)
                           else pa.array(otherwise, pa.float64()))
    else:
        moved = pa.Array.from_buffers(pa.float64(), count, [None, pa.py_buffer(stamps.stamps(indices))])
        never = pc.is_nan(moved)  # NaN: never stamped
        if pc.any(never).as_py():
            otherwise = fallback()
            moved = pc.if_else(never, pa.scalar(otherwise, pa.float64()) if isinstance(otherwise, float)
                               else pa.array(otherwise, pa.float64()), moved)
    return lag_of(frontier_column(engine, indices), moved, now, unknown)


def lag_of(frontier: pa.Array, moved: pa.Array, now: float, unknown: float | None) -> dict[str, pa.Array]:
    """The ``frontier``, ``lag_seconds``, ``lag_at_least`` and ``changed_at`` columns of
    locations with these frontiers, last moved at ``moved`` (POSIX seconds, no nulls).

    ``lag_seconds`` is ``round(max(now - moved, 0), 3)`` where the frontier is not empty (else
    null); ``lag_at_least`` says the move may be older than ``unknown`` (what a restart could
    not tell).

    >>> row = lag_of(pa.array([[[1]], []], pa.list_(pa.list_(pa.int64()))), pa.array([10.0, 10.0]), 12.0005, 11.0)
    >>> row["lag_seconds"].to_pylist(), row["lag_at_least"].to_pylist()
    ([2.001, None], [True, False])
    """
    count = len(moved)
    found = pc.greater(pc.list_value_length(frontier), 0)
    lag = milliseconds(pc.max_element_wise(pc.subtract(now, moved), 0.0))
    at_least = (pc.and_(found, pc.less_equal(moved, unknown)) if unknown is not None
                else pa.repeat(pa.scalar(False), count))
    return {"frontier": frontier, "lag_seconds": pc.if_else(found, lag, pa.nulls(count, pa.float64())),
            "lag_at_least": at_least, "changed_at": micros(moved)}
