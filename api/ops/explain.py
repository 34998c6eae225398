"""``frontier/explain``: which active pointstamps hold a (location, time) back, and along which path.

A notification at ``L`` for ``t`` is safe iff no active pointstamp ``(l, t')`` (positive count)
has a path summary ``s`` in ``Psi[l, L]`` with ``s(t') <= t``. For each pointstamp that does,
the answer gives the pointstamp, the summary, the time it could arrive at ``L`` as, and one
concrete path (the transitions a record would follow), so a user can see why a dataflow is stuck.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from api.schema.models import location_json
from tracker.antichain import Antichain
from tracker.graph import Graph, Location, Transition
from tracker.scope import ScopedLocation
from tracker.scoped_paths import Searched, Step, route
from tracker.structure import release
from tracker.timestamp import PathSummary, Timestamp, less_equal

MAX_BLOCKERS = 50


def _search(graph: Graph, origin: Location) -> tuple[dict[Location, Antichain[PathSummary]],
                                                      dict[tuple[Location, PathSummary], Transition | None]]:
    """Minimal summaries from ``origin`` to everywhere, remembering how each was reached."""
    outgoing: dict[Location, list[Transition]] = defaultdict(list)
    for step in graph.transitions():
        outgoing[step.src].append(step)
    zero = PathSummary.zero(graph.arity)
    reached: dict[Location, Antichain[PathSummary]] = {origin: Antichain([zero])}
    parent: dict[tuple[Location, PathSummary], Transition | None] = {(origin, zero): None}
    queue: deque[tuple[Location, PathSummary]] = deque([(origin, zero)])
    while queue:
        here, summary = queue.popleft()
        if summary not in reached[here]:
            continue
        for step in outgoing[here]:
            combined = summary.followed_by(step.summary)
            if combined is None:
                continue
            if reached.setdefault(step.dst, Antichain()).insert(combined):
                parent.setdefault((step.dst, combined), step)
                queue.append((step.dst, combined))
    return reached, parent


def _path(parent: dict[tuple[Location, PathSummary], Transition | None], end: Location,
          summary: PathSummary) -> list[Transition]:
    steps: list[Transition] = []
    here, acc = end, summary
    while True:
        step = parent.get((here, acc))
        if step is None:
            break
        steps.append(step)
        here = step.src
        acc = PathSummary(a - b for a, b in zip(acc, step.summary, strict=True))
    steps.reverse()
    return steps


def _times_along(path: list[Transition], time: Timestamp) -> list[Timestamp]:
    """The time after each step of ``path`` for a record starting at ``time``."""
    out = []
    for step in path:
        moved = step.summary.results_in(time)
        time = moved if moved is not None else time  # a path from the search never yields None
        out.append(time)
    return out


def _describe(path: list[Transition], times: list[Timestamp], start: Location, time: Timestamp) -> str:
    text = [f"{start}@{list(time)}"]
    for step, current in zip(path, times, strict=True):
        via = "edge" if step.src.kind == "source" else f"operator {step.src.node} +{list(step.summary)}"
        text.append(f" --{via}--> {step.dst}@{list(current)}")
    return "".join(text)


Blame = Callable[[Any, Timestamp], dict[str, Any]]
"""``(location of a blocking pointstamp, its time) -> {"operator", "port", "worker", "age_seconds",
"age_at_least", "stall_kind"}`` (:func:`api.ops.lag.blamer`), merged into each blocker."""


STALL_WORDS = {"held_capability": "a capability held", "unconsumed_messages": "messages not yet consumed",
               "undrained_count": "a count that does not drain"}
"""How a blocker's ``stall_kind`` (:func:`api.ops.lag.stall_kind`) is said in its ``text``."""


def _blamed(blocker: dict[str, Any], blame: Blame | None, origin: Any, when: Timestamp) -> dict[str, Any]:
    """``blocker`` with its operator, worker, age and stall kind, also said in its ``text``."""
    if blame is None:
        return blocker
    extra = blame(origin, when)
    said = f"{extra['operator']} {extra['port']}"
    if extra.get("stall_kind") in STALL_WORDS:
        said += f": {STALL_WORDS[extra['stall_kind']]}"
    if extra.get("worker") is not None:
        said += f", last reported by worker {extra['worker']}"
    if extra.get("age_seconds") is not None:
        said += f", live for {extra['age_seconds']:.1f} s"
    return {**blocker, **extra, "text": f"{blocker['text']} [{said}]"}


Searches = dict[Location, Any]
"""Each origin's search (:func:`_search`), kept by a caller explaining several locations of one
graph, which then releases them (:func:`release_searches`)."""


def release_searches(searches: Searches) -> None:
    """Let the searches go (a search holds ~3 objects per location: released in one pass)."""
    for reached, parent in searches.values():
        release(reached, parent)
    searches.clear()


def explain(graph: Graph, counts: dict[tuple[Location, Timestamp], int], frontier: list[Timestamp],
            version: int, location: Location, time: Timestamp, blame: Blame | None = None,
            searches: Searches | None = None) -> dict[str, Any]:
    """The ``ExplainResponse`` body for ``(location, time)`` given the active counts; with
    ``blame``, each blocker also names its operator, the worker that last reported it and its age;
    with ``searches``, the origins' searches are taken from and kept there (else released)."""
    owned = searches is None
    searches = {} if searches is None else searches

    def find(origin: Location, when: Timestamp) -> tuple[Timestamp, PathSummary] | None:
        if origin not in searches:
            searches[origin] = _search(graph, origin)
        reached, _ = searches[origin]
        best: tuple[Timestamp, PathSummary] | None = None
        for summary in reached.get(location, ()):
            arrives = summary.results_in(when)
            if arrives is not None and less_equal(arrives, time) and (best is None or arrives < best[0]):
                best = (arrives, summary)
        return best

    def describe(origin: Location, when: Timestamp, count: int,
                 best: tuple[Timestamp, PathSummary]) -> dict[str, Any]:
        arrives, summary = best
        path = _path(searches[origin][1], location, summary)
        times = _times_along(path, when)
        return {
            "location": location_json(origin), "time": list(when), "count": count,
            "summary": list(summary), "arrives_as": list(arrives),
            "path": [{"from": location_json(s.src), "to": location_json(s.dst), "summary": list(s.summary),
                      "time": list(t)} for s, t in zip(path, times, strict=True)],
            "text": f"{count} x {origin}@{list(when)} can reach {location} as {list(arrives)} <= {list(time)}: "
                    + _describe(path, times, origin, when),
        }

    total, blockers = _collect(counts, lambda key: (key[1], key[0]), find, describe, blame)
    if owned:
        release_searches(searches)
    return _response(version, location_json(location), location, time, frontier, total, blockers, "")


def explain_nested(steps: Mapping[ScopedLocation, list[Step]],
                   counts: Mapping[tuple[ScopedLocation, Timestamp], int], frontier: list[Timestamp], version: int,
                   location: ScopedLocation, time: Timestamp, blame: Blame | None = None,
                   searched: Searched | None = None) -> dict[str, Any]:
    """:func:`explain` for a dataflow with nested scopes: each blocker's path runs over the
    flattened graph (:mod:`tracker.scoped_paths`) and may cross scope boundaries, each step
    saying what it is (``via``: edge, operator, ingress, egress) and the time after it, in its
    scope's arity. ``summary`` is the blocker's path summary when it stays in one scope, else
    ``None`` (ingress and egress change a time's arity: no one summary maps it). ``searched``:
    the searches of earlier calls for other locations, reused (see :func:`tracker.scoped_paths.route`)."""

    def describe(origin: ScopedLocation, when: Timestamp, count: int,
                 found: tuple[Timestamp, list[tuple[Step, Timestamp]]]) -> dict[str, Any]:
        arrives, path = found
        crossing = any(step.via in ("ingress", "egress") for step, _ in path)
        summary = None if crossing else [a - b for a, b in zip(arrives, when, strict=True)]
        text = [f"{origin}@{list(when)}"]
        for step, after in path:
            via = f"operator {step.src.node} +{list(step.summary)}" if step.via == "operator" else step.via
            text.append(f" --{via}--> {step.dst}@{list(after)}")
        return {
            "location": _scoped_json(origin), "time": list(when), "count": count, "summary": summary,
            "arrives_as": list(arrives),
            "path": [{"from": _scoped_json(step.src), "to": _scoped_json(step.dst),
                      "summary": list(step.summary), "time": list(after), "via": step.via} for step, after in path],
            "text": f"{count} x {origin}@{list(when)} can reach {location} as {list(arrives)} <= {list(time)}: "
                    + "".join(text),
        }

    def find(origin: ScopedLocation, when: Timestamp) -> tuple[Timestamp, list[tuple[Step, Timestamp]]] | None:
        return route(steps, origin, when, location, time, searched)

    total, blockers = _collect(counts, lambda key: (len(key[1]), key[1], key[0]), find, describe, blame)
    return _response(version, _scoped_json(location), location, time, frontier, total, blockers,
                     ", along paths that may cross scope boundaries (ingress appends a loop counter 0, egress "
                     "drops it)")


_Where = TypeVar("_Where", Location, ScopedLocation)
_Found = TypeVar("_Found")


def _collect(counts: Mapping[tuple[_Where, Timestamp], int], order: Callable[[tuple[_Where, Timestamp]], Any],
             find: Callable[[_Where, Timestamp], _Found | None],
             describe: Callable[[_Where, Timestamp, int, _Found], dict[str, Any]],
             blame: Blame | None) -> tuple[int, list[dict[str, Any]]]:
    """How many active pointstamps (positive count) ``find`` a way to the queried place from, and
    the blocker bodies ``describe`` gives (blamed) for the first :data:`MAX_BLOCKERS` of them in
    ``order``: every blocker counts, only the first ones are spelled out."""
    blockers: list[dict[str, Any]] = []
    total = 0
    for (origin, when), count in sorted(counts.items(), key=lambda kv: order(kv[0])):
        if count <= 0:
            continue
        found = find(origin, when)
        if found is None:
            continue
        total += 1
        if len(blockers) >= MAX_BLOCKERS:
            continue
        blockers.append(_blamed(describe(origin, when, count, found), blame, origin, when))
    return total, blockers


def _response(version: int, location_body: dict[str, Any], location: Location | ScopedLocation, time: Timestamp,
              frontier: list[Timestamp], total: int, blockers: list[dict[str, Any]], paths: str) -> dict[str, Any]:
    """The ``ExplainResponse`` body; ``paths`` says what the blockers' paths may do, after the count."""
    safe = total == 0
    shown = "" if total <= len(blockers) else f" (the first {len(blockers)} are listed)"
    explanation = (
        f"Safe: no active pointstamp can reach {location} at a time <= {list(time)}, so a notification for "
        f"{list(time)} at {location} may be delivered (frontier: {[list(t) for t in frontier]})." if safe else
        f"Not safe yet: {total} active pointstamp(s) could still result in a time <= {list(time)} at {location}"
        f"{shown}{paths}. The frontier there is {[list(t) for t in frontier]}. Each blocker must be retired (its "
        f"count brought to zero) or advanced before {list(time)} can be notified.")
    return {"version": version, "location": location_body, "time": list(time), "safe_to_notify": safe,
            "frontier": [list(t) for t in frontier], "blocker_count": total, "blockers": blockers,
            "explanation": explanation}


def _scoped_json(location: ScopedLocation) -> dict[str, Any]:
    body = location_json(location.local)
    return {"scope": list(location.scope), **body} if location.scope else body
