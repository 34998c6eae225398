"""The Spark process (:mod:`api.spark.process`, started by ``tracker serve``'s supervisor): its
session and the one thread its jobs run on, turns served fairly, registration checks (Spark's
``Psi`` written to the ``summaries`` table from here), audits against the frontier a hot-path
process sent, and the micro-batches of ``--engine spark``, for any number of hot-path
processes connected over the channel (:mod:`api.channel`).

Guarantees: Spark never runs in a hot-path process (nothing of the hot path imports this
package); a job's time is bounded; the process runs at a lower CPU priority on a bounded
number of cores; the service works without it and says so.

May import: api.config, api.logs, api.channel, api.schema, api.delta, tracker, spark_jobs, pyspark.
"""
