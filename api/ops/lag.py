"""Lag and blame of one hosted dataflow, as ``GET /v1/dataflows/{id}/lag``, ``explain`` and
``/metrics`` report them.

Per location: its operator's name and the port, its frontier, the wall-clock seconds since
that frontier last changed (``lag_seconds``, ``null`` once the frontier is empty: nothing is
awaited there) and its oldest live pointstamp with the worker that last reported it, its age
and the kind of stall it makes (:func:`stall_kind`). Read from the dataflow's
:class:`~api.live.ages.Ages` and published frontier, on the event loop (each call is a
consistent view of one version); the lag report's rows are built from copies, off the loop.
"""

from __future__ import annotations

import json
import time
import weakref
from collections.abc import Callable, Iterable
from typing import Any

from api.host.tenant import Tenant
from api.metrics import LagRow
from tracker.graph import Graph, Location
from tracker.scope import ScopedLocation
from tracker.timestamp import Timestamp

STALL_KINDS = ("held_capability", "unconsumed_messages", "undrained_count")
"""What a live pointstamp holding a frontier back is (:func:`stall_kind`)."""


def stall_kind(location: Location, born: float | None, reported_floor: float | None) -> str:
    """What kind of stall a live pointstamp at ``location``, born at ``born``, makes, given the
    earliest of every worker's last batch (``reported_floor``, :meth:`Ages.reported_floor`):

    * ``held_capability``: at an operator output (a source): an operator keeps a capability;
    * ``undrained_count``: at an input (a target), and every worker has sent a batch since it
      appeared: whoever had the messages reported since and the count did not drain (messages
      kept unread, or miscounted: a ``+1`` too many, a ``-1`` lost);
    * ``unconsumed_messages``: at an input, not (yet) that: messages sent and not yet consumed.

    A judgement from what the service sees (a worker that has not reported since leaves it
    ``unconsumed_messages``), not a proof.

    >>> stall_kind(Location.source(3, 0), 10.0, 20.0)
    'held_capability'
    >>> stall_kind(Location.target(4, 0), 10.0, 20.0), stall_kind(Location.target(4, 0), 10.0, 5.0)
    ('undrained_count', 'unconsumed_messages')
    """
    if location.kind == "source":
        return "held_capability"
    if born is not None and reported_floor is not None and reported_floor > born:
        return "undrained_count"
    return "unconsumed_messages"


def port_label(location: ScopedLocation | Location, boundary: bool = False) -> str:
    """How a port is called on screen: ``in 0``, ``out 1``; a scope's boundary (node 0 inside
    it) has ``enter p`` (its outputs) and ``leave q`` (its inputs).

    >>> port_label(Location.target(3, 0)), port_label(Location.source(0, 1), boundary=True)
    ('in 0', 'enter 1')
    """
    if boundary:
        return f"{'enter' if location.kind == 'source' else 'leave'} {location.port}"
    return f"{'in' if location.kind == 'target' else 'out'} {location.port}"


class Names:
    """Operator names and port labels of one dataflow's locations (stand-ins for a nested one)."""

    def __init__(self, tenant: Tenant) -> None:
        self._tenant = tenant
        graphs: dict[tuple[int, ...], Graph] = (
            {(): tenant.graph} if tenant.hosting is None
            else {path: scope.graph for path, scope in tenant.hosting.nested.scopes.items()})
        self._names = {(path, node.id): node.name or f"operator {node.id}"
                       for path, graph in graphs.items() for node in graph.nodes}
        for path in graphs:
            if path:  # a scope's boundary is named after the scope node
                self._names[(path, 0)] = f"{self._names.get((path[:-1], path[-1]), 'scope')} boundary"

    def scoped(self, location: Location) -> ScopedLocation:
        """The scoped location of a location (a stand-in in a nested dataflow)."""
        hosting = self._tenant.hosting
        return ScopedLocation((), *location) if hosting is None else hosting.scoped(location)

    def json(self, location: Location) -> dict[str, Any]:
        """The service's JSON of a location (``scope`` only inside a nested scope)."""
        hosting = self._tenant.hosting
        if hosting is not None:
            return hosting.location_json(location)
        return {"node": location.node, "port": location.port, "kind": location.kind}

    def operator(self, location: Location) -> str:
        """The name of the operator owning ``location`` (``operator N`` when unnamed)."""
        scoped = self.scoped(location)
        return self._names.get((scoped.scope, scoped.node), f"operator {scoped.node}")

    def port(self, location: Location) -> str:
        """``in p`` / ``out p`` (``enter p`` / ``leave p`` on a scope's boundary)."""
        scoped = self.scoped(location)
        return port_label(scoped, boundary=bool(scoped.scope) and scoped.node == 0)

    def qualified(self, location: Location) -> str:
        """The operator as a metric label: ``name #id``, after its scope path inside a scope."""
        scoped = self.scoped(location)
        prefix = f"[{','.join(map(str, scoped.scope))}] " if scoped.scope else ""
        return f"{prefix}{self.operator(location)} #{scoped.node}"


_NAMES: weakref.WeakKeyDictionary[Tenant, Names] = weakref.WeakKeyDictionary()


def names_of(tenant: Tenant) -> Names:
    """The :class:`Names` of a dataflow, made once (O(graph); its graph never changes)."""
    names = _NAMES.get(tenant)
    if names is None:
        names = _NAMES[tenant] = Names(tenant)
    return names


def locations_of(tenant: Tenant) -> list[Location]:
    """Every location of the dataflow (a nested one's stand-ins), in answer order."""
    return tenant.hosting.locations if tenant.hosting is not None else tenant.graph.locations()


def index_of(tenant: Tenant) -> Callable[[Location], int] | None:
    """The compiled engine's index of a location (it reports changed locations by index)."""
    return tenant.live.index_of()


def blamer(tenant: Tenant, now: float) -> Callable[[Location, Timestamp], dict[str, Any]]:
    """``(location, time) -> {"operator", "port", "worker", "age_seconds", "age_at_least",
    "stall_kind"}`` for the blockers of ``explain``, over a copy of the births taken now
    (``explain`` runs off the event loop)."""
    ages = tenant.ages
    births = {key: ages.blame(*key) for key in tenant.counts()}
    floor = ages.reported_floor()

    def blame(location: Location, time: Timestamp) -> dict[str, Any]:
        names = names_of(tenant)  # the first time off the loop (explain calls this in a thread)
        born = births.get((location, time))
        return {"operator": names.operator(location), "port": names.port(location),
                "worker": None if born is None else born[1],
                "age_seconds": None if born is None else round(max(now - born[0], 0.0), 3),
                "age_at_least": born is not None and ages.at_least(born[0]),
                "stall_kind": stall_kind(location, None if born is None else born[0], floor)}

    return blame


def lag_report(tenant: Tenant, now: float) -> Callable[[], list[bytes]]:
    """The ``GET .../lag`` body: every location's frontier, lag and oldest pointstamp. The
    dataflow's state is read now (on the event loop: copies made in C); what is returned
    builds the JSON from those copies, a Python pass per location, as chunks to send one after
    the other: call it in a worker thread (for 100,000 locations it took the event loop over 2 s)."""
    version, frontier = tenant.publication.frontier_reader()
    ages = tenant.ages
    moved = ages.moved_all(index_of(tenant))
    oldest = ages.oldest_by_location()
    floor = ages.reported_floor()

    def build() -> list[bytes]:
        names = names_of(tenant)
        worst: float | None = None
        worst_at_least = False
        parts: list[bytes] = []
        locations = locations_of(tenant)
        # A slice of rows at a time, each encoded and let go at once (~2 ms of the GIL): 100,000 rows alive
        # together cost a collector pass and a release of ~50 ms each, holding the GIL.
        for start in range(0, len(locations), 256):
            rows = []
            for location in locations[start:start + 256]:
                times = frontier(location)
                at = moved(location)
                lag = round(max(now - at, 0.0), 3) if times else None
                at_least = ages.at_least(at)
                if lag is not None and (worst is None or lag > worst):
                    worst, worst_at_least = lag, at_least
                first = oldest.get(location)
                rows.append({
                    "location": names.json(location), "operator": names.operator(location),
                    "port": names.port(location), "frontier": [list(t) for t in times], "lag_seconds": lag,
                    "changed_at": round(at, 3), "lag_at_least": lag is not None and at_least,
                    "oldest_pointstamp": None if first is None else {
                        "time": list(first[0]), "worker": first[2],
                        "age_seconds": round(max(now - first[1], 0.0), 3), "age_at_least": ages.at_least(first[1]),
                        "stall_kind": stall_kind(location, first[1], floor)},
                })
            parts.append((b"," if parts else b"") + _dumps(rows)[1:-1].encode())
        head = _dumps({"version": version, "at": round(now, 3), "max_lag_seconds": worst,
                       "max_lag_at_least": worst_at_least, "locations": []})
        return [head[:-2].encode(), *parts, b"]}"]  # "locations" is the last key

    return build


def _dumps(value: Any) -> str:
    """JSON as the service's ``JSONResponse`` writes it."""
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def input_lags(tenant: Tenant, now: float) -> Callable[[], list[tuple[str, str, float]]]:
    """``(operator, port, lag seconds)`` of every operator input with a non-empty frontier
    (the ``/metrics`` gauges; a frontier that is empty is not waited on, so it has none). Read
    now (copies, on the event loop); listed by what is returned, which may run in a worker thread
    (a Python pass per location: ~0.1 s for 100,000)."""
    _, frontier = tenant.publication.frontier_reader()
    moved = tenant.ages.moved_all(index_of(tenant))

    def rows() -> list[tuple[str, str, float]]:
        names = names_of(tenant)
        return [(names.qualified(location), names.port(location), max(now - moved(location), 0.0))
                for location in locations_of(tenant) if location.kind == "target" and frontier(location)]

    return rows


def oldest_age(tenant: Tenant, now: float) -> float:
    """The age of the dataflow's oldest live pointstamp (0 without any)."""
    return max((now - at for _, at, _ in tenant.ages.oldest_by_location().values()), default=0.0)


def service_lag_rows(dataflows: Iterable[Tenant]) -> Callable[[], list[LagRow]]:
    """Every ready dataflow's operator inputs' lags, for ``/metrics``: read now (copies, on
    the event loop), listed by what is returned (call it in a worker thread)."""
    now = time.time()
    readers = [(tenant.id, input_lags(tenant, now)) for tenant in list(dataflows) if tenant.ready]
    return lambda: [(dataflow_id, *row) for dataflow_id, rows in readers for row in rows()]


def service_oldest_age(dataflows: Iterable[Tenant]) -> float:
    """The age of the oldest live pointstamp of any ready dataflow (0 without any)."""
    now = time.time()
    return max((oldest_age(t, now) for t in list(dataflows) if t.ready), default=0.0)
