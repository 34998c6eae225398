"""One dataflow's state in memory: its frontier engine (compiled, reference, or counts only),
its versions and workers' positions, the ages of its pointstamps and frontiers, its durable
batches per second, its nested scopes' stand-in locations, and its lifecycle state.

Guarantees: batches of one worker apply in ``seq`` order exactly once, each applied batch gets
the next version, and nothing here awaits (the caller makes a batch atomic on the event loop).

May import: api.schema, tracker.
"""
