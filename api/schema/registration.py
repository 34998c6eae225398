"""Registration of a dataflow graph: the checks a normalised request (:mod:`api.schema.spec`) must pass.

Guarantees: :func:`build_graph` accepts exactly the graphs the tracker can serve: well formed
(:meth:`tracker.graph.Graph.build`), with at least one port, positive initial counts, no cycle
of edges and zero-summary connections (every cycle must strictly advance timestamps, as
progress tracking in timely dataflow requires), and summary antichains narrow enough that one
pointstamp cannot stall the service; anything else raises :class:`RegistrationError` carrying the exact 422 body.

>>> from api.schema.models import RegisterRequest
>>> from api.schema.spec import registration_record
>>> request = RegisterRequest.model_validate({"name": "loop", "nodes": [
...     {"id": 0, "inputs": 1, "outputs": 1}], "edges": [
...     {"source": {"node": 0, "port": 0}, "target": {"node": 0, "port": 0}}]})
>>> try:
...     build_graph(registration_record(request))
... except RegistrationError as error:
...     print(error.body["error"], error.body["cycle"][0]["summary"])
non_incrementing_cycle [0]
"""

from __future__ import annotations

import multiprocessing
import threading
from collections import OrderedDict
from typing import Any

import msgspec

from api.schema.models import location_json
from api.schema.spec import InitialRow, Spec
from tracker.bounds import summary_bound
from tracker.graph import (
    MAX_LOCATIONS,
    MAX_TRANSITIONS,
    Connection,
    Edge,
    Graph,
    GraphError,
    Location,
    Node,
    Update,
)
from tracker.scope import NestedGraph, NonIncrementingCycle, ScopedLocation, ScopedUpdate
from tracker.structure import SUMMARY_COST_BASE, branching_locations, find_cycles, widest_summaries
from tracker.timestamp import PathSummary

MAX_SUMMARY_ANTICHAIN = 64
"""At most this many incomparable minimal summaries between two locations (only arity 2 and
more can have several): each is one more frontier element per pointstamp, and graphs whose
antichains grow combinatorially would stall the event loop on a single small batch. Wide
antichains along many locations are refused earlier, by their cost
(:func:`tracker.structure.widest_summaries`)."""
SUMMARY_CHECK_STEPS = 1_000_000
"""Every graph is judged first by a cheap bound on its antichains' widths
(:func:`tracker.bounds.summary_bound`, linear): within the limits, it is accepted at once, whatever
its size. Otherwise the exact check searches from each branching location, settling at most
this many summaries in all (about 2.3 us each in the worst case: ~2.5 s, off the event loop),
and stops at the first antichain over the limit; a graph it cannot finish within them is
refused with the bound's figures (before, such a graph went unchecked, and a chain of 400
diamonds then took 8.9 s per batch)."""


class RegistrationError(Exception):
    """A graph the service refuses; ``body`` is the 422 answer."""

    def __init__(self, body: dict[str, Any]) -> None:
        super().__init__(body.get("detail") or body.get("error"))
        self.body = body


BATCH_SECONDS = 0.001
"""The most one pointstamp may cost the compiled engine (CPU seconds, measured by
:func:`compiled_cost`): a batch moving a capability (two pointstamps) then holds the event loop
about 2 ms, what another tenant's batches cost already (a chain of 44 diamonds of ``[1, 0]`` and
``[0, 1]`` is accepted, 0.56 ms per pointstamp; 48 are at the limit, 0.7-1.1 ms as the machine
is busy). The reference engine's budget is :data:`tracker.structure.SUMMARY_COST_BASE`, about 25 ms."""
TRIAL_SECONDS = 5.0
"""How long the compiled engine's trial of a graph (:func:`compiled_cost`) may take in all."""


def compiled_cost(graph: Graph) -> tuple[float, int] | None:
    """The compiled engine's cost of one pointstamp at any branching location of ``graph``
    (:func:`tracker.compiled.pointstamp_cost`: the slowest batch in CPU seconds, the widest frontier),
    measured in a separate process so that a graph whose antichains explode cannot stall or
    exhaust the service: ``None`` if the trial did not finish within :data:`TRIAL_SECONDS`."""
    context = multiprocessing.get_context("spawn")
    receiver, sender = context.Pipe(duplex=False)
    process = context.Process(target=_trial, args=(sender, graph), daemon=True)
    process.start()
    sender.close()
    try:
        if receiver.poll(TRIAL_SECONDS):
            result: tuple[float, int] = receiver.recv()
            return result
        return None
    except EOFError:  # the trial died (out of memory, say)
        return None
    finally:
        if process.is_alive():
            process.kill()
        process.join()
        receiver.close()


def _trial(sender: Any, graph: Graph) -> None:
    from tracker.compiled import pointstamp_cost

    sender.send(pointstamp_cost(graph, branching_locations(graph)))


SHAPES_KEPT = 16
"""Graph shapes (arity, nodes, edges as registered) whose checked :class:`Graph` is kept."""
_SHAPES: OrderedDict[bytes, tuple[Graph, set[bool]]] = OrderedDict()
_SHAPES_LOCK = threading.Lock()
_SHAPE_ENCODER = msgspec.json.Encoder()


def build_graph(record: Spec, *, new: bool = True, compiled: bool = False) -> tuple[Graph, list[Update]]:
    """Validate a registration: the graph, its cycles, its initial pointstamps.

    Pure CPU: run it off the event loop. The same shape registered again (one program run as
    many dataflows; a restart recovering them) shares one immutable :class:`Graph`, checked
    once: a ring of 100 operators took ~9 ms to build and check, most of a restart's time per
    dataflow, and its objects ~60 KB per dataflow.

    >>> from api.schema.models import RegisterRequest
    >>> from api.schema.spec import registration_record
    >>> spec = registration_record(RegisterRequest(name="x", timestamp_arity=1, nodes=[
    ...     {"id": 0, "inputs": 0, "outputs": 1}, {"id": 1, "inputs": 1, "outputs": 0}],
    ...     edges=[{"source": {"node": 0, "port": 0}, "target": {"node": 1, "port": 0}}]))
    >>> build_graph(spec)[0] is build_graph(spec, new=False)[0]
    True

    Args:
        record: the normalised registration.
        new: ``False`` (recovery) skips the summary-antichain check, so that a dataflow
            accepted before the check existed stays registered.
        compiled: the compiled engine will track the graph (``--engine native``): a graph
            over the reference's antichain cost budget (but with no antichain over
            :data:`MAX_SUMMARY_ANTICHAIN` on the way) is accepted if the compiled engine's
            measured cost (:func:`compiled_cost`) is under :data:`BATCH_SECONDS` per pointstamp
            (:func:`check_summaries`).

    Returns:
        The graph and its initial pointstamps (Naiad's input-vertex rule if none were named).

    Raises:
        RegistrationError: with the exact 422 body.
    """
    key = _SHAPE_ENCODER.encode((record.arity, record.nodes, record.edges))
    with _SHAPES_LOCK:
        known = _SHAPES.get(key)
        if known is not None:
            _SHAPES.move_to_end(key)
    if known is None:
        known = (_checked_graph(record), set())
        with _SHAPES_LOCK:
            _SHAPES[key] = known
            if len(_SHAPES) > SHAPES_KEPT:
                _SHAPES.popitem(last=False)
    graph, summaries_checked = known
    if new and compiled not in summaries_checked:
        check_summaries(graph, compiled=compiled)
        summaries_checked.add(compiled)
    if record.initial:
        if new:
            _positive_initial(record.initial)
        try:
            initial = graph.check_updates((Location(n, p, k), t, d) for n, p, k, t, d in record.initial)
        except GraphError as error:
            raise RegistrationError({"error": "invalid_graph", "detail": f"initial pointstamps: {error}"}) from None
    else:
        initial = graph.default_initial()
    return graph, initial


def _checked_graph(record: Spec) -> Graph:
    """``record``'s graph, validated and free of non-incrementing cycles (else the 422)."""
    arity = record.arity
    nodes = [
        Node(n["id"], n["inputs"], n["outputs"], n.get("name", ""),
             None if n.get("connections") is None else tuple(
                 Connection(c["input"], c["output"], tuple(PathSummary(tuple(s)) for s in c["summaries"]))
                 for c in n["connections"]))
        for n in record.nodes
    ]
    edges = [Edge(Location.source(e["source"]["node"], e["source"]["port"]),
                  Location.target(e["target"]["node"], e["target"]["port"])) for e in record.edges]
    try:
        graph = Graph.build(arity, nodes, edges)
    except GraphError as error:
        raise RegistrationError({"error": "invalid_graph", "detail": str(error)}) from None
    if not graph.locations():
        raise RegistrationError({"error": "invalid_graph", "detail": "the graph has no operator ports"})
    cycles = find_cycles(graph)
    if cycles:
        raise RegistrationError({
            "error": "non_incrementing_cycle",
            "detail": "every cycle must strictly advance timestamps; these transitions lie on a cycle of edges "
                      "and zero-summary connections: " + ", ".join(map(str, cycles)),
            "cycle": [{"from": location_json(t.src), "to": location_json(t.dst), "summary": list(t.summary)}
                      for t in cycles],
        })
    return graph


def check_summaries(graph: Graph, *, compiled: bool = False, where: str = "") -> None:
    """Refuse a graph whose path summaries would make one pointstamp too costly to track
    (``where``: the scope, for the message). First the cheap bound
    (:func:`tracker.bounds.summary_bound`): within the limits, accepted whatever the graph's
    size. Else the exact search, within :data:`SUMMARY_CHECK_STEPS`: for an antichain over
    :data:`MAX_SUMMARY_ANTICHAIN` (refused), then, for the compiled engine, a measured trial
    (:func:`compiled_cost`, at most :data:`BATCH_SECONDS` per pointstamp), for the reference
    engine, the cost budget :data:`tracker.structure.SUMMARY_COST_BASE`.

    Raises:
        RegistrationError: with the 422 body, what refused it in ``detail``.
    """
    bound = summary_bound(graph)
    advice = ("merge the parallel summaries (connections with several summaries, or paths with different ones) "
              "into fewer")
    if bound.widest > MAX_SUMMARY_ANTICHAIN:  # the bound may over-estimate: look for the antichain itself
        wide = widest_summaries(graph, MAX_SUMMARY_ANTICHAIN, cost_base=2**62, steps=SUMMARY_CHECK_STEPS)
        if wide is not None and wide.exhausted:
            raise RegistrationError({"error": "invalid_graph", "detail": (
                f"{where}the path summaries cannot be checked within {SUMMARY_CHECK_STEPS:,} steps, and their "
                f"estimate is too high: up to {bound.widest} incomparable minimal path summaries may lead to "
                f"{bound.at} (the service tracks at most {MAX_SUMMARY_ANTICHAIN}), and one pointstamp could put up "
                f"to {bound.entries:,} times in frontiers; {advice}")})
        if wide is not None:
            raise RegistrationError({"error": "invalid_graph", "detail": (
                f"{where}more than {MAX_SUMMARY_ANTICHAIN} incomparable minimal path summaries ({wide.size}) lead "
                f"from {wide.origin} to {wide.dest}: one time at {wide.origin} would put that many times in the "
                f"frontier at {wide.dest} (the estimate: up to {bound.widest} at {bound.at}), and tracking it would "
                f"stall the service; {advice}")})
    if bound.cost <= SUMMARY_COST_BASE:
        return
    if compiled:
        measured = compiled_cost(graph)
        if measured is not None and measured[0] <= BATCH_SECONDS:
            return
        cost = "more than 5 s" if measured is None else f"{measured[0] * 1e3:.1f} ms"
        raise RegistrationError({"error": "invalid_graph", "detail": (
            f"{where}too many incomparable minimal path summaries fan out (up to {bound.widest}, at {bound.at}): one "
            f"pointstamp costs the compiled engine {cost} of CPU per batch (the limit is "
            f"{BATCH_SECONDS * 1e3:.1f} ms), which would hold every other dataflow's requests as long; {advice}")})
    costly = widest_summaries(graph, MAX_SUMMARY_ANTICHAIN, steps=SUMMARY_CHECK_STEPS)
    if costly is not None and costly.exhausted:
        raise RegistrationError({"error": "invalid_graph", "detail": (
            f"{where}the path summaries cannot be checked within {SUMMARY_CHECK_STEPS:,} steps, and their estimated "
            f"cost is too high: up to {bound.widest} incomparable minimal path summaries at {bound.at}, about "
            f"{bound.cost // 2000} ms per batch or more; {advice}")})
    if costly is not None:
        raise RegistrationError({"error": "invalid_graph", "detail": (
            f"{where}too many incomparable minimal path summaries fan out from {costly.origin} (already "
            f"{costly.size} to {costly.dest}): the antichains multiply along the way, and one time at "
            f"{costly.origin} would cost the tracker about {costly.cost // 2000} ms or more per batch, "
            f"stalling the service; {advice}")})


def _positive_initial(rows: list[InitialRow]) -> None:
    """Refuse an initial pointstamp whose count is not positive: it must hold something (a
    capability or a message) at start. Only new registrations: recovery keeps what was accepted."""
    for index, (node, port, kind, time, delta) in enumerate(rows):
        if delta <= 0:
            raise RegistrationError({"error": "invalid_graph", "detail": (
                f"initial pointstamps: update {index}: delta {delta} at {Location(node, port, kind)} time "
                f"{list(time)} must be positive (an initial pointstamp is a capability or a message held at "
                "the start)")})


# -- nested scopes -------------------------------------------------------------------------------


def is_nested(record: Spec) -> bool:
    """True iff some node of the registration is a scope (then :func:`build_nested` checks it)."""
    return any("scope" in node for node in record.nodes)


def _lost_scopes(nested: NestedGraph, initial: list[InitialRow]) -> list[list[int]]:
    """The scope of each initial pointstamp of a registration logged without them: releases
    before this one dropped ``initial_scopes`` from the log, so that a dataflow with initial
    pointstamps inside a nested scope could not be recovered. A pointstamp the root can hold
    stays at the root (as those releases served it); any other goes to the one scope that can
    hold it. None or several: the root, and :meth:`~tracker.scope.NestedGraph.check_updates`
    then names the problem.

    >>> body = {"nodes": [{"id": 0, "inputs": 0, "outputs": 1}, {"id": 1, "inputs": 1, "outputs": 1, "scope": {
    ...     "kind": "iterative", "nodes": [{"id": 1, "inputs": 1, "outputs": 1}],
    ...     "edges": [{"source": {"node": 0, "port": 0}, "target": {"node": 1, "port": 0}},
    ...               {"source": {"node": 1, "port": 0}, "target": {"node": 0, "port": 0}}]}}], "edges": []}
    >>> _lost_scopes(NestedGraph.from_json(1, body), [(0, 0, "source", (0,), 1), (1, 0, "source", (0, 0), 1)])
    [[], [1]]
    """
    def holds(path: tuple[int, ...], row: InitialRow) -> bool:
        node, port, kind, time, delta = row
        try:
            nested.check_updates([(ScopedLocation(path, node, port, kind), time, delta)])
        except GraphError:
            return False
        return True

    scopes: list[list[int]] = []
    for row in initial:
        inner = [] if holds((), row) else [path for path in nested.scopes if path and holds(path, row)]
        scopes.append(list(inner[0]) if len(inner) == 1 else [])
    return scopes


def build_nested(record: Spec, *, new: bool = True) -> tuple[NestedGraph, list[ScopedUpdate]]:
    """:func:`build_graph` for a dataflow with nested scopes: every scope validated bottom-up
    (:meth:`tracker.scope.NestedGraph.build`), cycles checked per scope, summary antichains per
    scope, sizes over all scopes together, and the initial pointstamps (absent: each output of
    each root node with no inputs that is not a scope holds one capability at time zero).

    Raises:
        RegistrationError: with the exact 422 body; errors name the scope path.
    """
    try:
        nested = NestedGraph.from_json(record.arity, {"nodes": record.nodes, "edges": record.edges})
    except NonIncrementingCycle as cycle:
        scope = list(cycle.path)
        raise RegistrationError({
            "error": "non_incrementing_cycle",
            "detail": f"every cycle must strictly advance timestamps; in {_where(cycle.path)} these transitions lie on "
                      "a cycle of edges and zero-summary connections (scope nodes carrying their computed "
                      "summaries): " + ", ".join(f"{scope}{t}" for t in cycle.transitions),
            "cycle": [{"from": scoped_json(cycle.path, t.src), "to": scoped_json(cycle.path, t.dst),
                       "summary": list(t.summary)} for t in cycle.transitions],
        }) from None
    except GraphError as error:
        raise RegistrationError({"error": "invalid_graph", "detail": str(error)}) from None
    graphs = [(path, scope.graph) for path, scope in nested.scopes.items()]
    ports = sum(len(g.locations()) for _, g in graphs)
    steps = sum(len(g.transitions()) for _, g in graphs)
    if ports > MAX_LOCATIONS or steps > MAX_TRANSITIONS:
        raise RegistrationError({"error": "invalid_graph", "detail": (
            f"the dataflow has {ports} ports and {steps} transitions over all its scopes; the limits are "
            f"{MAX_LOCATIONS} and {MAX_TRANSITIONS}")})
    if not nested.root.graph.locations():
        raise RegistrationError({"error": "invalid_graph", "detail": "the graph has no operator ports"})
    if new:
        for path, graph in graphs:
            check_summaries(graph, where=f"{_where(path)}: ")
    if record.initial:
        if new:
            _positive_initial(record.initial)
        try:
            scopes = record.initial_scopes or (
                [[] for _ in record.initial] if new else _lost_scopes(nested, record.initial))
            initial = nested.check_updates([(ScopedLocation(tuple(scope), n, p, k), t, d)
                                            for scope, (n, p, k, t, d) in zip(scopes, record.initial, strict=True)])
        except GraphError as error:
            raise RegistrationError({"error": "invalid_graph", "detail": f"initial pointstamps: {error}"}) from None
    else:
        root = nested.root
        zero = (0,) * root.arity
        initial = [(ScopedLocation((), node.id, port, "source"), zero, 1) for node in root.graph.nodes
                   if node.inputs == 0 and node.id not in root.children for port in range(node.outputs)]
    return nested, initial


def _where(path: tuple[int, ...]) -> str:
    return f"scope {list(path)}" if path else "the root scope"


def scoped_json(path: tuple[int, ...], location: Location) -> dict[str, Any]:
    """A location of scope ``path`` as JSON (``scope`` only when not the root)."""
    body = location_json(location)
    return {"scope": list(path), **body} if path else body

