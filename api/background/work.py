"""The messages the hot path builds for the Spark process from a dataflow's state, and what
it makes of an answer: an audit's inputs (a nested dataflow's stand-ins mapped back to their
scopes), a micro-batch's rows, and the difference a reset publishes.

>>> from tracker.graph import Location
>>> a = Location(0, 0, "source")
>>> difference({a: {(0,)}}, [FrontierChange(a, (1,), 1)])
[FrontierChange(location=Location(node=0, port=0, kind='source'), time=(1,), diff=1), \
FrontierChange(location=Location(node=0, port=0, kind='source'), time=(0,), diff=-1)]
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from api.background.state import Hosted
from api.channel.messages import Audit, Row, change_row
from tracker.graph import Location, Update
from tracker.reachability import FrontierChange
from tracker.timestamp import Timestamp


def difference(published: Mapping[Location, Iterable[Timestamp]], frontier: Iterable[FrontierChange]
               ) -> list[FrontierChange]:
    """The changes that take ``published`` to the frontier that ``frontier``'s changes build
    from the empty one."""
    target: dict[Location, set[Timestamp]] = {}
    for change in frontier:
        times = target.setdefault(change.location, set())
        (times.add if change.diff > 0 else times.discard)(change.time)
    out: list[FrontierChange] = []
    for location in sorted(set(published) | set(target)):
        before, after = set(published.get(location, ())), target.get(location, set())
        out += [FrontierChange(location, t, 1) for t in sorted(after - before)]
        out += [FrontierChange(location, t, -1) for t in sorted(before - after)]
    return out


def audit_message(dataflow: Hosted, version: int) -> Audit:
    """The audit of ``dataflow`` as of ``version``: its counts and published frontier, on its
    real locations (a nested dataflow's stand-ins mapped back to their scopes)."""
    counts, published = dataflow.counts(), dataflow.publication.published
    hosting = dataflow.hosting
    if hosting is None:
        return Audit(df=dataflow.id, version=version, counts=[change_row(loc, t, n) for (loc, t), n in counts.items()],
                     live=[(loc.node, loc.port, loc.kind, sorted(ts)) for loc, ts in published.items()])
    scoped_counts = hosting.scoped_counts(counts)
    live = hosting.scoped_frontiers(published)
    return Audit(df=dataflow.id, version=version,
                 counts=[(loc.node, loc.port, loc.kind, tuple(t), n) for (loc, t), n in scoped_counts.items()],
                 scopes=[list(loc.scope) for loc, _ in scoped_counts],
                 live=[(loc.node, loc.port, loc.kind, sorted(ts)) for loc, ts in live.items()],
                 live_scopes=[list(loc.scope) for loc in live])


def rows(updates: Iterable[Update]) -> list[Row]:
    return [change_row(loc, t, n) for loc, t, n in updates]
