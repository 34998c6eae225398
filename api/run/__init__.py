"""Running the service: ``tracker serve`` as a supervisor of processes by role
(:mod:`api.run.supervisor`), the hot-path process (:mod:`api.run.hot`: uvicorn serving the app),
structured logging, the admin token, the warehouse lock, the commands it registers, and the
service in a subprocess for tests and benchmarks.

Guarantees: one process at a time serves a warehouse; a bad setting is refused at start-up in
one line; nothing of the service outlives its supervisor.

May import: api.config, api.logs, api.channel, api.host, api.ops, api.web, tracker, spark_jobs, uvicorn.
"""
