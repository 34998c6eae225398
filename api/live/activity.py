"""Why a dataflow is slow: its workers' statistics (busy time per operator, messages and records
per channel) over a bounded window, and their totals since this process hosts it.

Guarantees: a report is checked against the dataflow's graph before anything is kept (every
operator and channel it names is one of the dataflow's, else nothing changes); memory is bounded
(the window keeps the reports of the last :data:`WINDOW_SECONDS` before the newest, at most
:data:`MAX_REPORTS`; the totals one entry per operator and channel of the graph); nothing here
touches the frontiers or the progress path.

Shares and rates are of the workers' own time: an operator's busy share is its busy time over
the time the reports cover (summed over workers, so 0.25 is a quarter of every worker's time);
a channel's records per second are its records over the wall time covered (the worker time
divided by the number of workers reporting).

>>> from tracker.graph import Edge, Graph, Location, Node
>>> graph = Graph.build(1, [Node(1, 0, 1, "Input"), Node(2, 1, 0, "Sleepy")],
...                     [Edge(Location.source(1, 0), Location.target(2, 0))])
>>> activity = Activity(Shape.of([((), graph, frozenset())]))
>>> body = {"worker": "w0", "seconds": 1.0, "busy_ns": 600_000_000,
...         "operators": [{"node": 2, "busy_ns": 500_000_000, "schedules": 3}],
...         "channels": [{"source": [1, 0], "target": [2, 0], "messages": 2, "records": 40}]}
>>> activity.add(ActivityReport.model_validate(body), at=100.0)
>>> activity.add(ActivityReport.model_validate({**body, "worker": "w1"}), at=100.2)
>>> view = activity.view()
>>> [(op["name"], op["busy_share"]) for op in view["operators"]]
[('Sleepy', 0.5), ('Input', 0.0)]
>>> view["channels"][0]["records_per_second"], view["channels"][0]["total_records"]
(80.0, 80)
>>> activity.problem(ActivityReport.model_validate({**body, "operators": [{"node": 9, "busy_ns": 1}]}))
'operator 9 of scope [] is not an operator of this dataflow'
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from api.schema.activity import ActivityReport
from tracker.graph import Graph

WINDOW_SECONDS = 10.0
"""The window of the shares and rates: reports received within this many seconds of the newest."""
MAX_REPORTS = 4_096
"""Reports the window keeps at most (a program of many workers reporting often)."""

OperatorKey = tuple[tuple[int, ...], int]
"""``(scope path, node)``."""
ChannelKey = tuple[tuple[int, ...], tuple[int, int], tuple[int, int]]
"""``(scope path, (source node, port), (target node, port))``."""


@dataclass(frozen=True)
class Shape:
    """What a report is checked against and named by: the dataflow's operators (with names,
    and which are scopes) and channels."""

    names: dict[OperatorKey, str]
    scopes: frozenset[OperatorKey]
    channels: frozenset[ChannelKey]

    @classmethod
    def of(cls, scopes: Iterable[tuple[tuple[int, ...], Graph, frozenset[int]]]) -> Shape:
        """From each scope's path, graph and scope nodes (a flat dataflow: the root alone)."""
        names: dict[OperatorKey, str] = {}
        nested: set[OperatorKey] = set()
        channels: set[ChannelKey] = set()
        for path, graph, children in scopes:
            for node in graph.nodes:
                if path and node.id == 0:  # a scope's boundary: no operator
                    continue
                names[(path, node.id)] = node.name or f"operator {node.id}"
            nested.update((path, child) for child in children)
            channels.update((path, (e.source.node, e.source.port), (e.target.node, e.target.port))
                            for e in graph.edges)
        return cls(names, frozenset(nested), frozenset(channels))

    def label(self, key: OperatorKey) -> str:
        """``name #node``, after the scope path inside a scope (as the metrics label operators)."""
        path, node = key
        prefix = f"[{','.join(map(str, path))}] " if path else ""
        return f"{prefix}{self.names.get(key, f'operator {node}')} #{node}"


@dataclass
class _Kept:
    at: float
    worker: str
    seconds: float
    busy_ns: int
    operators: list[tuple[OperatorKey, int, int]]
    channels: list[tuple[ChannelKey, int, int]]


@dataclass
class Activity:
    """One dataflow's statistics: the window and the totals."""

    shape: Shape
    window: deque[_Kept] = field(default_factory=deque)
    reports: int = 0
    """Reports accepted since this process hosts the dataflow."""
    busy_total: dict[OperatorKey, list[int]] = field(default_factory=dict)
    """Per operator: busy nanoseconds and schedules, in total."""
    channel_total: dict[ChannelKey, list[int]] = field(default_factory=dict)
    """Per channel: messages and records, in total."""
    seconds_total: float = 0.0

    def problem(self, report: ActivityReport) -> str | None:
        """Why ``report`` does not fit the dataflow (``None``: it does)."""
        for op in report.operators:
            if (tuple(op.scope), op.node) not in self.shape.names:
                return f"operator {op.node} of scope {op.scope} is not an operator of this dataflow"
        for ch in report.channels:
            if (tuple(ch.scope), ch.source, ch.target) not in self.shape.channels:
                return (f"channel {list(ch.source)} -> {list(ch.target)} of scope {ch.scope} is not a channel of "
                        "this dataflow")
        return None

    def add(self, report: ActivityReport, at: float) -> None:
        """Keep a report (checked by :meth:`problem`) received at ``at`` (POSIX seconds)."""
        operators = [((tuple(op.scope), op.node), op.busy_ns, op.schedules) for op in report.operators]
        channels = [((tuple(ch.scope), ch.source, ch.target), ch.messages, ch.records) for ch in report.channels]
        for key, busy, schedules in operators:
            total = self.busy_total.setdefault(key, [0, 0])
            total[0] += busy
            total[1] += schedules
        for channel, messages, records in channels:
            counted = self.channel_total.setdefault(channel, [0, 0])
            counted[0] += messages
            counted[1] += records
        self.reports += 1
        self.seconds_total += report.seconds
        self.window.append(_Kept(at, report.worker, report.seconds, report.busy_ns, operators, channels))
        newest = max(at, self.window[-1].at)
        while self.window and (len(self.window) > MAX_REPORTS or self.window[0].at < newest - WINDOW_SECONDS):
            self.window.popleft()

    def _end(self, path: tuple[int, ...], node: int) -> str:
        """A channel's end: its operator, or the boundary of its scope (node 0 inside one)."""
        if node == 0 and path:
            return f"{self.shape.label((path[:-1], path[-1]))} boundary"
        return self.shape.label((path, node))

    def view(self) -> dict[str, Any]:
        """The window's shares and rates and the totals: operators busiest first (every operator
        of the dataflow, those that never ran at 0), channels with the most records per second
        first (those that carried something)."""
        kept = list(self.window)
        worker_seconds = sum(k.seconds for k in kept)
        workers = sorted({k.worker for k in kept})
        wall = worker_seconds / len(workers) if workers else 0.0
        busy: dict[OperatorKey, list[int]] = {}
        traffic: dict[ChannelKey, list[int]] = {}
        for k in kept:
            for key, ns, schedules in k.operators:
                entry = busy.setdefault(key, [0, 0])
                entry[0] += ns
                entry[1] += schedules
            for channel, messages, records in k.channels:
                counted = traffic.setdefault(channel, [0, 0])
                counted[0] += messages
                counted[1] += records

        def share(ns: int) -> float:
            return round(ns / 1e9 / worker_seconds, 6) if worker_seconds else 0.0

        def rate(n: int) -> float:
            return round(n / wall, 3) if wall else 0.0

        operators: list[dict[str, Any]] = [{"scope": list(key[0]), "node": key[1], "name": self.shape.names[key],
                      "label": self.shape.label(key), "is_scope": key in self.shape.scopes,
                      "busy_share": share(busy.get(key, [0])[0]),
                      "busy_seconds": round(busy.get(key, [0])[0] / 1e9, 6),
                      "schedules": busy.get(key, [0, 0])[1],
                      "total_busy_seconds": round(self.busy_total.get(key, [0])[0] / 1e9, 6),
                      "total_schedules": self.busy_total.get(key, [0, 0])[1]} for key in self.shape.names]
        # The hottest first; a scope, whose time includes its operators', after the operators.
        operators.sort(key=lambda op: (op["is_scope"], -op["busy_share"], -op["total_busy_seconds"],
                                       op["scope"], op["node"]))
        channels: list[dict[str, Any]] = []
        for channel, (messages, records) in self.channel_total.items():
            path, source, target = channel
            now = traffic.get(channel, [0, 0])
            channels.append({"scope": list(path), "source": list(source), "target": list(target),
                             "from": self._end(path, source[0]), "to": self._end(path, target[0]),
                             "records_per_second": rate(now[1]), "messages_per_second": rate(now[0]),
                             "total_records": records, "total_messages": messages})
        channels.sort(key=lambda ch: (-ch["records_per_second"], -ch["total_records"], ch["scope"], ch["source"],
                                      ch["target"]))
        return {"reports": self.reports, "as_of": kept[-1].at if kept else None,
                "window_seconds": round(wall, 3), "workers": workers,
                "dataflow_busy_share": share(sum(k.busy_ns for k in kept)),
                "total_seconds": round(self.seconds_total, 3), "operators": operators, "channels": channels}

