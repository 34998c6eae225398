"""The service: it hosts dataflows, keeps their occurrence counts, maintains every location's
frontier exactly, makes every acknowledged batch durable, streams the changes and keeps the
Delta tables, with Spark checking and auditing beside it.

One package per role, lowest first; a package imports only packages below it (its docstring's
"May import" line says which, and ``tests/test_structure.py`` holds it to that):

========== ==========================================================================================
package    owns
========== ==========================================================================================
schema     the v1 bodies: pydantic models, the hot path's progress parser, registration bodies and
           the graph checks
live       one dataflow's state in memory: its frontier engine, versions, workers' positions,
           ages, batches per second, nested scopes, and its lifecycle state
durability the write-ahead log: typed records, segments, group commit, the fsync process, what
           recovery must find
streams    publication: the published frontier, its history, subscribers, fan-out, rewinds
delta      the Delta tables: flush, compaction, log retirement, graph tables, tidying
channel    the channel between processes: typed messages, frames, a reconnecting client, what
           a supervised child does (ready, heartbeat, dies with its parent)
background the hot path's side of Spark's work: checks, audits, micro-batches asked over the
           channel, their answers landing in each dataflow's state
spark      the Spark process: its session and thread, registration checks, audits, micro-batches
host       the hosted dataflows: the tenant, the ingest use case, registration, recovery, tokens
shards     a dataflow's shard (in its id), the shards' layout and logs, HAProxy's configuration, the
           front's merges of the shards' answers (lists, metrics, health)
ops        operating the service: lag and blame, explain, progress estimates, the dashboard's
           frames, the metrics' scrape, ``tracker watch``
sql        SQL over the live state and the Delta tables: the live views built from copies, the
           history views through delta-rs' Arrow datasets, DuckDB within limits, ``tracker sql``
web        the HTTP surface (the only FastAPI importer): the app, routes, WebSocket, bearer
           auth, limits, protocols, the dashboard
run        processes: ``tracker serve`` (the supervisor), the hot-path process, the commands, the
           service in a subprocess
========== ==========================================================================================

Shared by every package: :mod:`api.config` (settings), :mod:`api.metrics` (Prometheus) and
:mod:`api.logs` (JSON log lines).
A progress batch flows up: parsed (schema), ordered and applied (live), logged (durability),
published (streams), flushed (delta); requests come in at web and are served by host.
"""
