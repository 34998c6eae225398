"""The channel between the service's processes: typed messages (:mod:`api.channel.messages`),
length-prefixed frames over a local socket with an asyncio client that reconnects and a bounded
outbox (:mod:`api.channel.link`), and what every supervised child does for its supervisor
(:mod:`api.channel.supervised`: readiness, heartbeats, a one-line reason when it cannot boot,
exiting when its parent dies).

Guarantees: a frame holds exactly one message, decoded to its type or refused (the connection
is then closed); the client never blocks its caller: :meth:`~api.channel.link.Client.offer`
answers at once whether a message was queued, and work it did not queue stays with the caller,
to be sent again when the link is back (on every connect the caller's ``on_connect`` replays
what the other side must know first). Imported by both sides: nothing here imports pyspark.

May import: api.schema, tracker.
"""
