"""The dataflows this service hosts: the tenant (one dataflow and the owner of each part of
its state), the ingest use case of a progress batch, registration, deletion and recovery (the
:class:`~api.host.service.Service`), and the tokens.

Guarantees: a batch is answered only once durable and published only once durable; recovery
applies every acknowledged batch exactly once, or refuses that dataflow alone.

May import: api.config, api.metrics, api.schema, api.live, api.durability, api.streams,
api.delta, api.channel, api.background, api.shards, tracker.
"""
