"""SQL over the live state and the history: ``POST /v1/sql`` and ``tracker sql`` run one
read-only SELECT in DuckDB, in a SQL process (:mod:`api.sql.process`), over views of what the
service holds now (frontiers, pointstamps, lag and blame, states: :mod:`api.sql.live`, the lag
computed from the compiled engine's columns by Arrow's kernels: :mod:`api.sql.columns`) and of
the Delta tables, read through delta-rs's Arrow datasets (:mod:`api.sql.history`), with a time, row and memory limit
(:mod:`api.sql.engine`). ``tracker sql`` is the client (:mod:`api.sql.cli`).

Guarantees: the query never runs in the hot path (the live state is copied on the event loop,
its rows built in a worker thread, the query run in a SQL process below the service's priority,
whose death fails that query alone); a dataflow token's query sees only its own
dataflow (every view is built filtered to it before the query text reaches DuckDB, and then
the connection can reach nothing else: no file, no Python object, no setting changed); a bad
query or a limit reached is a clear answer and changes nothing.

May import: api.config, api.schema, api.live, api.durability, api.streams, api.host, api.ops, tracker,
spark_jobs, duckdb.
"""
