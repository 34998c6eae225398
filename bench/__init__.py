"""Benchmarks: every performance figure of the project. ``python -m bench`` lists them.

Each benchmark measures its figures and the baseline it is compared with in the same run, on
the same machine, and checks the answers it times (``native``, ``recovery``, ``restart``, ``service``,
``tenants`` and ``workers`` raise on a wrong answer; ``spark`` reports its equality checks as
figures, ``chaos`` what held under faults). Importing a module here starts nothing heavy; ``run`` does.

>>> from bench.__main__ import available
>>> sorted(available())  # doctest: +NORMALIZE_WHITESPACE
['ages', 'chaos', 'isolation', 'limits', 'native', 'recovery', 'replicated_log', 'restart', 'scopes', 'service',
 'shards', 'spark', 'tenants', 'timely', 'timely_stats', 'workers']
>>> available()["native"]
'native: the incremental tracker against a from-scratch recompute, and the compiled engine against it.'
"""
