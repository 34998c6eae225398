"""The Delta tables as the service writes them (delta-rs): durable batches to ``progress``,
published changes and states to the other tables, compaction, graph tables, tidying, and the
retirement of log segments Delta holds.

Guarantees: every durable batch reaches ``progress`` exactly once, in version order; each
write is one Delta commit; all Delta I/O runs on the one Delta thread, never on the event loop.

May import: api.schema, api.live, api.durability, api.streams, api.metrics, tracker, spark_jobs.
"""
