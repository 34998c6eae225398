"""How published changes and frontiers are written as JSON: once per version, shared by every
subscriber, the history and the Delta ``frontier_changes`` table.

Guarantees: :func:`changes_json` and the compiled engine's own encoding write the same JSON
for the same changes; a :class:`Selection` names a subscriber's locations once, so that
subscribers asking for the same set share one encoding per version.

>>> changes_json([FrontierChange(Location.target(3, 0), (7,), 1)])
'[{"location":{"node":3,"port":0,"kind":"target"},"time":[7],"diff":1}]'
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from tracker.graph import Location
from tracker.reachability import FrontierChange

if TYPE_CHECKING:
    from progress_engine import ChangeBatch, Frontiers

_PREFIX: dict[Location, str] = {}  # '{"location":{...},"time":[' per location, shared by all dataflows
_TAIL = {1: '],"diff":1}', -1: '],"diff":-1}'}


def changes_json(changes: list[FrontierChange]) -> str:
    """The JSON array of a change list, built once and shared by every subscriber.

    Hand-assembled from cached per-location prefixes (a frontier change's diff is always +1 or
    -1): this runs for every published version, and ``json.dumps`` over dicts was a third of
    the end-to-end latency.

    >>> changes_json([FrontierChange(Location.target(3, 0), (7,), 1)])
    '[{"location":{"node":3,"port":0,"kind":"target"},"time":[7],"diff":1}]'
    """
    prefix, tail = _PREFIX, _TAIL
    try:
        if changes and len(changes[0].time) == 1:  # one arity per dataflow: the common case, specialised
            return "[" + ",".join([f"{prefix[loc]}{when[0]}{tail[diff]}" for loc, when, diff in changes]) + "]"
        return "[" + ",".join([f"{prefix[loc]}{','.join(map(str, when))}{tail[diff]}"
                               for loc, when, diff in changes]) + "]"
    except KeyError:  # a location seen for the first time (or, defensively, an unusual diff)
        for loc, _, _ in changes:
            if loc not in prefix:
                prefix[loc] = f'{{"location":{{"node":{loc.node},"port":{loc.port},"kind":"{loc.kind}"}},"time":['
        return "[" + ",".join([f'{prefix[loc]}{",".join(map(str, when))}],"diff":{diff}}}'
                               for loc, when, diff in changes]) + "]"


class Selection:
    """The locations a subscriber wants (:meth:`Publication.select`); subscribers naming the same
    set share one object, and so one encoding per version."""

    __slots__ = ("locations", "native", "rows")

    def __init__(self, locations: frozenset[Location], native: Any) -> None:
        self.locations = locations
        self.native = native
        """The compiled engine's ``Selection`` (``--engine native``), else ``None``."""
        self.rows: list[int] | None = None
        """Its locations' engine indices in answer order (:meth:`Publication.row_indices`), once asked."""


def encode(changes: list[FrontierChange] | ChangeBatch, selection: Selection | None = None) -> str:
    """The JSON array of a version's changes (at ``selection``'s locations only, if given): the
    compiled engine's ``ChangeBatch`` encodes itself, in Rust; the reference's list goes
    through :func:`changes_json`."""
    if isinstance(changes, list):
        if selection is None:
            return changes_json(changes)
        wanted = selection.locations
        return changes_json([change for change in changes if change.location in wanted])
    return changes.to_json(None if selection is None else selection.native, compact=True)


def decoded(encoded: str) -> list[FrontierChange]:
    """A history entry's changes back from their JSON (the reference engine keeps only that)."""
    return [FrontierChange(Location(c["location"]["node"], c["location"]["port"], c["location"]["kind"]),
                           tuple(c["time"]), c["diff"]) for c in json.loads(encoded)]


class Encoding(Protocol):
    """How a dataflow whose locations are stand-ins is written out (a nested dataflow's,
    :class:`api.live.scopes.Hosting`): its locations, and their JSON (for clients and Delta alike)."""

    locations: list[Location]

    def changes_json(self, changes: list[FrontierChange]) -> str: ...
    def location_json(self, location: Location) -> dict[str, Any]: ...
    def location(self, raw: Mapping[str, Any]) -> Location: ...


def engine_document(version: int, frontiers: Frontiers, indices: list[int]) -> list[str]:
    """``{"version":..,"locations":[..]}`` at ``indices``, its rows written by the compiled
    engine 4,096 at a time."""
    chunks = [f'{{"version":{version},"locations":[']
    for start in range(0, len(indices), 4096):
        chunks.append(("," if start else "") + frontiers.rows_json(indices[start:start + 4096]))
    return [*chunks, "]}"]
