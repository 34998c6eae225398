"""The frontier as of a past version (``GET .../frontier?version=N``), rewound in slices.

Guarantees: the answer is exact for ``N`` (the published frontier, copied at one instant, with
the retained history's changes after ``N`` undone, newest first); it raises
:class:`LookupError` for a version in the future, and :class:`TooFarBack` for one older than
the retained history or when more than :data:`REWIND_CHANGES` changes would have to be undone
(the route answers 410 ``version_too_old`` naming the oldest version it can answer); no slice of the
rewind holds the event loop for more than :data:`SLICE_CHANGES` changes (or about
:data:`SLICE_SECONDS`), one slice runs at a time whatever the number of rewinds under way, and
each is followed by a rest as long, so queries reaching far back stall nobody else's
acknowledgements, and the total work of each is bounded.

Why on the loop, in slices, rather than in a thread: the undo is Python over each version's
decoded changes, which holds the GIL anyway; a thread contending for it at the
service's 0.1 ms switch interval slowed every request, while a slice between two turns of the
loop costs the other connections at most one slice (~1-2 ms). The history is copied (one list
of references) before the first slice, so publishing may go on meanwhile.

>>> import asyncio
>>> from tracker.graph import Edge, Graph, Node
>>> from tracker.reachability import FrontierChange
>>> graph = Graph.build(1, [Node(0, 0, 1), Node(1, 1, 0)], [Edge(Location.source(0, 0), Location.target(1, 0))])
>>> here = Location.target(1, 0)
>>> publication = Publication(graph)
>>> publication.reset({here: [(0,)]}, version=0)
>>> for version in range(1, 4):
...     publication.publish(version, [FrontierChange(here, (version - 1,), -1), FrontierChange(here, (version,), 1)],
...                         notify=False)
>>> [asyncio.run(frontier_as_of(publication, v))[1][here] for v in (0, 2, 3)]
[{(0,)}, {(2,)}, {(3,)}]
>>> _oldest([(1, 150_000, ""), (2, 50_000, ""), (3, 100_000, ""), (5, 100_000, "")],
...         [150_000, 200_000, 300_000, 400_000], floor=0)  # undo 3 and 5
2
"""

from __future__ import annotations

import asyncio
import bisect
import time
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from api.streams.publish import Frontier, Publication
from tracker.graph import Location

SLICE_CHANGES = 500
"""At most this many changes undone per turn of the event loop..."""
SLICE_SECONDS = 0.001
"""...and for at most about this long (a slice ends after the version that crosses it)."""
REWIND_CHANGES = 200_000
"""The most changes one query undoes (~1 s of slices on a quiet machine): further back is 410."""


class TooFarBack(LookupError):
    """``version`` is in the past but cannot be answered now: older than the retained history,
    or more than :data:`REWIND_CHANGES` changes back; ``oldest`` is the oldest version that can."""

    def __init__(self, version: int, oldest: int, why: str) -> None:
        super().__init__(f"version {version} is {why}; the oldest version answered now is {oldest} "
                         "(older states: the Delta frontier_changes table)")
        self.oldest = oldest


async def frontier_as_of(publication: Publication, version: int) -> tuple[int, Frontier]:
    """``(version, frontier)``: the published frontier as of ``version``.

    Raises:
        TooFarBack: ``version`` is older than the retained history, or too many changes back.
        LookupError: ``version`` is newer than the published version.
    """
    current = publication.frontier_version
    if version == current:
        return publication.frontier_at()
    if version > current:
        raise LookupError(f"version {version} has not happened yet (current version is {current})")
    oldest = _oldest(publication.history, publication.history_totals, publication.history_floor)
    if version < publication.history_floor:
        raise TooFarBack(version, oldest, "older than the retained history")
    if version < oldest:
        raise TooFarBack(version, oldest, f"more than {REWIND_CHANGES} frontier changes back")
    # One instant: the frontier and the history it is exact with.
    entries = list(publication.history)
    first = bisect.bisect_right(entries, version, key=lambda entry: entry[0])
    view = {loc: set(ts) for loc, ts in publication.published.items()}
    location_of = _locator(publication)
    index = len(entries) - 1
    while index >= first:
        async with _turn():  # one slice at a time, whoever asks: rewinds share half the loop
            work, began = 0, time.perf_counter()
            while index >= first and work < SLICE_CHANGES and time.perf_counter() - began < SLICE_SECONDS:
                changed, count, encoded = entries[index]
                entries[index] = (0, 0, "")  # let go of what is undone
                for change in _DECODE(publication.text(changed, encoded)):
                    location = location_of(change.location)
                    times = view.get(location)
                    if times is None:
                        times = view[location] = set()
                    if change.diff > 0:
                        times.discard(change.time)
                    else:
                        times.add(change.time)
                work += count
                index -= 1
            # Rest as long as the slice took, still holding the turn: at most half of the
            # loop's time goes to rewinds however many run at once, and the turns that serve
            # others' acknowledgements mostly run without one.
            await asyncio.sleep(min(time.perf_counter() - began, 0.005))
    return version, view


_TURNS: dict[asyncio.AbstractEventLoop, asyncio.Lock] = {}


def _turn() -> asyncio.Lock:
    """The rewinds' one turn on the running loop (waiters served in arrival order)."""
    loop = asyncio.get_running_loop()
    lock = _TURNS.get(loop)
    if lock is None:
        _TURNS.clear()  # a previous loop's (tests run several) is dead
        lock = _TURNS[loop] = asyncio.Lock()
    return lock


def _oldest(history: Sequence[tuple[int, int, str | None]], totals: Sequence[int], floor: int) -> int:
    """The oldest version whose rewind undoes at most :data:`REWIND_CHANGES` changes:
    ``totals[i]`` is the running total of changes right after ``history[i]``, so the undo back to
    ``history[i]``'s version is ``totals[-1] - totals[i]``, found by bisection (a few index
    operations, whatever the history's length)."""
    if not totals or totals[-1] - (totals[0] - history[0][1]) <= REWIND_CHANGES:
        return floor  # the whole history can be undone
    # The first entry whose version is close enough: everything after it is undone.
    index = bisect.bisect_left(totals, totals[-1] - REWIND_CHANGES)
    return history[index][0]


class _Where(msgspec.Struct, frozen=True, gc=False):
    """A change's location as encoded (frozen: hashable, so it keys the decoded locations).
    Untracked by the garbage collector, like :class:`_Change` (no cycles through them): a far
    rewind decodes 200,000 changes, which otherwise set off collections that stall the loop."""

    node: int
    port: int
    kind: str
    scope: tuple[int, ...] | None = None


class _Change(msgspec.Struct, gc=False):
    location: _Where
    time: tuple[int, ...]
    diff: int


_DECODE = msgspec.json.Decoder(list[_Change]).decode
"""A version's change list: typed structs decoded in C, ~3x faster than ``json.loads`` to dicts."""


def _locator(publication: Publication) -> Callable[[_Where], Location]:
    """A change's encoded location -> the location it names, decoded once per distinct location."""
    encoding = publication.encoding
    places: dict[_Where, Location] = {}

    def location_of(where: _Where) -> Location:
        found = places.get(where)
        if found is None:
            if encoding is None:
                found = Location(where.node, where.port, where.kind)  # type: ignore[arg-type]
            else:
                raw: dict[str, Any] = {"node": where.node, "port": where.port, "kind": where.kind}
                if where.scope is not None:
                    raw["scope"] = list(where.scope)
                found = encoding.location(raw)
            places[where] = found
        return found

    return location_of
