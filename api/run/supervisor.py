"""``tracker serve`` and ``tracker shard``: a small supervisor of the service's processes by role.

::

                 tracker serve (supervisor: settings, ports, warehouse lock, signals)
                  |  starts, watches (ready / heartbeat lines on a pipe), restarts
     +------------+-------------+---------------------+----------------------+
     v                          v                     v                      v
  hot path, one per shard   front (when sharded:   HAProxy (when sharded   Spark process (nice 10,
  (uvicorn: ingest, log,    registration, lists,   and installed: the      local[cores-1]: checks,
  engine, streams, Delta)   metrics, health)       public address)         audits, micro-batches)
     |  typed messages over a Unix socket (api.channel)                              ^
     +-------------------------------------------------------------------------------+

It validates the settings, binds every port (busy: one line, exit 2, before anything else),
takes the warehouse lock (``tracker serve``) and each of its shards' locks (inherited by that
shard's process, so held until it is gone), then starts what :mod:`api.run.topology` decided:
one hot-path process per shard run here (``python -m api.run.hot``), the front and HAProxy when
there are several shards, and, with Spark on, one Spark process (``python -m api.spark.process``)
listening on a Unix socket whose path every hot-path process is given (each connects on its own).
``tracker shard K`` supervises shard ``K``'s hot-path process and a Spark process of its own, for
a ``tracker serve`` on another host that lists it in ``--shard-hosts``.

Its one loop (signal handlers only enqueue) watches the children: a child is live while it
runs and heartbeats (a ``beat`` line every second from its event loop; silent for
:data:`HEARTBEAT_TIMEOUT` s once ready: killed and restarted; HAProxy, which has no such pipe, is
live while it runs). A child that dies is restarted in its slot with backoff (0.1 s doubling to
5 s; back to 0.1 s after a minute of service); a child that cannot boot (it says ``fatal
<reason>`` and exits with 3, or dies :data:`BOOT_ATTEMPTS` times in a row before it is ready)
stops the service with its one-line reason and exit code 2. Once every child is ready the first
time, it prints ``[tracker] ready at URL`` and writes the URL to ``<warehouse>/service-url``
(removed when it stops). SIGINT or SIGTERM stops everything within :data:`STOP_SECONDS`:
SIGTERM to every child, SIGKILL to whatever is left; exit 130 after SIGINT, 0 after SIGTERM.
The children die with the supervisor however it ends (``PR_SET_PDEATHSIG``,
:mod:`api.channel.supervised`; set before ``exec`` for HAProxy), the Spark process's JVM with it.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import logging
import os
import queue
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from api.channel.supervised import _PR_SET_PDEATHSIG, CANNOT_BOOT, FD_ENV, PID_ENV, spark_state_file, write_state
from api.config import ENGINE_NAMES, Settings
from api.run.hot import SETTINGS_ENV
from api.run.server import StartupError
from api.run.topology import Process, Topology, serve_topology, shard_topology

log = logging.getLogger("tracker.supervisor")
HEARTBEAT_TIMEOUT = 30.0
"""Seconds a ready child may stay silent before it is killed and restarted."""
BOOT_ATTEMPTS = 5
"""Deaths in a row before being ready after which a child is taken as unable to boot."""
OPTIONAL_BACKOFF = 15.0
"""The longest wait before an optional child (the Spark process) is started again after
deaths in a row; one that cannot boot (a set-up error) is tried again after :data:`SETUP_RETRY`."""
SETUP_RETRY = 60.0
STOP_SECONDS = 1.8
"""Seconds the children get to stop after SIGTERM before SIGKILL."""
SPARK_ADDRESS_ENV = "TRACKER_SPARK_ADDRESS"


def _die_with_parent() -> None:
    """In a child between ``fork`` and ``exec`` (HAProxy's): SIGKILL when the supervisor dies."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


class Child:
    """One slot: a role's process (:class:`~api.run.topology.Process`) and what runs in it, if anything."""

    def __init__(self, spec: Process) -> None:
        self.spec = spec
        self.role = spec.role
        self.process: subprocess.Popen[bytes] | None = None
        self.pipe: int | None = None
        self.ready = False
        self.beat = 0.0
        self.started = 0.0
        self.fatal: str | None = None
        self.failures = 0  # deaths in a row before being ready (or soon after)
        self.next_start = 0.0
        self.restarts = 0
        self.reason: str | None = None  # why the child says it is about to exit (``down <reason>``)
        self._buffer = b""

    def start(self) -> None:
        """Start the role's process, with the write end of a pipe to talk to us (HAProxy: none)."""
        spec = self.spec
        if not spec.supervised:
            self.process = subprocess.Popen(spec.argv, env={**os.environ, **spec.env}, pass_fds=spec.pass_fds,
                                            preexec_fn=_die_with_parent if sys.platform == "linux" else None)
            self.ready, self.fatal = True, None
        else:
            read, write = os.pipe()
            os.set_blocking(read, False)
            env = {**os.environ, **spec.env, FD_ENV: str(write), PID_ENV: str(os.getpid())}
            try:
                self.process = subprocess.Popen(spec.argv, env=env, pass_fds=(write, *spec.pass_fds))
            finally:
                os.close(write)
            self.pipe, self.ready, self.fatal, self.reason, self._buffer = read, False, None, None, b""
        self.started = self.beat = time.monotonic()
        write_state(spec.state_file, "starting", pid=self.process.pid, restarts=self.restarts)
        log.info("started", extra={"role": self.role, "pid": self.process.pid, "restarts": self.restarts,
                                   **({"shard": spec.shard} if spec.shard is not None else {})})

    def read(self) -> None:
        """Take in what the child said (``ready``, ``beat``, ``fatal <reason>``)."""
        if self.pipe is None:
            return
        try:
            data = os.read(self.pipe, 65536)
        except BlockingIOError:
            return
        if not data:
            os.close(self.pipe)
            self.pipe = None
            return
        *lines, self._buffer = (self._buffer + data).split(b"\n")
        for line in lines:
            self.beat = time.monotonic()
            if line == b"ready":
                self.ready = True
            elif line.startswith(b"fatal "):
                self.fatal = line[6:].decode(errors="replace")
            elif line.startswith(b"down "):
                self.reason = line[5:].decode(errors="replace")

    def alive(self) -> bool:
        """Whether its process runs."""
        return self.process is not None and self.process.poll() is None


class Supervisor:
    """The loop of :func:`supervise` over ``children``; ``on_ready`` runs once, when every child
    is ready for the first time; ``command`` (``tracker serve`` or ``tracker shard``) names
    the command in its one-line error."""

    def __init__(self, children: list[Child], on_ready: Callable[[], None] = lambda: None,
                 command: str = "tracker serve") -> None:
        self.children = children
        self.command = command
        self.on_ready: Callable[[], None] | None = on_ready
        self.signals: queue.SimpleQueue[int] = queue.SimpleQueue()

    def run(self) -> int:
        """Start every child and watch them until a signal or a child that cannot boot; the exit code."""
        wake_read, wake_write = os.pipe()
        for fd in (wake_read, wake_write):
            os.set_blocking(fd, False)
        signal.set_wakeup_fd(wake_write)
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD):
            signal.signal(sig, lambda number, _: self.signals.put(number))
        try:
            for child in self.children:
                child.start()
            while True:
                pipes = [c.pipe for c in self.children if c.pipe is not None]
                readable, _, _ = select.select([wake_read, *pipes], [], [], 0.25)
                if wake_read in readable:
                    with contextlib.suppress(BlockingIOError):
                        os.read(wake_read, 4096)
                for child in self.children:
                    if child.pipe in readable:
                        child.read()
                while not self.signals.empty():
                    number = self.signals.get()
                    if number in (signal.SIGINT, signal.SIGTERM):
                        log.info("stopping", extra={"signal": signal.Signals(number).name})
                        self.stop()
                        return 130 if number == signal.SIGINT else 0
                reason = self._watch()
                if reason is not None:
                    self.stop()
                    print(f"{self.command}: error: {reason}", file=sys.stderr, flush=True)
                    return 2
                if self.on_ready is not None and all(c.ready and c.alive() for c in self.children
                                                     if not c.spec.optional):
                    self.on_ready()
                    self.on_ready = None
        finally:
            signal.set_wakeup_fd(-1)
            os.close(wake_read)
            os.close(wake_write)

    def _watch(self) -> str | None:
        """Restart the dead and the silent; the reason to stop if a child cannot boot."""
        now = time.monotonic()
        for child in self.children:
            process = child.process
            if process is not None and process.poll() is not None:
                child.read()
                if child.pipe is not None:
                    os.close(child.pipe)
                    child.pipe = None
                child.process = None
                code = process.returncode
                cannot_boot = child.fatal is not None or code == CANNOT_BOOT
                if child.spec.optional:
                    child.failures = 0 if child.ready and now - child.started > 60 else child.failures + 1
                    wait = SETUP_RETRY if cannot_boot else min(OPTIONAL_BACKOFF, 0.1 * 2 ** (child.failures - 1))
                    write_state(child.spec.state_file, "down", reason=_why(child, code), pid=process.pid,
                                restarts=child.restarts + 1, retry_at=time.time() + wait)
                elif not child.ready or (not child.spec.supervised and now - child.started < 1):
                    child.failures += 1
                    if cannot_boot or child.failures >= BOOT_ATTEMPTS:
                        return child.fatal or f"the {child.role} process cannot start (exit code {code}; see its log)"
                elif now - child.started > 60:
                    child.failures = 0
                else:
                    child.failures += 1
                if not child.spec.optional:
                    wait = min(5.0, 0.1 * 2 ** max(0, child.failures - 1))
                child.next_start = now + wait
                child.restarts += 1
                log.warning("a process died; restarting it", extra={
                    "role": child.role, "pid": process.pid, "exit_code": code,
                    "in_seconds": round(child.next_start - now, 2),
                    **({"shard": child.spec.shard} if child.spec.shard is not None else {})})
            elif (process is not None and child.spec.supervised and child.ready
                  and now - child.beat > HEARTBEAT_TIMEOUT):
                log.error("a process stopped heartbeating; killing it", extra={
                    "role": child.role, "pid": process.pid, "silent_seconds": round(now - child.beat, 1)})
                child.reason = child.reason or f"it stopped answering for {now - child.beat:.0f} s and was killed"
                process.kill()
            elif process is None and now >= child.next_start:
                child.start()
        return None

    def stop(self) -> None:
        """SIGTERM to every child, then SIGKILL to those still there after :data:`STOP_SECONDS`."""
        for child in self.children:
            if child.spec.state_file is not None:
                child.spec.state_file.unlink(missing_ok=True)
        running = [c.process for c in self.children if c.process is not None and c.alive()]
        for process in running:
            with contextlib.suppress(ProcessLookupError):
                process.terminate()
        deadline = time.monotonic() + STOP_SECONDS
        while any(p.poll() is None for p in running) and time.monotonic() < deadline:
            time.sleep(0.02)
        for process in running:
            if process.poll() is None:
                log.warning("a process did not stop in time; killing it", extra={"pid": process.pid})
                process.kill()
                process.wait()


def _why(child: Child, code: int | None) -> str:
    """Why ``child`` is gone, in a line: what it said, else how it ended."""
    said = child.fatal or child.reason
    if said:
        return said
    if code is not None and code < 0:
        with contextlib.suppress(ValueError):
            return f"it was killed by {signal.Signals(-code).name}"
    return f"it exited with code {code}"


def supervise(args: argparse.Namespace) -> int:
    """``tracker serve``: validate, bind, take the warehouse, start and watch the processes."""
    return _supervise(args, None)


def supervise_shard(args: argparse.Namespace) -> int:
    """``tracker shard K``: shard ``K`` alone (and a Spark process), for a ``tracker serve`` elsewhere."""
    return _supervise(args, args.index)


def _supervise(args: argparse.Namespace, shard: int | None) -> int:
    command = "tracker serve" if shard is None else "tracker shard"
    try:
        settings = Settings.from_env(args)
    except ValueError as error:  # a bad environment value: say which, no traceback
        print(f"{command}: error: {error}", file=sys.stderr)
        return 2
    runtime = Path(tempfile.mkdtemp(prefix="tracker-"))  # 0700: only this user reaches its sockets
    if settings.spark:
        settings.spark_address = str(runtime / "spark.sock")
    try:
        try:
            topology = serve_topology(settings, runtime) if shard is None else shard_topology(settings, shard)
        except StartupError as error:
            print(f"{command}: error: {error}", file=sys.stderr)
            return 2
        for note in topology.notes:
            print(f"[tracker] {note}", file=sys.stderr, flush=True)
        log.info("starting", extra={
            "url": topology.url, "warehouse": str(settings.warehouse), "engine": ENGINE_NAMES[settings.engine],
            "spark": settings.spark, "shards": {s.index: s.endpoint for s in topology.shards},
            **({"spark_master": settings.master or f"local[{settings.spark_cores_used()}]",
                "spark_nice": settings.spark_nice} if settings.spark else {})})
        children = [Child(p) for p in topology.processes]
        if settings.spark:
            children.append(Child(Process("spark", [sys.executable, "-m", "api.spark.process"], {
                SETTINGS_ENV: settings.to_json(), SPARK_ADDRESS_ENV: settings.spark_address or ""},
                optional=True, state_file=spark_state_file(settings.spark_address or ""))))
        url_file = settings.warehouse / "service-url"
        try:
            return Supervisor(children, lambda: _announce(topology, url_file), command).run()
        finally:
            if topology.announce:
                url_file.unlink(missing_ok=True)
    finally:
        shutil.rmtree(runtime, ignore_errors=True)


def _announce(topology: Topology, url_file: Path) -> None:
    """Say where the service is, once everything serves: one plain line among the JSON logs and,
    for the public address, ``<warehouse>/service-url`` for the client commands (a killed
    supervisor leaves it; clients then say the service cannot be reached at that URL)."""
    if not topology.announce:
        print(f"[tracker] shard {topology.shards[0].index} ready at {topology.url}", file=sys.stderr, flush=True)
        return
    try:
        url_file.write_text(topology.url + "\n")
    except OSError as error:  # the warehouse is writable (the lock is in it): only say so
        print(f"[tracker] could not write {url_file}: {error.strerror}", file=sys.stderr)
    shards = "" if len(topology.shards) == 1 else (
        f" ({len(topology.shards)} shards: " + ", ".join(f"{s.index} at {s.endpoint}" for s in topology.shards) + ")")
    print(f"[tracker] ready at {topology.url}; dashboard at {topology.url}/dashboard{shards}", file=sys.stderr,
          flush=True)
