"""Progress estimates: how fast each operator's frontier advances, and when it should be done.

An operator's *epoch* is the earliest first coordinate (the root's time, in every scope) of the
frontier at any of its inputs: the oldest epoch it may still receive. Once every input frontier
is empty, it is that of its outputs' frontiers instead: what it still holds (a capability kept,
or for a scope node, whatever is live inside the scope); ``None`` once those are empty too (the
operator is done: nothing can reach it and it holds nothing). Its *rate* is the epochs that epoch advanced per second
over the last :data:`WINDOW_SECONDS` (or since the dataflow is observed, if less), from the
epoch's first change in that window on: the time before an operator first moves (its program
starting, the pipeline filling) is not its pace. Where the
dataflow's last epoch is known, the operator is expected to be done after ``(last epoch + 1 -
epoch) / rate`` seconds. The last epoch is known when the registration declares it
(``last_epoch``: no input sends at a later epoch), or once every input is closed (the root's
operators without inputs hold nothing any more) and no summary anywhere advances the first
coordinate: no later epoch can appear than the latest one live.

Honesty over guessing: the rate is ``None`` ("unknown", with the reason) when the window is
shorter than :data:`MIN_SECONDS`, when the epoch advanced by fewer than :data:`MIN_EPOCHS`, or
when it was unsteady: split in four quarters, some quarter advanced by more than half the
overall rate's share of it (plus one epoch, for the steps' granularity) away from that share.
An operator whose epoch did not move at all has rate 0 and no expected time.

Where the data come from: the published history's versions with the time each was applied
(:attr:`api.streams.publish.Publication.history_at`), folded per operator input into the
multiset of its frontier's first coordinates. An :class:`Estimator` is made on a dataflow's
first estimate (it replays the history of the last window once) and then folds only the
versions published since its last call; nothing runs on the hot path.

>>> steps = Steps(start_epoch=0)
>>> for k in range(1, 21):
...     steps.moved(100.0 + 0.1 * k, k)
>>> rate = steps.rate(since=100.0, now=102.0)
>>> round(rate.epochs_per_second, 1), rate.reason
(10.0, None)
>>> bursty = Steps(start_epoch=0)
>>> bursty.moved(100.1, 10); bursty.moved(101.6, 20)
>>> bursty.rate(since=100.0, now=102.0).reason
'rate unsteady over the window'
"""

from __future__ import annotations

import json
import threading
import weakref
from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from api.host.tenant import Tenant
from api.ops.lag import names_of
from tracker.graph import Graph, Location
from tracker.scope import ScopedLocation
from tracker.timestamp import Timestamp

WINDOW_SECONDS = 10.0
"""How far back the rate looks."""
MIN_SECONDS = 1.0
"""A window shorter than this gives no rate."""
MIN_EPOCHS = 3
"""An advance of fewer epochs over the window gives no rate (but 0 is a rate: not advancing)."""


@dataclass(frozen=True)
class Rate:
    """An operator's rate over a window: ``epochs_per_second`` (``None``: unknown, ``reason`` says why)."""

    epochs_per_second: float | None
    reason: str | None


class Steps:
    """One operator's epoch over time: its value when observation began and each change since
    (:meth:`forget_before` folds the old ones into that starting value)."""

    __slots__ = ("_steps", "start_epoch")

    def __init__(self, start_epoch: int | None) -> None:
        self.start_epoch = start_epoch
        self._steps: deque[tuple[float, int | None]] = deque()

    @property
    def epoch(self) -> int | None:
        """The current epoch (``None``: done)."""
        return self._steps[-1][1] if self._steps else self.start_epoch

    def moved(self, at: float, epoch: int | None) -> None:
        """The epoch became ``epoch`` at ``at``."""
        if epoch != self.epoch:
            self._steps.append((at, epoch))

    def forget_before(self, at: float) -> None:
        """Fold the changes up to ``at`` into :attr:`start_epoch` (the value at ``at``)."""
        steps = self._steps
        while steps and steps[0][0] <= at:
            self.start_epoch = steps.popleft()[1]

    def at(self, when: float) -> int | None:
        """The epoch at ``when``."""
        value = self.start_epoch
        for at, epoch in self._steps:
            if at > when:
                break
            value = epoch
        return value

    def rate(self, since: float, now: float) -> Rate:
        """The rate over ``[since, now]``, from the epoch's first change in it on (see the module
        docstring for when it is unknown); call :meth:`forget_before` ``since`` first."""
        moving = bool(self._steps) and self._steps[0][0] > since
        if moving:
            since = self._steps[0][0]  # what came before an operator first moves is not its pace
        span = now - since
        if span < MIN_SECONDS:
            return Rate(None, f"{'moving' if moving else 'observed'} for {span:.1f} s only")
        found = [self.at(since + span * k / 4) for k in range(5)]
        marks = [m for m in found if m is not None]
        if len(marks) < len(found):
            return Rate(None, "done during the window")
        advanced = marks[-1] - marks[0]
        if advanced == 0:
            return Rate(0.0, "not advancing")
        if advanced < MIN_EPOCHS:
            return Rate(None, f"advanced {advanced} epoch(s) only in {span:.1f} s")
        share = advanced / 4
        if any(abs(b - a - share) > share / 2 + 1 for a, b in pairwise(marks)):
            return Rate(None, "rate unsteady over the window")
        return Rate(advanced / span, None)


Operator = tuple[Location, list[Location], list[Location]]
"""An operator: a location standing for it (its input 0), its input locations, its output locations."""


def _inputs(tenant: Tenant) -> list[Operator]:
    """Every operator with inputs (scope nodes included, boundaries not), root first."""
    hosting = tenant.hosting
    if hosting is None:
        return [(Location.target(n.id, 0), [Location.target(n.id, p) for p in range(n.inputs)],
                 [Location.source(n.id, p) for p in range(n.outputs)]) for n in tenant.graph.nodes if n.inputs > 0]
    found = []
    for path, scope in sorted(hosting.nested.scopes.items(), key=lambda item: (len(item[0]), item[0])):
        for node in scope.graph.nodes:
            if node.inputs > 0 and not (path and node.id == 0):
                ports = [hosting.flat(ScopedLocation(path, node.id, p, "target")) for p in range(node.inputs)]
                outputs = [hosting.flat(ScopedLocation(path, node.id, p, "source")) for p in range(node.outputs)]
                found.append((ports[0], ports, outputs))
    return found


def operator_epoch(inputs: Iterable[Iterable[int]], outputs: Iterable[Iterable[int]]) -> int | None:
    """An operator's epoch from its input frontiers' epochs (their times' first coordinates),
    else (all empty) its output frontiers' (see the module docstring); ``None``: done.

    >>> operator_epoch([[5], []], [[2]]), operator_epoch([[], []], [[2], [3]])
    (5, 2)
    >>> operator_epoch([[]], [[]]) is None
    True
    """
    received = min((epoch for frontier in inputs for epoch in frontier), default=None)
    if received is not None:
        return received
    return min((epoch for frontier in outputs for epoch in frontier), default=None)


def _graphs(tenant: Tenant) -> list[Graph]:
    hosting = tenant.hosting
    return [tenant.graph] if hosting is None else [scope.graph for scope in hosting.nested.scopes.values()]


def advances_epochs(graphs: Iterable[Graph]) -> bool:
    """Whether some summary advances the first coordinate (a loop at the root): closing the
    inputs then bounds no epoch."""
    return any(step.summary[0] > 0 for graph in graphs for step in graph.transitions())


Entry = tuple[int, float, str]
"""A published version: ``(version, applied at, its changes' JSON)``."""


class Estimator:
    """The epochs of one dataflow's operators over the last window (see the module docstring).
    Made and fed on the event loop's reads (:func:`estimate`), folded in a worker thread."""

    def __init__(self, tenant: Tenant) -> None:
        self.tenant = tenant
        self.operators = _inputs(tenant)
        self.of_port = {loc: i for i, (_, ins, outs) in enumerate(self.operators) for loc in (*ins, *outs)}
        self.epochs: dict[Location, Counter[int]] = {}
        """Each operator port's frontier as the multiset of its times' first coordinates."""
        self.steps: list[Steps] = []
        self.version = -1
        self.observed_from = 0.0
        self.open_ended = advances_epochs(_graphs(tenant))
        self.lock = threading.Lock()

    def _epoch(self, index: int) -> int | None:
        _, inputs, outputs = self.operators[index]
        return operator_epoch((self.epochs[loc] for loc in inputs), (self.epochs[loc] for loc in outputs))

    def _fold(self, entry: Entry, sign: int, at: float | None) -> None:
        """Apply (``sign`` 1) or undo (-1) one version at the operators' ports; with ``at``,
        record the operators whose epoch changed."""
        location_of = self.tenant.publication.location
        touched = set()
        for change in json.loads(entry[2]):
            location = location_of(change["location"])
            if location not in self.of_port:
                continue
            counter = self.epochs[location]
            counter[change["time"][0]] += sign * change["diff"]
            if counter[change["time"][0]] <= 0:
                del counter[change["time"][0]]
            touched.add(self.of_port[location])
        if at is not None:
            for index in touched:
                self.steps[index].moved(at, self._epoch(index))

    def start(self, frontier: Callable[[Location], list[Timestamp]], window: list[Entry], observed_from: float,
              version: int) -> None:
        """Begin from the frontier at ``version`` and the versions of the last window before it."""
        self.epochs = {loc: Counter(t[0] for t in frontier(loc)) for loc in self.of_port}
        for entry in reversed(window):
            self._fold(entry, -1, None)
        self.steps = [Steps(self._epoch(i)) for i in range(len(self.operators))]
        for entry in window:
            self._fold(entry, 1, entry[1])
        self.version, self.observed_from = version, observed_from

    def advance(self, entries: list[Entry]) -> None:
        """Fold the versions published since the last call."""
        for entry in entries:
            if entry[0] > self.version:
                self._fold(entry, 1, entry[1])
                self.version = entry[0]

    def report(self, now: float, version: int, frontier: Callable[[Location], list[Timestamp]],
               last_epoch: int | None, source: str | None) -> dict[str, Any]:
        """The ``progress-estimate`` body as of ``version``, whose frontier ``frontier`` reads
        (the epochs are read there; the rates over the versions folded so far, which a
        concurrent call may have taken a little past ``version``)."""
        since = max(self.observed_from, now - WINDOW_SECONDS)
        names = names_of(self.tenant)
        rows = []
        for (where, inputs, outputs), steps in zip(self.operators, self.steps, strict=True):
            steps.forget_before(since)
            epoch = operator_epoch(([t[0] for t in frontier(loc)] for loc in inputs),
                                   ([t[0] for t in frontier(loc)] for loc in outputs))
            rate = Rate(None, "done") if epoch is None else steps.rate(since, now)
            eta = None
            reason = rate.reason
            if epoch is None:
                state = "done"
            elif rate.epochs_per_second is None or rate.epochs_per_second == 0:
                state = "unknown"
            else:
                state = "estimated"
                if last_epoch is None:
                    reason = "no last epoch: declare last_epoch at registration, or close the inputs"
                else:
                    eta = round(max(last_epoch + 1 - epoch, 0) / rate.epochs_per_second, 3)
            location = names.json(where)
            rows.append({**{k: v for k, v in location.items() if k in ("scope", "node")},
                         "operator": names.operator(where), "epoch": epoch, "state": state,
                         "epochs_per_second": None if rate.epochs_per_second is None
                         else round(rate.epochs_per_second, 3), "eta_seconds": eta, "reason": reason})
        return {"version": version, "at": round(now, 3), "window_seconds": round(now - since, 3),
                "last_epoch": last_epoch, "last_epoch_source": source, "operators": rows}


_ESTIMATORS: weakref.WeakKeyDictionary[Tenant, Estimator] = weakref.WeakKeyDictionary()


def _last_epoch(tenant: Tenant, open_ended: bool, frontier: Callable[[Location], list[Timestamp]]
                ) -> tuple[int | None, str | None]:
    """The declared last epoch, else the latest live one once every input is closed (and no
    summary advances epochs), else ``None``; with where it comes from."""
    declared = tenant.registration.last_epoch
    if declared is not None:
        return declared, "declared"
    if open_ended:
        return None, None
    graph = tenant.graph
    inputs = [n for n in graph.nodes if n.inputs == 0 and not (tenant.hosting is not None and _is_scope(tenant, n.id))]
    if not inputs or any(frontier(Location.source(n.id, p)) for n in inputs for p in range(n.outputs)):
        return None, None
    live = [t[0] for (_, t), count in tenant.counts().items() if count > 0]
    return (max(live), "inputs closed") if live else (None, None)


def _is_scope(tenant: Tenant, node: int) -> bool:
    hosting = tenant.hosting
    return hosting is not None and (node,) in hosting.nested.scopes


def _prepare(tenant: Tenant, now: float) -> tuple[Estimator, Callable[[], dict[str, Any]]]:
    """The dataflow's estimator and a builder of its report: what they need is read now (on the
    event loop: the versions published since the last call, as strings), the rest is done by
    the builder (call it in a worker thread)."""
    publication = tenant.publication
    version, frontier = publication.frontier_reader()
    estimator = _ESTIMATORS.get(tenant)
    entries = None if estimator is None else publication.stamped_changes_since(estimator.version)
    window: list[Entry] = []
    observed = now
    if estimator is None or entries is None:  # new, or the history moved past it: start over
        estimator = _ESTIMATORS[tenant] = Estimator(tenant)
        entries = None
        window = [(v, at, publication.text(v, text))
                  for (v, _, text), at in zip(publication.history, publication.history_at, strict=True)
                  if at >= now - WINDOW_SECONDS]
        if len(window) < len(publication.history):  # the state at the window's start is known
            observed = now - WINDOW_SECONDS
        elif publication.history_floor == 0:  # every version since the registration is there
            observed = tenant.ages.created
        elif window:  # a restart's history: known from its first version on
            observed = window[0][1]
    last = _last_epoch(tenant, estimator.open_ended, frontier)
    chosen = estimator

    def build() -> dict[str, Any]:
        with chosen.lock:
            if entries is None:
                chosen.start(frontier, window, observed, version)
            else:
                chosen.advance(entries)
            return chosen.report(now, version, frontier, *last)

    return chosen, build


def estimate(tenant: Tenant, now: float) -> Callable[[], dict[str, Any]]:
    """The ``GET .../progress-estimate`` body, as of the published version: read now (on the
    event loop), built by what is returned (call it in a worker thread)."""
    return _prepare(tenant, now)[1]


def operator_rates(tenant: Tenant, now: float) -> Callable[[], list[tuple[str, float | None, float | None]]]:
    """``(operator, epochs per second, expected seconds to done or None)`` of every operator
    whose rate is known and not 0, for ``/metrics``: read now, built by what is returned (in a
    worker thread)."""
    estimator, build = _prepare(tenant, now)

    def rows() -> list[tuple[str, float | None, float | None]]:
        names = names_of(tenant)
        report = build()
        return [(names.qualified(where), row["epochs_per_second"], row["eta_seconds"])
                for (where, _, _), row in zip(estimator.operators, report["operators"], strict=True)
                if row["state"] == "estimated"]

    return rows
