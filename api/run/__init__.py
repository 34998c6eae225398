"""Running the service: ``tracker serve`` and ``tracker shard`` as supervisors of processes by
role (:mod:`api.run.supervisor`), what they run (:mod:`api.run.topology`: shards, the front, the
proxy), the hot-path process (:mod:`api.run.hot`: uvicorn serving the app), the front's process
(:mod:`api.run.front`), structured logging, the admin token, the warehouse's and the shards'
locks, the commands it registers, and the service in a subprocess for tests and benchmarks.

Guarantees: one ``tracker serve`` at a time serves a warehouse and one process at a time each
shard; a bad setting is refused at start-up in one line; nothing of the service outlives its
supervisor.

May import: api.config, api.logs, api.channel, api.host, api.ops, api.sql, api.shards, api.web, tracker,
spark_jobs, uvicorn.
"""
