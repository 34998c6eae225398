"""Shards: a dataflow's shard (written in its id, so placement needs no map), the shards of a
service and where each is reached, the per-shard layout of the warehouse (a write-ahead log
and a lock each), the proxy's configuration (HAProxy), and the merging of the shards' answers
that the front serves (lists, ``/metrics``, ``/healthz``).

Guarantees: a dataflow's shard is fixed at registration and readable from its id alone, for
ever (ids from before shards, 32 hex digits, are shard 0's); the proxy's configuration sends a
dataflow's routes to its shard only (a shard that is down answers 503 ``shard_unavailable``,
never another shard's answer); nothing here performs I/O on the hot path.

May import: tracker, spark_jobs.
"""
