"""Antichains of product-ordered tuples, and a counted version that reports frontier changes.

An :class:`Antichain` holds mutually incomparable elements: the lower envelope of a set of
times (a frontier) or of path summaries (``Psi[l1, l2]``). A :class:`MutableAntichain` keeps
signed counts per time and maintains the antichain of minimal times whose count is positive,
reporting exactly how that frontier moves on each update (timely's ``MutableAntichain``).

Guarantees: an :class:`Antichain` holds exactly the minimal elements of everything inserted
into it; :meth:`MutableAntichain.update_iter` returns exactly the net changes of the frontier
(the minimal times with a positive count), whatever the order of the updates and even while
some counts are negative.

>>> frontier = Antichain([(1, 0), (0, 1), (1, 1)])
>>> frontier.elements(), frontier.less_equal((2, 0)), frontier.less_equal((0, 0))
([(0, 1), (1, 0)], True, False)
>>> counts = MutableAntichain()
>>> counts.update_iter([((1, 0), 1), ((0, 1), 1), ((1, 0), -1)])
[((0, 1), 1)]
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Generic, TypeVar

from tracker.timestamp import less_equal

T = TypeVar("T", bound=tuple[int, ...])


class Antichain(Generic[T]):
    """A set of mutually incomparable elements under the product order.

    ``insert`` keeps only minimal elements: an element already dominated (some element ``<=``
    it) is refused, and an inserted element evicts the elements it is ``<=``.

    >>> a = Antichain([(2, 0), (0, 2)])
    >>> a.insert((1, 1)), a.insert((3, 3)), sorted(a)
    (True, False, [(0, 2), (1, 1), (2, 0)])
    >>> a.less_equal((1, 5)), a.less_equal((0, 1))
    (True, False)
    """

    __slots__ = ("_elements",)

    def __init__(self, elements: Iterable[T] = ()) -> None:
        self._elements: list[T] = []
        for element in elements:
            self.insert(element)

    def insert(self, element: T) -> bool:
        """Add ``element`` unless some element is ``<=`` it; returns whether it was added."""
        for existing in self._elements:
            if less_equal(existing, element):
                return False
        self._elements = [e for e in self._elements if not less_equal(element, e)]
        self._elements.append(element)
        return True

    def less_equal(self, time: T) -> bool:
        """True iff some element is ``<= time`` (``time`` is in the upward closure)."""
        return any(less_equal(e, time) for e in self._elements)

    def dominates(self, other: Antichain[T]) -> bool:
        """True iff every element of ``other`` is ``>=`` some element of ``self``."""
        return all(self.less_equal(e) for e in other)

    def elements(self) -> list[T]:
        """The elements, sorted (lexicographically, a linear extension of the order)."""
        return sorted(self._elements)

    def __iter__(self) -> Iterator[T]:
        return iter(self._elements)

    def __len__(self) -> int:
        return len(self._elements)

    def __bool__(self) -> bool:
        return bool(self._elements)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Antichain):
            return set(self._elements) == set(other._elements)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(frozenset(self._elements))

    def __repr__(self) -> str:
        return f"Antichain({self.elements()!r})"


class MutableAntichain(Generic[T]):
    """Signed counts per time, and the frontier: minimal times with a positive count.

    Counts may go negative for a while (a receiver's ``-1`` may arrive before the sender's
    ``+1``); a time with a non-positive count is simply not active. :meth:`update_iter` applies
    a batch and returns exactly the frontier's changes, consolidated, nothing else.

    >>> m = MutableAntichain()
    >>> m.update_iter([((3,), 1), ((5,), 1)])
    [((3,), 1)]
    >>> m.update_iter([((3,), -1)])
    [((3,), -1), ((5,), 1)]
    >>> m.frontier()
    [(5,)]
    """

    __slots__ = ("_counts", "_frontier")

    def __init__(self) -> None:
        self._counts: dict[T, int] = {}
        self._frontier: list[T] = []

    def update_iter(self, updates: Iterable[tuple[T, int]]) -> list[tuple[T, int]]:
        """Apply ``(time, delta)`` updates and return the frontier's net changes ``(time, +1/-1)``."""
        net: dict[T, int] = {}
        for time, delta in updates:
            for changed, diff in self.update(time, delta):
                net[changed] = net.get(changed, 0) + diff
        return [(time, diff) for time, diff in net.items() if diff]

    def update(self, time: T, delta: int) -> list[tuple[T, int]]:
        """Apply one ``(time, delta)`` and return the frontier's changes.

        The tracker's hot path: a time becoming active extends the frontier without looking at
        the other counts (the new frontier is the old one minus what ``time`` dominates, plus
        ``time``); only a frontier element becoming inactive needs the counts rescanned.
        """
        if delta == 0:
            return []
        counts = self._counts
        old = counts.get(time, 0)
        new = old + delta
        if new == 0:
            del counts[time]
        else:
            counts[time] = new
        if (old > 0) == (new > 0):
            return []
        frontier = self._frontier
        if new > 0:
            if len(time) == 1:  # a total order: the frontier has at most one element
                if not frontier:
                    self._frontier = [time]
                    return [(time, 1)]
                least = frontier[0]
                if least[0] <= time[0]:
                    return []
                self._frontier = [time]
                return [(least, -1), (time, 1)]
            if any(less_equal(f, time) for f in frontier):
                return []
            evicted = [f for f in frontier if less_equal(time, f)]
            self._frontier = [f for f in frontier if not less_equal(time, f)]
            self._frontier.append(time)
            changes = [(f, -1) for f in evicted]
            changes.append((time, 1))
            return changes
        if time not in frontier:
            return []
        if not counts:
            self._frontier = []
            return [(time, -1)]
        return self._rebuild()

    def _rebuild(self) -> list[tuple[T, int]]:
        old_frontier = self._frontier
        self._frontier = _minimal(t for t, c in self._counts.items() if c > 0)
        old_set, new_set = set(old_frontier), set(self._frontier)
        changes = [(t, -1) for t in old_frontier if t not in new_set]
        changes.extend((t, 1) for t in self._frontier if t not in old_set)
        return changes

    def frontier(self) -> list[T]:
        """The minimal times with a positive count, sorted."""
        return sorted(self._frontier)

    def less_equal(self, time: T) -> bool:
        """True iff some frontier element is ``<= time``."""
        return any(less_equal(f, time) for f in self._frontier)

    def counts(self) -> dict[T, int]:
        """A copy of every non-zero count."""
        return dict(self._counts)


def _minimal(times: Iterable[T]) -> list[T]:
    """The minimal elements of ``times``; sorting first means no element evicts another."""
    result: list[T] = []
    for time in sorted(times):
        if not any(less_equal(r, time) for r in result):
            result.append(time)
    return result
