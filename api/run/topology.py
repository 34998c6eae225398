"""What a supervisor runs, decided before anything starts: the shards and where each listens,
whether a front and a proxy run, the sockets they are given and the locks they hold.

``tracker serve`` (:func:`serve_topology`):

* one shard here and none elsewhere (``--shards 1``, the default on a machine of up to three
  cores): the shard's hot-path process listens on the public address and serves everything
  (registration, lists, the dashboard): no front, no proxy, no hop;
* otherwise each shard here listens on its own port (``--shard-port`` and up, default
  ``--port`` + 101), a front (:mod:`api.run.front`) answers registration, the lists,
  ``/metrics``, ``/healthz`` and the dashboard's page, and HAProxy (if installed, and unless
  ``--proxy none``) listens on the public address and routes each dataflow's requests to its
  shard (:mod:`api.shards.haproxy`); without HAProxy the front takes the public address.

``tracker shard K`` (:func:`shard_topology`): shard ``K`` alone, on ``--host``/``--port``, for
a ``tracker serve`` elsewhere that lists it in ``--shard-hosts``.

Every socket is bound here, in the supervisor, so that a busy port stops the start in one line
before anything runs, and so that a shard's port keeps accepting connections while its process
is restarted. The supervisor holds ``<warehouse>/_owner.lock`` (one ``tracker serve`` per
warehouse; ``tracker shard`` does not take it); each shard's process inherits its shard's lock.
"""

from __future__ import annotations

import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from api.config import Settings
from api.run.server import StartupError, listen, prepare
from api.shards import haproxy
from api.shards.layout import Shard, default_shards, logged_shards, parse_shard_hosts, plan, url_of

HOT_MODULE = "api.run.hot"
FRONT_MODULE = "api.run.front"


@dataclass
class Process:
    """One child to start: its role (``hot``, ``front``, ``proxy``, ``spark``), command line,
    environment, the descriptors it inherits, and whether it speaks the supervisor's pipe
    protocol (``ready``, heartbeats; HAProxy does not)."""

    role: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    pass_fds: tuple[int, ...] = ()
    supervised: bool = True
    shard: int | None = None
    optional: bool = False
    """The service serves without it (the Spark process): it is restarted however often it dies
    or fails to start, with a capped backoff, and never stops the service nor delays its
    ``ready`` line; its state goes to :attr:`state_file`."""
    state_file: Path | None = None
    """Where the supervisor writes an optional child's state (:func:`api.run.supervisor.write_state`)."""


@dataclass
class Topology:
    """Everything :func:`serve_topology` or :func:`shard_topology` decided and holds."""

    shards: list[Shard]
    processes: list[Process]
    url: str
    """Where users reach the service (the public address), or the shard (``tracker shard``)."""
    announce: bool
    """Whether this is the public address (``<warehouse>/service-url``, the "ready at" line)."""
    notes: list[str]
    """One-line remarks for the terminal (HAProxy missing)."""
    held: list[Any]
    """Sockets and locks to keep open for the supervisor's lifetime."""


def _settings_env(settings: Settings, **changes: Any) -> str:
    from dataclasses import replace

    return replace(settings, **changes).to_json()


def _hot(settings: Settings, shard: Shard, listener: socket.socket, lock: Any, sharded: bool) -> Process:
    from api.run.hot import LISTEN_FD_ENV, SETTINGS_ENV

    fds = tuple(fd for fd in (listener.fileno(), lock.fileno()) if fd is not None)
    return Process("hot", [sys.executable, "-m", HOT_MODULE], {
        SETTINGS_ENV: _settings_env(settings, shard=shard.index, endpoint=shard.endpoint, sharded=sharded),
        LISTEN_FD_ENV: str(listener.fileno())}, fds, shard=shard.index)


def _shard_lock(settings: Settings, index: int, what: str) -> Any:
    from spark_jobs.ownership import WarehouseBusy, WarehouseLock

    try:
        return WarehouseLock.acquire(settings.warehouse, what, shard=index)
    except WarehouseBusy as busy:
        raise StartupError(f"shard {index}: {busy}; a shard is served by one process at a time") from None


def serve_topology(settings: Settings, runtime: Path) -> Topology:
    """``tracker serve``'s processes for ``settings``: every port bound first, then the
    warehouse taken (:func:`~api.run.server.prepare`: its lock is among :attr:`Topology.held`).
    Raises :class:`StartupError` with one line for a layout that cannot run."""
    try:
        remote = parse_shard_hosts(settings.shard_hosts)
    except ValueError as error:
        raise StartupError(str(error)) from None
    local = settings.shards if settings.shards is not None else default_shards()
    if local == 0 and not remote:
        raise StartupError("--shards 0 with no --shard-hosts: no shard would serve the dataflows")
    public = listen(settings.host, settings.port, settings.send_buffer)
    url = url_of(settings.host, settings.port)
    if local == 1 and not remote:  # one shard: it serves everything at the public address
        warehouse, _ = prepare(settings)
        shard = Shard(0, url_of(settings.advertise_host or settings.host, settings.port), True)
        lock = _shard_lock(settings, 0, f"tracker serve on port {settings.port}")
        _check_logs(settings, [shard])
        return Topology([shard], [_hot(settings, shard, public, lock, False)], url, True, [],
                        [public, warehouse, lock])
    first = settings.port + 101 if settings.shard_port is None else settings.shard_port
    listeners = [listen(settings.host, first + k if first else 0, settings.send_buffer) for k in range(local)]
    warehouse, _ = prepare(settings)
    shards = plan(local, remote, settings.advertise_host or settings.host,
                  [s.getsockname()[1] for s in listeners])
    _check_logs(settings, shards)
    locks = [_shard_lock(settings, k, f"tracker serve on port {settings.port}, shard {k}") for k in range(local)]
    processes = [_hot(settings, shards[k], listeners[k], locks[k], True) for k in range(local)]
    binary = haproxy.find() if settings.proxy == "auto" else None
    notes = []
    if binary is None:
        front_listener = public
        if settings.proxy == "auto":
            notes.append(f"haproxy is not installed (apt-get install haproxy): {url} is the front, which answers a "
                         "dataflow's routes with a redirect (307) to its shard; workers use each dataflow's endpoint")
    else:
        front_listener = listen("127.0.0.1", 0, settings.send_buffer)
        config = runtime / "haproxy.cfg"
        config.write_text(haproxy.config(f"fd@{public.fileno()}", ("127.0.0.1", front_listener.getsockname()[1]),
                                         shards))
        processes.append(Process("proxy", [binary, "-db", "-f", str(config)], pass_fds=(public.fileno(),),
                                 supervised=False))
    processes.append(_front(settings, shards, front_listener, proxied=binary is not None))
    return Topology(shards, processes, url, True, notes, [public, front_listener, *listeners, warehouse, *locks])


def _front(settings: Settings, shards: list[Shard], listener: socket.socket, proxied: bool) -> Process:
    import json

    from api.run.front import PROXIED_ENV, SHARDS_ENV
    from api.run.hot import LISTEN_FD_ENV, SETTINGS_ENV

    return Process("front", [sys.executable, "-m", FRONT_MODULE], {
        SETTINGS_ENV: _settings_env(settings, sharded=True),
        SHARDS_ENV: json.dumps([{"index": s.index, "endpoint": s.endpoint, "local": s.local} for s in shards]),
        PROXIED_ENV: "1" if proxied else "0", LISTEN_FD_ENV: str(listener.fileno())}, (listener.fileno(),))


def shard_topology(settings: Settings, index: int) -> Topology:
    """``tracker shard K``'s one process: shard ``index`` on ``--host``/``--port`` (the port bound
    first, then the warehouse prepared, whose lock it does not take: ``tracker serve``'s)."""
    listener = listen(settings.host, settings.port, settings.send_buffer)
    prepare(settings, warehouse_lock=False)
    shard = Shard(index, url_of(settings.advertise_host or settings.host, settings.port), True)
    lock = _shard_lock(settings, index, f"tracker shard {index} on port {settings.port}")
    return Topology([shard], [_hot(settings, shard, listener, lock, True)], shard.endpoint, False, [],
                    [listener, lock])


def _check_logs(settings: Settings, shards: list[Shard]) -> None:
    """Refuse a layout that leaves a shard's logged dataflows unserved (their log is in the warehouse)."""
    unserved = sorted(logged_shards(settings.warehouse) - {s.index for s in shards})
    if unserved:
        raise StartupError(f"the warehouse holds the log of shard {unserved[0]}, which this layout does not serve "
                           f"(shards {', '.join(str(s.index) for s in shards)}); raise --shards or list it in "
                           "--shard-hosts (a dataflow stays on its shard for good)")
