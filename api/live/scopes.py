"""Nested scopes in the service: one nested dataflow's locations, their JSON, and its engine.

The service keeps every dataflow's state keyed by flat :class:`~tracker.graph.Location` s, so
that live state, publication, history, the log and the Delta sync need no second code path. A
nested dataflow's locations get flat stand-ins (:class:`Hosting`): a location of the root scope
is itself, a location ``(scope, node, port, kind)`` of a nested scope is ``(v, port, kind)``
with a negative *virtual node id* ``v = -1, -2, ...`` numbering the ``(scope, node)`` pairs of
all nested scopes in sorted order (deterministic from the registration, so the same after a
restart, and never a real node id). Only the edges of the service translate:

* parsing a progress body (:meth:`Hosting.parse`: the scoped JSON location, the time's arity
  for its scope, locations that hold no pointstamps refused as the core refuses them);
* JSON out (:meth:`Hosting.location_json`, :meth:`Hosting.changes_json`: ``scope`` only when
  not the root, so a nested dataflow's root locations look like a flat dataflow's);
* the engine (:class:`NestedEngine`: a :class:`~tracker.engine.FrontierEngine` over the flat
  stand-ins, running a :class:`~tracker.engine.ScopedEngine`, one flat engine per scope).

The stand-ins never reach the Delta tables: every row names its real location, ``scope,
node, port, kind`` (``frontier_changes`` takes the streams' JSON, which says ``scope``;
``progress``, ``pointstamps`` and ``frontiers`` rows are mapped with :meth:`Hosting.scoped`),
and recovery maps the rows back with :meth:`Hosting.flat`.

>>> from tracker.scope import NestedGraph
>>> body = {"nodes": [
...     {"id": 0, "inputs": 0, "outputs": 1},
...     {"id": 1, "inputs": 1, "outputs": 1, "scope": {"kind": "iterative",
...         "nodes": [{"id": 1, "inputs": 1, "outputs": 1}],
...         "edges": [{"source": {"node": 0, "port": 0}, "target": {"node": 1, "port": 0}},
...                   {"source": {"node": 1, "port": 0}, "target": {"node": 0, "port": 0}}]}},
...     {"id": 2, "inputs": 1, "outputs": 0}],
...   "edges": [{"source": {"node": 0, "port": 0}, "target": {"node": 1, "port": 0}},
...             {"source": {"node": 1, "port": 0}, "target": {"node": 2, "port": 0}}]}
>>> hosting = Hosting(NestedGraph.from_json(1, body))
>>> inside = hosting.flat(ScopedLocation((1,), 1, 0, "source"))
>>> inside, hosting.location_json(inside)
(Location(node=-2, port=0, kind='source'), {'scope': [1], 'node': 1, 'port': 0, 'kind': 'source'})
>>> worker, seq, updates = hosting.parse(b'{"worker": "w", "seq": 0, "updates": [{"location": '
...     b'{"scope": [1], "node": 1, "port": 0, "kind": "source"}, "time": [5, 3], "delta": 1}]}')
>>> updates
[(Location(node=-2, port=0, kind='source'), (5, 3), 1)]
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Mapping
from typing import Any, NoReturn

import msgspec

from api.schema.parsing import BATCH_DECODER as _DECODER
from api.schema.parsing import InvalidRequest, MalformedJSON
from api.schema.parsing import WireLocation as _Location
from api.schema.parsing import WireUpdate as _Update
from tracker.engine import ScopedEngine
from tracker.graph import Graph, GraphError, Location, Update
from tracker.reachability import FrontierChange
from tracker.scope import NestedGraph, ScopedLocation, ScopePath
from tracker.scoped_paths import Step, flattened_steps
from tracker.timestamp import MAX_TIME, Timestamp


class Hosting:
    """A nested dataflow as the service hosts it: its :class:`~tracker.scope.NestedGraph` and
    the flat stand-ins of its locations (see the module docstring)."""

    def __init__(self, nested: NestedGraph) -> None:
        self.nested = nested
        pairs = sorted({(path, node.id) for path, scope in nested.scopes.items() if path
                        for node in scope.graph.nodes})
        virtual = {pair: -(index + 1) for index, pair in enumerate(pairs)}
        self._flat: dict[ScopedLocation, Location] = {}
        self._scoped: dict[Location, ScopedLocation] = {}
        self._json: dict[Location, dict[str, Any]] = {}
        self._prefix: dict[Location, str] = {}
        self._arity: dict[Location, int] = {}
        self._holders: dict[_Location, Location] = {}
        self.locations: list[Location] = []
        """Every location's stand-in, scope by scope (root first), as :meth:`NestedGraph.locations`."""
        for loc in nested.locations():
            node = loc.node if not loc.scope else virtual[(loc.scope, loc.node)]
            flat = Location(node, loc.port, loc.kind)
            self._flat[loc] = flat
            self._scoped[flat] = loc
            self.locations.append(flat)
            body: dict[str, Any] = {"node": loc.node, "port": loc.port, "kind": loc.kind}
            if loc.scope:
                body = {"scope": list(loc.scope), **body}
            self._json[flat] = body
            self._prefix[flat] = '{"location":' + json.dumps(body, separators=(",", ":")) + ',"time":['
            self._arity[flat] = nested.arity_of(loc.scope)
            if nested.holds_pointstamps(loc):
                self._holders[_Location(loc.node, loc.port, loc.kind, loc.scope)] = flat

    @functools.cached_property
    def steps(self) -> dict[ScopedLocation, list[Step]]:
        """The flattened graph's steps (for ``explain``), built on first use."""
        return flattened_steps(self.nested)

    def scope_of(self, text: str | None) -> ScopePath | None:
        """A ``?scope=3,1`` query value as a path of this dataflow (``""``: the root; ``None``:
        not given).

        Raises:
            LookupError: not comma-separated integers, or no such scope.
        """
        return parse_scope(text, self.nested.scopes)

    def matches(self, location: Location, scope: ScopePath | None, node: int | None, port: int | None,
                kind: str | None) -> bool:
        """True iff the stand-in's scoped location passes the filters (``None``: any)."""
        loc = self._scoped[location]
        return ((scope is None or loc.scope == scope) and (node is None or loc.node == node)
                and (port is None or loc.port == port) and (kind is None or loc.kind == kind))

    @property
    def root(self) -> Graph:
        """The root scope's graph (scope nodes carry their computed summaries as connections)."""
        return self.nested.root.graph

    def flat(self, location: ScopedLocation) -> Location:
        """The stand-in of a scoped location (``KeyError`` if it is none of this dataflow's)."""
        return self._flat[location]

    def scoped(self, location: Location) -> ScopedLocation:
        """The scoped location a stand-in stands for (``KeyError`` if none)."""
        return self._scoped[location]

    def location_json(self, location: Location) -> dict[str, Any]:
        """A stand-in as the service's JSON location (``scope`` only when not the root)."""
        return self._json[location]

    def location(self, raw: Mapping[str, Any]) -> Location:
        """The stand-in of a JSON location this service wrote (``scope`` absent: the root)."""
        return self._flat[ScopedLocation(tuple(raw.get("scope") or ()), raw["node"], raw["port"], raw["kind"])]

    def changes_json(self, changes: Iterable[FrontierChange]) -> str:
        """A change list as the streams send it (scoped locations; times of mixed arities)."""
        prefix = self._prefix
        return "[" + ",".join([f'{prefix[loc]}{",".join(map(str, when))}],"diff":{diff}}}'
                               for loc, when, diff in changes]) + "]"

    def scoped_counts(self, counts: Mapping[tuple[Location, Timestamp], int]
                      ) -> dict[tuple[ScopedLocation, Timestamp], int]:
        """Occurrence counts on the stand-ins as counts on the real (scoped) locations."""
        scoped = self._scoped
        return {(scoped[loc], t): c for (loc, t), c in counts.items()}

    def scoped_frontiers(self, frontiers: Mapping[Location, Iterable[Timestamp]]
                         ) -> dict[ScopedLocation, Iterable[Timestamp]]:
        """Frontiers on the stand-ins as frontiers of the real (scoped) locations."""
        scoped = self._scoped
        return {scoped[loc]: times for loc, times in frontiers.items()}

    def parse(self, data: bytes | str) -> tuple[str, int, list[Update]]:
        """``(worker, seq, updates)`` of a progress body, validated against the nested dataflow
        (the errors of :func:`api.schema.parsing.parse_progress`, and the core's for scopes), with the
        updates on the stand-ins."""
        try:
            batch = _DECODER.decode(data)
        except msgspec.ValidationError as error:
            raise InvalidRequest("body", str(error)) from None
        except msgspec.DecodeError as error:
            raise MalformedJSON(str(error)) from None
        except UnicodeDecodeError as error:
            raise MalformedJSON(f"the body is not valid UTF-8 (byte {error.start})") from None
        known, arity_of = self._holders.get, self._arity
        result: list[Update] = []
        for index, update in enumerate(batch.updates):
            location = known(update.location)
            if location is None:
                self._refuse(index, update)
            time = update.time
            arity = arity_of[location]
            if len(time) != arity:
                where = self._scoped[location].scope
                raise GraphError(f"update {index}: time {list(time)} has {len(time)} coordinates, the arity of "
                                 f"{f'scope {list(where)}' if where else 'the root scope'} is {arity}")
            if min(time) < 0 or max(time) > MAX_TIME:
                raise GraphError(f"update {index}: time {list(time)} must hold integers from 0 to {MAX_TIME}")
            result.append((location, time, update.delta))
        return batch.worker, batch.seq, result

    def _refuse(self, index: int, update: _Update) -> NoReturn:
        loc = update.location
        if loc.node < 0 or loc.port < 0 or min(loc.scope, default=0) < 0:
            raise InvalidRequest(f"body.updates.{index}.location", "scope, node and port must be non-negative integers")
        try:  # the core names what is wrong: unknown scope or port, a boundary, a scope node's output
            self.nested.check_updates([(ScopedLocation(loc.scope, loc.node, loc.port, loc.kind), update.time, 0)])
        except GraphError as error:
            raise GraphError(f"update {index}: {str(error).removeprefix('update 0: ')}") from None
        raise GraphError(f"update {index}: unknown location {ScopedLocation(loc.scope, loc.node, loc.port, loc.kind)}")

    def scopes_json(self) -> list[dict[str, Any]]:
        """``GET .../scopes``: every nested scope (sorted by path) with its kind, arity and
        summaries as an operator in the parent's time."""
        rows = []
        for path in sorted(p for p in self.nested.scopes if p):
            scope = self.nested.scopes[path]
            summaries = self.nested.scope_summaries[path]
            rows.append({"scope": list(path), "kind": scope.kind, "arity": scope.arity, "summaries": [
                {"input": i, "output": o, "summaries": [list(s) for s in summaries[(i, o)]]}
                for i, o in sorted(summaries)]})
        return rows


def parse_scope(text: str | None, known: Iterable[ScopePath]) -> ScopePath | None:
    """A ``?scope=`` query value: comma-separated ASCII digits (``""``: the root), one of
    ``known``; ``None`` when not given.

    >>> parse_scope("3,1", [(), (3,), (3, 1)]), parse_scope("", [()]), parse_scope(None, [()])
    ((3, 1), (), None)

    Raises:
        LookupError: a malformed value or an unknown scope (the message says which).
    """
    if text is None:
        return None
    parts = [p.strip() for p in text.split(",")] if text.strip() else []
    if not all(p.isascii() and p.isdigit() and len(p) <= 10 for p in parts):
        raise LookupError(f"scope must be comma-separated node ids (empty: the root), got {text!r}")
    path = tuple(int(p) for p in parts)
    if path not in set(known):
        raise LookupError(f"unknown scope {list(path)}")
    return path


class NestedEngine:
    """A :class:`~tracker.engine.FrontierEngine` over a nested dataflow's stand-ins, running a
    :class:`~tracker.engine.ScopedEngine` (``ScopedTracker``: one flat engine per scope).

    Its :attr:`graph` is the root scope's; :meth:`frontiers` covers every location of every
    scope (their stand-ins)."""

    def __init__(self, hosting: Hosting, engine: ScopedEngine) -> None:
        self.hosting = hosting
        self.scoped = engine

    @property
    def graph(self) -> Graph:
        return self.hosting.root

    def apply(self, updates: Iterable[Update], *, validated: bool = False) -> list[FrontierChange]:
        """Apply one atomic batch given on the stand-ins.

        Raises:
            GraphError: an update is not at a stand-in of a location holding pointstamps (unless
                ``validated``); nothing was applied.
        """
        scoped = self.hosting._scoped
        try:
            batch = [(scoped[loc], t, d) for loc, t, d in updates]
        except KeyError as error:
            raise GraphError(f"unknown location {error.args[0]}") from None
        flat = self.hosting._flat
        return [FrontierChange(flat[c.location], c.time, c.diff) for c in self.scoped.apply(batch, validated=validated)]

    def frontier(self, location: Location) -> list[Timestamp]:
        return self.scoped.frontier(self.hosting.scoped(location))

    def frontiers(self) -> dict[Location, list[Timestamp]]:
        flat = self.hosting._flat
        return {flat[loc]: times for loc, times in self.scoped.frontiers().items()}

    def pointstamps(self) -> dict[tuple[Location, Timestamp], int]:
        flat = self.hosting._flat
        return {(flat[loc], t): c for (loc, t), c in self.scoped.pointstamps().items()}

    def can_notify(self, location: Location, time: Timestamp) -> bool:
        return self.scoped.can_notify(self.hosting.scoped(location), time)

