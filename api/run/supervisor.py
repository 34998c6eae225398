"""``tracker serve``: a small supervisor of the service's processes by role.

::

                     tracker serve (supervisor: settings, port, warehouse lock, signals)
                      |  starts, watches (ready / heartbeat lines on a pipe), restarts
          +-----------+-------------------------------+
          v                                           v
    hot path  (uvicorn: ingest, log, engine,      Spark process (nice 10, local[cores-1]:
    publication, streams, Delta thread)            checks, audits, micro-batches, Psi)
          |  typed messages over a Unix socket (api.channel)  ^
          +---------------------------------------------------+

It validates the settings, binds the port (busy: one line, exit 2, before anything else), takes
the warehouse lock (inherited by the hot-path processes, so it is held until the last of them
is gone), then starts :data:`HOT_PROCESSES` hot-path processes (``python -m api.run.hot``) and,
with Spark on, one Spark process (``python -m api.spark.process``) listening on a Unix socket
whose path both are given. It is designed for N hot-path processes and one Spark process
(each hot-path process connects to it on its own).

Its one loop (signal handlers only enqueue) watches the children: a child is live while it
runs and heartbeats (a ``beat`` line every second from its event loop; silent for
:data:`HEARTBEAT_TIMEOUT` s once ready: killed and restarted). A child that dies is restarted
in its slot with backoff (0.1 s doubling to 5 s; back to 0.1 s after a minute of service); a
child that cannot boot (it says ``fatal <reason>`` and exits with 3, or dies
:data:`BOOT_ATTEMPTS` times in a row before it is ready) stops the service with its one-line
reason and exit code 2. SIGINT or SIGTERM stops everything within :data:`STOP_SECONDS`:
SIGTERM to every child, SIGKILL to whatever is left; exit 130 after SIGINT, 0 after SIGTERM.
The children die with the supervisor however it ends (``PR_SET_PDEATHSIG``,
:mod:`api.channel.supervised`), the Spark process's JVM with it.
"""

from __future__ import annotations

import argparse
import contextlib
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
from pathlib import Path

from api.channel.supervised import CANNOT_BOOT, FD_ENV, PID_ENV
from api.config import ENGINE_NAMES, Settings
from api.run.hot import LISTEN_FD_ENV, SETTINGS_ENV
from api.run.server import StartupError, listen, prepare

log = logging.getLogger("tracker.supervisor")
HOT_PROCESSES = 1
"""Hot-path processes (one log and one port each once shards come; one today)."""
HEARTBEAT_TIMEOUT = 30.0
"""Seconds a ready child may stay silent before it is killed and restarted."""
BOOT_ATTEMPTS = 5
"""Deaths in a row before being ready after which a child is taken as unable to boot."""
STOP_SECONDS = 1.8
"""Seconds the children get to stop after SIGTERM before SIGKILL."""
SPARK_ADDRESS_ENV = "TRACKER_SPARK_ADDRESS"


class Child:
    """One slot: a role's command line and the process running in it, if any."""

    def __init__(self, role: str, argv: list[str], env: dict[str, str], pass_fds: tuple[int, ...] = ()) -> None:
        self.role = role
        self.argv = argv
        self.env = env
        self.pass_fds = pass_fds
        self.process: subprocess.Popen[bytes] | None = None
        self.pipe: int | None = None
        self.ready = False
        self.beat = 0.0
        self.started = 0.0
        self.fatal: str | None = None
        self.failures = 0  # deaths in a row before being ready (or soon after)
        self.next_start = 0.0
        self.restarts = 0
        self._buffer = b""

    def start(self) -> None:
        """Start the role's process, with the write end of a pipe to talk to us."""
        read, write = os.pipe()
        os.set_blocking(read, False)
        env = {**os.environ, **self.env, FD_ENV: str(write), PID_ENV: str(os.getpid())}
        try:
            self.process = subprocess.Popen(self.argv, env=env, pass_fds=(write, *self.pass_fds))
        finally:
            os.close(write)
        self.pipe, self.ready, self.fatal, self._buffer = read, False, None, b""
        self.started = self.beat = time.monotonic()
        log.info("started", extra={"role": self.role, "pid": self.process.pid, "restarts": self.restarts})

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

    def alive(self) -> bool:
        """Whether its process runs."""
        return self.process is not None and self.process.poll() is None


class Supervisor:
    """The loop of :func:`supervise` over ``children``."""

    def __init__(self, children: list[Child]) -> None:
        self.children = children
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
                    print(f"tracker serve: error: {reason}", file=sys.stderr, flush=True)
                    return 2
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
                if not child.ready:
                    child.failures += 1
                    if child.fatal is not None or code == CANNOT_BOOT or child.failures >= BOOT_ATTEMPTS:
                        return child.fatal or f"the {child.role} process cannot start (exit code {code}; see its log)"
                elif now - child.started > 60:
                    child.failures = 0
                else:
                    child.failures += 1
                child.next_start = now + min(5.0, 0.1 * 2 ** max(0, child.failures - 1))
                child.restarts += 1
                log.warning("a process died; restarting it", extra={
                    "role": child.role, "pid": process.pid, "exit_code": code,
                    "in_seconds": round(child.next_start - now, 2)})
            elif process is not None and child.ready and now - child.beat > HEARTBEAT_TIMEOUT:
                log.error("a process stopped heartbeating; killing it", extra={
                    "role": child.role, "pid": process.pid, "silent_seconds": round(now - child.beat, 1)})
                process.kill()
            elif process is None and now >= child.next_start:
                child.start()
        return None

    def stop(self) -> None:
        """SIGTERM to every child, then SIGKILL to those still there after :data:`STOP_SECONDS`."""
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


def supervise(args: argparse.Namespace) -> int:
    """``tracker serve``: validate, bind, take the warehouse, start and watch the processes."""
    try:
        settings = Settings.from_env(args)
    except ValueError as error:  # a bad environment value: say which, no traceback
        print(f"tracker serve: error: {error}", file=sys.stderr)
        return 2
    try:
        listener = listen(settings.host, settings.port, settings.send_buffer)
        lock, _ = prepare(settings)
    except StartupError as error:
        print(f"tracker serve: error: {error}", file=sys.stderr)
        return 2
    runtime = Path(tempfile.mkdtemp(prefix="tracker-"))  # 0700: only this user reaches the socket
    if settings.spark:
        settings.spark_address = str(runtime / "spark.sock")
    log.info("starting", extra={
        "host": settings.host, "port": settings.port, "warehouse": str(settings.warehouse),
        "engine": ENGINE_NAMES[settings.engine], "spark": settings.spark,
        **({"spark_master": settings.master or f"local[{settings.spark_cores_used()}]",
            "spark_nice": settings.spark_nice} if settings.spark else {})})
    shared = {SETTINGS_ENV: settings.to_json()}
    held = tuple(fd for fd in (listener.fileno(), lock.fileno()) if fd is not None)
    children = [Child("hot", [sys.executable, "-m", "api.run.hot"],
                      {**shared, LISTEN_FD_ENV: str(listener.fileno())}, held) for _ in range(HOT_PROCESSES)]
    if settings.spark:
        children.append(Child("spark", [sys.executable, "-m", "api.spark.process"],
                              {**shared, SPARK_ADDRESS_ENV: settings.spark_address or ""}))
    try:
        return Supervisor(children).run()
    finally:
        shutil.rmtree(runtime, ignore_errors=True)
