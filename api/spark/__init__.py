"""The service's Spark tasks: the shared session and the one thread its jobs run on, turns
served fairly, registration checks, audits against the live frontier, and the micro-batches of
``--engine spark``.

Guarantees: Spark never runs on the event loop or on the request path; a job's time is
bounded; the service works without Spark and says so.

May import: api.schema, api.live, api.streams, api.delta, api.metrics, tracker, spark_jobs.
"""
