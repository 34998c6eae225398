"""Publication of each dataflow's frontier: the published frontier, its history, its
subscribers (bounded queues, resynchronisation, SSE), fan-out in slices, and rewinds to a
past version.

Guarantees: only durable versions are published, in version order; every subscriber is
offered every published version's changes exactly once, and the publisher never waits for one.

May import: tracker.
"""
