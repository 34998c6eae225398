"""Running the service: ``tracker serve`` (structured logging, the admin token, the warehouse
lock, uvicorn), the commands it registers, and the service in a subprocess for tests and
benchmarks.

Guarantees: one process at a time serves a warehouse; a bad setting is refused at start-up in
one line.

May import: api.config, api.host, api.ops, api.web, tracker, spark_jobs, uvicorn.
"""
