"""The hot path's side of the background work: what each dataflow asks of the Spark process
(its registration check, audits, ``--engine spark`` micro-batches), sent over the channel
(:mod:`api.channel`), and the answers landing in each dataflow's
:class:`~api.background.state.SparkState`.

Guarantees: nothing here waits for the Spark process on the request path: work is offered to
the channel without waiting, and work the channel did not take (the link is down, or its
outbox full) stays pending and is sent again on the next connect, after the desired state (the
graphs Spark must know); audits are skipped while one is outstanding and run again at their
next period. Nothing here imports pyspark.

May import: api.config, api.metrics, api.schema, api.live, api.streams, api.channel, tracker.
"""
