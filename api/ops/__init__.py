"""Operating the service: lag and blame per location, ``frontier/explain`` (which pointstamps
hold a frontier back, along which path), progress estimates, the dashboard's frames (every
panel at one version), what a ``/metrics`` scrape reads, ``tracker watch``, the terminal view,
and ``tracker plan``, capacity planning from the benchmarks' per-unit costs.

Guarantees: each answer reads one published version of one dataflow; the heavy part of an
answer is built from copies, off the event loop.

May import: api.config, api.metrics, api.schema, api.host, api.shards, tracker.
"""
