"""Publication of one dataflow's frontier: the published frontier, its history, its subscribers.

Guarantees: only durable versions are published, in version order, so nobody ever sees a
version that a crash could take back; every subscriber is offered every published version's
changes exactly once, without the publisher ever waiting for it; the history answers the
frontier as of any retained version and the changes after it. A version's change list is
encoded to JSON once (:func:`changes_json`) and that one string is shared by every subscriber,
the history and the Delta ``frontier_changes`` table (through ``on_published``); a big version
published while nobody subscribed is encoded only if someone reads it (:meth:`Publication.text`).

Long because: the published frontier (the engine's copy or Python sets), its history (three
deques and a dict kept in step) and the encodings all change together in :meth:`Publication.publish`; split,
their invariants would span modules.

>>> from tracker.graph import Edge, Graph, Node
>>> graph = Graph.build(1, [Node(0, 0, 1), Node(1, 1, 0)], [Edge(Location.source(0, 0), Location.target(1, 0))])
>>> here = Location.target(1, 0)
>>> publication = Publication(graph)
>>> publication.reset({here: [(0,)]}, version=0)
>>> publication.publish(1, [FrontierChange(here, (0,), -1), FrontierChange(here, (4,), 1)], notify=False)
>>> publication.frontier_at()[1][here], publication.frontier_at(0)[1][here]
({(4,)}, {(0,)})
>>> publication.changes_since(0)
[(1, '[{"location":{"node":1,"port":0,"kind":"target"},"time":[0],"diff":-1},\
{"location":{"node":1,"port":0,"kind":"target"},"time":[4],"diff":1}]')]
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from api.streams.encoding import Encoding, Selection, changes_json, decoded, encode, engine_document
from api.streams.fanout import FanOut
from tracker.graph import Graph, Location
from tracker.reachability import FrontierChange
from tracker.timestamp import Timestamp

if TYPE_CHECKING:
    from progress_engine import ChangeBatch, Engine, Frontiers

Frontier = dict[Location, set[Timestamp]]
UNFOLDED_CHANGES = 100_000
"""At most this many changes (and 1,024 versions) wait unfolded before the published frontier
is brought up to date."""
_Frontier = Mapping[Location, Iterable[Timestamp]]


class Listener(Protocol):
    """A subscriber to published versions (the streams' bounded queues, :mod:`api.streams.subscribers`)."""

    selection: Selection | None
    """Only these locations' changes (versions without any are not offered), or all."""

    def offer(self, version: int, encoded: str) -> None:
        """Take one version's encoded changes; must never block."""
        ...

    def end(self) -> None:
        """The dataflow was deleted: finish once what was offered before is consumed; must never block."""
        ...


class Publication:
    """The published frontier of one graph, exact as of :attr:`frontier_version`."""

    def __init__(self, graph: Graph, history_limit: int = 100_000,
                 on_published: Callable[[int, str | ChangeBatch, float], None] | None = None,
                 encoding: Encoding | None = None, *,
                 native: Engine | None = None,
                 copy_at: Callable[[int], Frontiers | None] | None = None,
                 moved: Callable[[list[FrontierChange] | ChangeBatch, float], None] | None = None
                 ) -> None:
        """``on_published(version, changes, at)`` is told of every version with changes (encoded
        as the streams send them, or the compiled engine's ``ChangeBatch`` that encodes to that)
        (also during recovery), for the Delta ``frontier_changes`` table; ``encoding`` (a nested
        dataflow's) replaces the flat JSON of locations and change lists; ``native`` is the
        compiled engine whose ``ChangeBatch`` es are published (for selections), and
        ``copy_at(version)`` a copy of its frontiers if it is exactly at ``version`` (nothing
        applied beyond), else ``None``: the published frontier is then that copy, with each
        version's batch folded into it in the engine, and Python sets are built only when it is
        read; ``moved(changes, at)`` is told of every
        version with changes too (the lag bookkeeping, :class:`api.live.ages.Ages`)."""
        self.graph = graph
        self.encoding = encoding
        self.history_limit = history_limit
        self.frontier_version = 0
        """The version the published frontier is exact for (-1: none computed yet)."""
        self.last_change_at = time.time()
        """When a published version last changed some frontier (POSIX seconds; at first, when
        this publication was made): what ``stalled`` is measured from."""
        self.ended = False
        """The dataflow was deleted: :meth:`end` told every subscriber, and nobody subscribes again."""
        self.on_end: set[Callable[[], None]] = set()
        """Called once by :meth:`end` (a WebSocket that only sends closes itself this way)."""
        self.history: deque[tuple[int, int, str | None]] = deque()
        """``(version, number of changes, JSON)``; the JSON is ``None`` for a big version nobody
        subscribed to when it was published: :meth:`text` encodes it when asked."""
        self._batches: dict[int, ChangeBatch] = {}
        """The compiled engine's batch of each version in the history (the collector does not
        track them): a selection resuming re-encodes from it."""
        self.history_floor = 0
        """The oldest version the history can go back to."""
        self.subscribers: set[Listener] = set()
        self.published_changes = 0
        """Changes published so far, in all (a running total)."""
        self.history_totals: deque[int] = deque()
        """:attr:`published_changes` right after each :attr:`history` entry (kept in step with it):
        how many changes a rewind undoes is a subtraction, not a pass over the history."""
        self.history_at: deque[float] = deque()
        """When each :attr:`history` entry's batch was applied (kept in step with it)."""
        self._published: Frontier = {}
        self._unfolded: list[list[FrontierChange] | ChangeBatch] = []
        self._unfolded_changes = 0
        self._on_published = on_published
        self._native = native
        self._copy_at = copy_at
        self._view: Frontiers | None = None
        """The compiled engine's copy of the published frontier (``None``: :attr:`_published` is)."""
        self._view_read: Frontier | None = None
        """:attr:`_view` as Python sets, until the next version is folded in."""
        self._moved = moved
        self._selections: dict[frozenset[Location], Selection] = {}
        self._row_order: list[int] | None = None
        self.fanout = FanOut(lambda: self.subscribers, encode)
        """Hands each published version to the subscribers, a bounded slice per turn of the loop."""

    @property
    def selected_encodings(self) -> int:
        """How many selection encodings publishing made (one per distinct selection per version)."""
        return self.fanout.selected_encodings

    def select(self, locations: Iterable[Location]) -> Selection:
        """The :class:`Selection` of ``locations`` (ports of the graph), shared by every
        subscriber naming the same set."""
        key = frozenset(locations)
        selection = self._selections.get(key)
        if selection is None:
            native = None
            if self._native is not None:
                native = self._native.selection(sorted(map(self._native.index, key)))
            selection = self._selections[key] = Selection(key, native)
        return selection

    def history_changes(self) -> int:
        """How many changes the retained history holds (from :attr:`history_totals`)."""
        if not self.history:
            return 0
        return self.history_totals[-1] - self.history_totals[0] + self.history[0][1]

    @property
    def published(self) -> Frontier:
        """The frontier as of :attr:`frontier_version`: location -> set of times (not to be
        modified)."""
        if self._view is not None:
            if self._view_read is None:
                self._view_read = self._view.to_dict()
            return self._view_read
        self._fold()
        return self._published

    def reset(self, frontier: _Frontier | Callable[[], _Frontier], version: int, *, floor: int | None = None) -> None:
        """Publish ``frontier`` as exact for ``version`` (after registration or recovery);
        ``floor`` raises the oldest version the history answers for. ``frontier`` may be a
        callable, called only if the compiled engine has no copy at ``version`` (a dict of
        100,000 locations' frontiers is ~30 ms of the GIL in a few calls)."""
        self._view = self._copy_at(version) if self._copy_at is not None else None
        if self._view is None:
            self._published = {loc: set(ts) for loc, ts in (frontier() if callable(frontier) else frontier).items()}
        else:
            self._published = {}
        self._unfolded, self._unfolded_changes = [], 0
        self._view_read = None
        self.frontier_version = version
        if floor is not None:
            self.history_floor = max(self.history_floor, floor)

    def record_initial(self, at: float) -> None:
        """Tell ``on_published`` of version 0's changes, read from the frontier published as
        exact for version 0 (call it right after :meth:`reset` there): every element entered
        (+1), so that replaying ``frontier_changes`` from version 0 gives the frontiers. The
        streams' history does not get them: a subscriber's snapshot already holds them."""
        if self._on_published is None or self.frontier_version != 0:
            return
        changes = [FrontierChange(loc, t, 1) for loc, times in sorted(self.published.items()) for t in sorted(times)]
        if changes:
            encoded = changes_json(changes) if self.encoding is None else self.encoding.changes_json(changes)
            self._on_published(0, encoded, at)

    def publish(self, version: int, changes: list[FrontierChange] | ChangeBatch, *, notify: bool = True,
                at: float | None = None, prepared: tuple[str | None, Frontiers] | None = None) -> None:
        """Publish a durable version's changes: frontier, history, subscribers (if ``notify``;
        not while replaying a recovered log, when there is no event loop); ``at`` (default now)
        is when the batch was applied, as ``frontier_changes`` will say. ``prepared`` is the
        changes' :func:`encode` (``None``: not made, as nobody subscribed) and the compiled
        engine's frontiers copied right after they were applied, made off the event loop for a
        big batch (in its dataflow's lane): the copy replaces the published one instead of the
        batch being folded into it."""
        self.frontier_version = version
        if not changes:
            return
        self.last_change_at = time.time() if at is None else at
        stamp = self.last_change_at
        if self._moved is not None:
            self._moved(changes, stamp)
        folded = False
        if prepared is not None:
            # The engine's frontiers right after this version: nothing to fold, nor anything
            # left unfolded to keep.
            self._view, self._view_read = prepared[1], None
            self._published, self._unfolded, self._unfolded_changes = {}, [], 0
            folded = True
        elif self._view is not None and not isinstance(changes, list):
            # Before the encoding: a big version's text may still be in the making by a thread
            # of the engine (``ChangeBatch.prepare_json``), which this gives time to finish.
            self._view.fold(changes)  # in the engine: ~10 ns a change
            self._view_read = None
            folded = True
        # One string per version rather than a tuple per change keeps the garbage collector's
        # full passes (and so the latency tail) short even with a long history.
        encoding = self.encoding
        encoded: str | None
        if prepared is not None:
            encoded = prepared[0]
            if encoded is None and notify and (self.subscribers or self.fanout.busy):  # subscribed meanwhile
                encoded = encode(changes)
        elif encoding is None:
            encoded = encode(changes)
        else:
            assert isinstance(changes, list)  # a nested dataflow's engine returns change lists
            encoded = encoding.changes_json(changes)
        history = self.history
        history.append((version, len(changes), encoded))
        self.published_changes += len(changes)
        self.history_totals.append(self.published_changes)
        self.history_at.append(stamp)
        if not isinstance(changes, list):
            self._batches[version] = changes
        while len(history) > 1 and (
            len(history) > self.history_limit or self.history_changes() > 10 * self.history_limit
        ):
            old_version, _, _ = history.popleft()
            self.history_totals.popleft()
            self.history_at.popleft()
            self._batches.pop(old_version, None)
            self.history_floor = old_version
        if self._on_published is not None:
            # The streams' JSON names each location's scope, as frontier_changes' rows do; the
            # compiled engine's batch becomes those rows without a JSON round trip (api.delta.columns).
            payload = encoded if isinstance(changes, list) else changes
            assert payload is not None  # a change list is always encoded
            self._on_published(version, payload, stamp)
        if folded:
            if notify and encoded is not None:
                self.fanout.push(version, changes, encoded)
            return
        assert encoded is not None  # only a prepared version goes without
        self._unfolded.append(changes)
        self._unfolded_changes += len(changes)
        if notify:
            self.fanout.push(version, changes, encoded)
            if isinstance(changes, list):
                if len(self._unfolded) == 1:  # scheduled after the subscribers' wake-ups, so after their sends
                    asyncio.get_running_loop().call_soon(self._fold)
            elif len(self._unfolded) == 1024 or self._unfolded_changes >= UNFOLDED_CHANGES:
                # Without a copy in the engine (see ``copy_at``) its batches are cheap to keep
                # (fold when read), but not without bound: 1,024 batches of an 8,000-operator
                # chain held 600 MB.
                asyncio.get_running_loop().call_soon(self._fold)
        elif len(self._unfolded) >= 256:  # replaying a recovered history: no loop to schedule on
            self._fold()

    def end(self) -> None:
        """The dataflow was deleted: every subscriber is told to finish (after the versions it was
        offered) and is dropped; :attr:`ended` refuses new ones."""
        self.ended = True
        subscribers, self.subscribers = list(self.subscribers), set()
        for subscriber in subscribers:
            subscriber.end()
        for callback in list(self.on_end):
            callback()

    def _fold(self) -> None:
        """Fold published versions' changes into the frontier.

        Publishing only queues a version's changes and schedules this for right after the
        subscribers' sends (the event loop's next turn), which keeps ~2 set operations per
        change off the latency path without keeping change lists alive: thousands of them made
        the collector's full passes take tens of milliseconds.
        """
        if not self._unfolded:
            return
        published = self._published
        for batch in self._unfolded:
            changes = batch if isinstance(batch, list) else batch.to_list(labels=True)
            for location, when, diff in changes:
                times = published.get(location)
                if times is None:
                    times = published[location] = set()
                if diff > 0:
                    times.add(when)
                else:
                    times.discard(when)
        self._unfolded, self._unfolded_changes = [], 0

    def frontier_at(self, version: int | None = None) -> tuple[int, Frontier]:
        """The published frontier, or as of an earlier ``version`` by undoing the history.

        Raises:
            LookupError: ``version`` is older than the retained history or newer than the
                published version.
        """
        current = self.frontier_version
        if version is None or version == current:
            return current, self.published
        if version > current:
            raise LookupError(f"version {version} has not happened yet (current version is {current})")
        if version < self.history_floor:
            raise LookupError(f"version {version} is older than the retained history (oldest: {self.history_floor})")
        view = {loc: set(ts) for loc, ts in self.published.items()}
        for changed_version, _, encoded in reversed(self.history):
            if changed_version <= version:
                break
            for change in json.loads(self.text(changed_version, encoded)):
                location = self.location(change["location"])
                if change["diff"] > 0:
                    view.setdefault(location, set()).discard(tuple(change["time"]))
                else:
                    view.setdefault(location, set()).add(tuple(change["time"]))
        return version, view

    def location(self, raw: Mapping[str, Any]) -> Location:
        """The location of a JSON location as this publication's changes write it (a nested
        dataflow's stand-in)."""
        if self.encoding is None:
            return Location(raw["node"], raw["port"], raw["kind"])
        return self.encoding.location(raw)

    def text(self, version: int, encoded: str | None) -> str:
        """A :attr:`history` entry's change list as JSON: ``encoded``, or if that is ``None``,
        encoded now from the compiled engine's batch (without the GIL)."""
        return encoded if encoded is not None else encode(self._batches[version])

    def changes_since(self, version: int, selection: Selection | None = None) -> list[tuple[int, str]] | None:
        """Encoded changes after ``version`` up to the published version (at ``selection``'s
        locations, skipping versions without any), or ``None`` if the history no longer reaches
        back that far (or ``version`` is in the future)."""
        found = self.stamped_changes_since(version, selection)
        return None if found is None else [(v, text) for v, _, text in found]

    def stamped_changes_since(self, version: int, selection: Selection | None = None
                              ) -> list[tuple[int, float, str]] | None:
        """:meth:`changes_since` with when each version was applied: ``(version, at, encoded)``."""
        if version < self.history_floor or version > self.frontier_version:
            return None
        out = []
        for (v, _, encoded), at in zip(self.history, self.history_at, strict=True):
            if v <= version:
                continue
            if selection is not None:
                batch = self._batches.get(v)
                encoded = encode(batch if batch is not None else decoded(self.text(v, encoded)), selection)
                if encoded == "[]":
                    continue
            out.append((v, at, self.text(v, encoded)))
        return out

    def snapshot_json(self, selection: Selection | None = None) -> tuple[int, str]:
        """``(version, '{"version":..,"locations":[..]}')`` of the published frontier (at
        ``selection``'s locations only, if given)."""
        if self._view is not None and selection is not None and selection.rows is None:
            selection.rows = self.row_indices(selection.locations.__contains__)
        where = None if selection is None else selection.locations.__contains__
        return self.frontier_version, self.frontier_json(where, None if selection is None else selection.rows)

    def frontier_json(self, where: Callable[[Location], bool] | None = None, indices: list[int] | None = None) -> str:
        """``{"version":..,"locations":[..]}`` (compact JSON) of the published frontier, at the
        locations matching ``where`` (or, given, at these :meth:`row_indices`); built by the
        compiled engine from its copy when it keeps one (~100x faster than in Python)."""
        if self._view is None:
            return json.dumps({"version": self.frontier_version,
                               "locations": self.frontier_rows(self.published, where)}, separators=(",", ":"))
        if indices is None:
            indices = self.row_indices(where)
        return "".join(engine_document(self.frontier_version, self._view, indices))

    def frontier_writer(self) -> Callable[[list[int]], list[bytes]]:
        """A writer of :meth:`frontier_json` at given :meth:`row_indices`, as chunks, from a
        copy of the published frontier taken now (safe in a worker thread; only when
        :attr:`engine_rows`)."""
        assert self._view is not None
        version, copy = self.frontier_version, self._view.copy()
        return lambda indices: [chunk.encode() for chunk in engine_document(version, copy, indices)]

    def engine_copy(self) -> Frontiers | None:
        """A copy of the published frontier in the compiled engine (``None`` without one): its
        columns are read without a Python object per time (``Frontiers.list_columns``)."""
        return None if self._view is None else self._view.copy()

    def frontier_of(self, location: Location) -> tuple[int, list[Timestamp]]:
        """The published frontier's version and ``location``'s sorted frontier in it."""
        if self._view is None:
            return self.frontier_version, sorted(self.published.get(location, ()))
        assert self._native is not None  # an engine copy comes from the compiled engine
        return self.frontier_version, self._view.frontier(self._native.index(location))

    def frontier_reader(self) -> tuple[int, Callable[[Location], list[Timestamp]]]:
        """The published frontier's version and a reader of each location's sorted frontier
        as of that version, unaffected by later versions: safe to call from a worker thread.
        O(locations) here, in the engine when it keeps a copy (a few ms for 100,000)."""
        if self._view is None:
            copied = {loc: sorted(times) for loc, times in self.published.items()}
            return self.frontier_version, lambda loc: copied.get(loc, [])
        assert self._native is not None  # an engine copy comes from the compiled engine
        copy, index = self._view.copy(), self._native.index
        return self.frontier_version, lambda loc: copy.frontier(index(loc))

    @property
    def engine_rows(self) -> bool:
        """Whether :meth:`frontier_json` takes :meth:`row_indices` (the compiled engine keeps a copy)."""
        return self._view is not None

    def row_indices(self, where: Callable[[Location], bool] | None = None) -> list[int]:
        """The compiled engine's index of every location (matching ``where``), in answer
        order (``graph.locations()``; only with the compiled engine). Reads only the graph and
        the engine's label index: safe in a worker thread."""
        order = self._row_order
        if order is None:
            assert self._native is not None
            order = self._row_order = list(map(self._native.index, self.graph.locations()))
        if where is None:
            return order
        return [i for loc, i in zip(self.graph.locations(), order, strict=True) if where(loc)]

    def frontier_rows(self, view: Frontier, where: Callable[[Location], bool] | None = None
                      ) -> list[dict[str, Any]]:
        """Every location of the graph (matching ``where``) with its sorted frontier in ``view``."""
        if self.encoding is not None:
            encoding = self.encoding
            return [{"location": encoding.location_json(loc), "frontier": [list(t) for t in sorted(view.get(loc, ()))]}
                    for loc in encoding.locations if where is None or where(loc)]
        return [
            {"location": {"node": loc.node, "port": loc.port, "kind": loc.kind},
             "frontier": [list(t) for t in sorted(view.get(loc, ()))]}
            for loc in self.graph.locations()
            if where is None or where(loc)
        ]
