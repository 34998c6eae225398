"""Progress tracking for timely dataflow: the pure core (no Spark, no FastAPI) and the worker SDK.

The core computes, for every location of a dataflow graph, the frontier of times that may still
arrive there, exactly and incrementally (``docs/core.md`` states the semantics and invariants):
:mod:`tracker.timestamp` (times, path summaries), :mod:`tracker.antichain`,
:mod:`tracker.graph` (locations, operators, edges, validation), :mod:`tracker.structure`
(cycle check, ``Psi``), :mod:`tracker.reachability` (the incremental :class:`Tracker`) and
:mod:`tracker.oracle` (brute force, for tests). :mod:`tracker.worker` runs vertices against it;
:mod:`tracker.cli` is the ``tracker`` command.

>>> from tracker.graph import Edge, Graph, Location, Node
>>> from tracker.reachability import Tracker
>>> graph = Graph.build(1, [Node(0, 0, 1), Node(1, 1, 0)], [Edge(Location.source(0, 0), Location.target(1, 0))])
>>> tracker = Tracker(graph)
>>> _ = tracker.apply(graph.default_initial())
>>> tracker.frontier(Location.target(1, 0))
[(0,)]
"""
