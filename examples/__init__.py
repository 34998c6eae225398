"""Runnable timely dataflow examples on the worker SDK (``tracker example NAME``).

Each module offers the same small surface, used by :mod:`tracker.worker.cluster` and the tests:
``DEFAULTS`` (config), ``build(config) -> Dataflow``, ``async drive(worker, config)`` (feeds
this worker's share of the input), ``collect(worker) -> rows``, ``reference(config) -> rows``
(a plain sequential computation of the same thing) and ``render(rows) -> lines``.
"""
