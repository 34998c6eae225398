"""Timestamps and path summaries: product-ordered tuples of non-negative integers.

A dataflow of arity ``k`` stamps every record with a ``k``-tuple (``(epoch,)`` or
``(epoch, iteration)``); tuples are compared by the product order, as timely's ``Product``.
A :class:`PathSummary` is a ``k``-tuple of increments that a path adds to every time crossing it.

Both are plain tuples underneath, so they hash, compare for equality and serialise to JSON
lists for free; the product order is given by :func:`less_equal` (one function for both,
since summaries are ordered the same way). :func:`check_time` is the one gate through which
user input becomes a :data:`Timestamp`: whatever it accepts has the dataflow's arity and
coordinates in ``0..MAX_TIME``. The semantics are restated in ``docs/core.md``.

>>> less_equal((1, 2), (1, 3)), less_equal((1, 2), (0, 5))
(True, False)
>>> PathSummary((0, 1)).results_in((3, 4))
(3, 5)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeAlias

Timestamp: TypeAlias = tuple[int, ...]
"""A logical time: a tuple of ``arity`` non-negative integers."""

MAX_INCREMENT = 2**31 - 1
"""The largest coordinate of a connection's summary."""
MAX_TIME = 2**62 - 1
"""The largest coordinate of a reported time. Times are stored as 64-bit integers, and a time
plus any minimal path summary (at most 100,000 transitions of :data:`MAX_INCREMENT`, under
2**48) must still fit, in the native tracker and in Spark alike."""


def less_equal(a: Sequence[int], b: Sequence[int]) -> bool:
    """The product order: ``a <= b`` in every coordinate. Works on times and summaries.

    >>> less_equal((1, 1), (1, 2)), less_equal((2, 0), (1, 2))
    (True, False)
    """
    if len(a) == 1:
        return a[0] <= b[0]
    return all(x <= y for x, y in zip(a, b, strict=True))


def less_than(a: Sequence[int], b: Sequence[int]) -> bool:
    """Strictly less in the product order: ``a <= b`` and ``a != b``.

    >>> less_than((1, 2), (1, 2)), less_than((1, 2), (1, 3))
    (False, True)
    """
    return a != b and less_equal(a, b)


def minimum(arity: int) -> Timestamp:
    """The least time of the given arity, the time of initial capabilities.

    >>> minimum(2)
    (0, 0)
    """
    return (0,) * arity


def check_time(value: object, arity: int, what: str = "time", limit: int = MAX_TIME) -> Timestamp:
    """Return ``value`` as a :data:`Timestamp` of ``arity``, or raise ``ValueError`` saying why.

    Accepts any sequence of ints (JSON lists arrive as lists); rejects bools, negatives,
    coordinates above ``limit`` and a wrong length, because a malformed time would silently
    corrupt the product order (or, too large, fail to fit the tables after being acknowledged).

    Args:
        value: the candidate time (a list or tuple).
        arity: the number of coordinates required.
        what: how the message names the value (``"time"``, ``"summary"``).
        limit: the largest coordinate allowed.

    Raises:
        ValueError: not a list or tuple, wrong length, a coordinate that is not a
            non-negative ``int`` (``bool`` included) or is above ``limit``.

    >>> check_time([2, 7], 2)
    (2, 7)
    >>> check_time([2, -1], 2)
    Traceback (most recent call last):
    ...
    ValueError: time [2, -1] must hold non-negative integers only
    """
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"{what} must be a list of {arity} non-negative integers, got {value!r}")
    if len(value) != arity:
        raise ValueError(
            f"{what} {list(value)!r} has {len(value)} coordinates, the dataflow's arity is {arity}"
        )
    for x in value:
        if isinstance(x, bool) or not isinstance(x, int) or x < 0:
            raise ValueError(f"{what} {list(value)!r} must hold non-negative integers only")
        if x > limit:
            raise ValueError(f"{what} {list(value)!r}: coordinates are at most {limit}")
    return tuple(value)


class PathSummary(tuple[int, ...]):
    """Increments a path adds to a time: ``results_in(t) = t + s`` coordinate-wise.

    Summaries compose with :meth:`followed_by` (addition) and are ordered by the product order.
    ``results_in`` and ``followed_by`` may answer ``None`` ("no time"), so that bounded loops can
    later be expressed; with plain increments they never do.

    >>> s = PathSummary((0, 1))
    >>> s.results_in((5, 2)), s.followed_by(PathSummary((1, 0)))
    ((5, 3), (1, 1))
    >>> PathSummary.zero(2).is_zero()
    True
    """

    __slots__ = ()

    @classmethod
    def zero(cls, arity: int) -> PathSummary:
        """The summary of an edge or a plain operator: changes nothing."""
        return cls((0,) * arity)

    def results_in(self, time: Timestamp) -> Timestamp | None:
        """The time a record at ``time`` carries after the path, or ``None`` if it cannot."""
        if len(self) == 1:
            return (time[0] + self[0],)
        return tuple(t + s for t, s in zip(time, self, strict=True))

    def followed_by(self, other: PathSummary) -> PathSummary | None:
        """The summary of this path followed by ``other``, or ``None`` if nothing gets through."""
        return PathSummary(a + b for a, b in zip(self, other, strict=True))

    def less_equal(self, other: Sequence[int]) -> bool:
        """``self <= other`` in the product order."""
        return less_equal(self, other)

    def is_zero(self) -> bool:
        """True for the summary that advances no coordinate (an edge, a plain operator)."""
        return not any(self)
