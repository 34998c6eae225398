"""One frame of the dashboard: everything its panels show of a dataflow, read at one version.

A frame is the dataflow's status (state, violations), every location's frontier and lag (the
``lag`` body), what holds the longest-waiting locations back (the blockers ``explain`` would
give, at each one's earliest frontier time), the full explanation of one location if asked,
the progress estimates, and the durable batches per second since a given second. Its parts
are read together on the event loop, so they describe the same published version, which the
frame names; the page draws every panel from one frame.

Guarantee: ``version`` is the version of every part (``status.frontier_version``, ``lag.version``,
``estimate.version`` and the frontier every blocker was found against); what is heavy (rows,
searches) is built from copies, off the loop.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from api.host.tenant import Tenant
from api.ops.estimate import estimate
from api.ops.explain import Searches, explain, explain_nested, release_searches
from api.ops.lag import blamer, index_of, lag_report, locations_of, names_of
from tracker.graph import Location
from tracker.scoped_paths import Searched

MAX_HELD = 30
"""Locations whose blockers a frame lists: those that have waited longest."""
MAX_BLOCKERS = 10
"""Blockers listed per location in a frame (``blocker_count`` says how many there are)."""
MAX_TEXT = 1_000
"""Characters of an explained blocker's text kept in a frame (a path through a big graph is long)."""


def _slim(blocker: dict[str, Any]) -> dict[str, Any]:
    """A blocker without its path (thousands of steps through a big graph), which is summed up
    as the scope crossings on it (``via``: ingress, egress, in order)."""
    kept = {k: v for k, v in blocker.items() if k not in ("path", "text")}
    return {**kept, "via": [step["via"] for step in blocker["path"] if step.get("via") in ("ingress", "egress")]}


def _operators(answer: dict[str, Any]) -> list[dict[str, Any]]:
    """Every operator on the listed blockers' paths, once each (a scope's boundary as its scope node)."""
    seen: dict[tuple[tuple[int, ...], int], None] = {}
    for blocker in answer["blockers"]:
        for where in [blocker["location"], *(end for step in blocker["path"] for end in (step["from"], step["to"]))]:
            path = tuple(where.get("scope") or ())
            seen[(path[:-1], path[-1]) if path and where["node"] == 0 else (path, where["node"])] = None
    return [{"scope": list(path), "node": node} if path else {"node": node} for path, node in seen]


def _dumps(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()


def frame(tenant: Tenant, now: float, throughput_after: float | None = None, explained: Location | None = None
          ) -> Callable[[], list[bytes]]:
    """The frame's JSON as chunks: read now (on the event loop), built by what is returned (in
    a worker thread). ``throughput_after``: only the seconds after it; ``explained``: a location
    (a nested dataflow's stand-in) whose full explanation, at its earliest frontier time, the
    frame carries too (``null`` if its frontier is empty)."""
    publication = tenant.publication
    version, frontier = publication.frontier_reader()
    status = {**tenant.status(), "frontier_version": version}
    moved = tenant.ages.moved_all(index_of(tenant))
    counts = tenant.counts()
    blame = blamer(tenant, now)
    lag = lag_report(tenant, now)
    estimated = estimate(tenant, now)
    rates = [{"second": s, "batches": b, "updates": u} for s, b, u in tenant.throughput.rows(throughput_after)]
    hosting = tenant.hosting

    scoped_counts: dict[Any, int] = {}
    routes: Searched = {}

    def why(location: Location, searches: Searches) -> dict[str, Any] | None:
        """``explain``'s answer for ``location`` at its earliest frontier time (``None``: empty),
        the searches shared by the frame's locations."""
        times = frontier(location)
        if not times:
            return None
        if hosting is None:
            return explain(tenant.graph, counts, times, version, location, times[0], blame, searches)
        if not scoped_counts:
            scoped_counts.update({(hosting.scoped(loc), t): c for (loc, t), c in counts.items()})
        return explain_nested(hosting.steps, scoped_counts, times, version, hosting.scoped(location), times[0],
                              lambda origin, at: blame(hosting.flat(origin), at), routes)

    def held(searches: Searches) -> list[dict[str, Any]]:
        names = names_of(tenant)
        order = locations_of(tenant)  # ties (a whole pipeline waiting since one moment) in graph order, root first
        waiting = sorted((i for i, loc in enumerate(order) if frontier(loc)), key=lambda i: (moved(order[i]), i))
        rows = []
        for location in (order[i] for i in waiting[:MAX_HELD]):
            times = frontier(location)
            answer = why(location, searches)
            assert answer is not None  # its frontier is not empty
            rows.append({"location": names.json(location), "operator": names.operator(location),
                         "port": names.port(location), "frontier": [list(t) for t in times],
                         "time": list(times[0]), "blocker_count": answer["blocker_count"],
                         "blockers": [_slim(b) for b in answer["blockers"][:MAX_BLOCKERS]]})
        return rows

    def build() -> list[bytes]:
        searches: Searches = {}
        try:
            rows, answer = held(searches), None if explained is None else why(explained, searches)
        finally:
            release_searches(searches)
            routes.clear()
        if answer is not None:
            answer = {**answer, "operators": _operators(answer),
                      "blockers": [{**_slim(b), "text": b["text"][:MAX_TEXT]} for b in answer["blockers"]]}
        head = _dumps({"version": version, "at": round(now, 3), "status": status, "held": rows,
                       "explained": answer, "estimate": estimated(), "throughput": rates, "lag": None})
        # "lag" is the last key: its body is the lag report's chunks, as written for GET .../lag.
        return [head[:-5], *lag(), b"}"]

    return build
