"""Run the real service in a subprocess: ``tracker serve`` under uvicorn on a free loopback port.

Used by the tests (through the ``start_service`` fixture of ``tests/conftest.py``) and by the
benchmarks. :class:`ServiceProcess` starts ``python -m tracker.cli serve`` with a warehouse of
the caller's choosing and the admin token :data:`ADMIN_TOKEN`, waits until ``/healthz``
answers, and stops it gracefully (SIGTERM) or kills it (``kill -9``); ``restart`` starts it
again on the same port and warehouse, as after a crash. ``tracker serve`` is a supervisor
(:mod:`api.run.supervisor`): :meth:`ServiceProcess.pid_of` finds its hot-path or Spark process,
for a test that kills one of them alone. Spark is off unless asked for
(``spark=True``), so a caller never waits for a JVM it does not exercise.

This module imports only the standard library and httpx: it runs the service as a user would,
from the outside.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

SOURCE_ROOT = Path(__file__).resolve().parents[2]
"""The directory holding the ``api`` package; the service runs there, so it imports this same source tree."""

ADMIN_TOKEN = "test-admin-token"
"""The admin token every :class:`ServiceProcess` is started with (unless its ``env`` says otherwise)."""


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children, their children...), from ``/proc`` (Linux)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    found, frontier = [], [pid]
    while frontier:
        children = [child for child, parent in parents.items() if parent in frontier]
        found += children
        frontier = children
    return found


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (exists and is no zombie)."""
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServiceProcess:
    """One service process; ``restart`` reuses port and warehouse (as after a crash).

    ``env`` is added to the child's environment last, so it may override ``TRACKER_ADMIN_TOKEN``,
    ``TRACKER_SPARK`` and ``TRACKER_SPARK_NICE`` (``0`` here: the Spark process at the service's
    priority, unlike ``tracker serve``'s default of 10). The child's output goes to
    :attr:`log_path`, next to the warehouse. ``shards`` (``--shards``, 1 unless given, whatever
    the machine's cores) run on free ports, behind HAProxy unless ``proxy="none"``;
    ``shard_hosts`` is ``--shard-hosts`` (shards said to run elsewhere: not waited for).
    """

    def __init__(self, warehouse: Path, *, spark: bool = False, env: dict[str, str] | None = None,
                 engine: str = "native", shards: int = 1, shard_hosts: str = "", proxy: str = "auto") -> None:
        self.warehouse = Path(warehouse)
        self.shards = shards
        self.shard_hosts = shard_hosts
        self.proxy = proxy
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.ws_url = f"ws://127.0.0.1:{self.port}"
        self.spark = spark
        self.engine = engine
        self.extra_env = env or {}
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = self.warehouse.parent / f"service-{self.port}.log"
        self.starts = 0

    @property
    def admin_headers(self) -> dict[str, str]:
        """``Authorization`` for the admin token."""
        return {"Authorization": f"Bearer {ADMIN_TOKEN}"}

    def start(self, timeout: float = 60.0) -> ServiceProcess:
        """Start and wait until ``/healthz`` answers."""
        # The Spark process at the service's own priority unless asked otherwise: tests check
        # what Spark does, and two test processes' services on 2 cores starve a niced one.
        env = {**os.environ, "TRACKER_ADMIN_TOKEN": ADMIN_TOKEN, "TRACKER_SPARK": "1" if self.spark else "0",
               "TRACKER_SPARK_NICE": "0", "PYTHONUNBUFFERED": "1", **self.extra_env}
        self.starts += 1
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child keeps writing to it
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tracker.cli", "serve", "--host", "127.0.0.1", "--port", str(self.port),
             "--warehouse", str(self.warehouse), "--engine", self.engine, "--shards", str(self.shards),
             "--shard-port", "0", "--proxy", self.proxy, "--shard-hosts", self.shard_hosts],
            cwd=SOURCE_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"service exited with {self.process.returncode}:\n{self.log_tail()}")
            try:
                health = httpx.get(self.url + "/healthz", timeout=1.0)
                if health.status_code == 200 and self._local_shards_up(health.json()):
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"service did not start within {timeout}s:\n{self.log_tail()}")

    def _local_shards_up(self, health: dict[str, Any]) -> bool:
        """Whether every shard run here answered the front's ``/healthz`` (one shard: no front)."""
        return all(s["status"] != "unavailable" for s in health.get("shards", []) if s["shard"] < self.shards)

    def kill9(self) -> None:
        """``kill -9`` of ``tracker serve`` (the supervisor): no shutdown code runs; its children die
        with it (``PR_SET_PDEATHSIG``), and this returns once they are gone too, so that a
        restart finds the port and the warehouse free."""
        if self.process is not None and self.process.poll() is None:
            family = descendants(self.process.pid)
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait(10)
            deadline = time.monotonic() + 10
            while any(alive(pid) for pid in family) and time.monotonic() < deadline:
                time.sleep(0.02)

    def processes(self) -> list[dict[str, Any]]:
        """``GET /v1/processes``: each process's role and pid (supervisor, hot, spark)."""
        answer = httpx.get(self.url + "/v1/processes", headers=self.admin_headers, timeout=10.0)
        answer.raise_for_status()
        found: list[dict[str, Any]] = answer.json()
        return found

    def pid_of(self, role: str, shard: int | None = None) -> int:
        """The pid of the (first) process of ``role`` (``hot`` or ``spark``), of shard ``shard`` if given."""
        return next(int(p["pid"]) for p in self.processes()
                    if p["role"] == role and (shard is None or p.get("shard") == shard))

    def endpoint(self, shard: int) -> str:
        """Shard ``shard``'s base URL (its hot-path process, no proxy in between)."""
        return next(str(p["endpoint"]) for p in self.processes() if p["role"] == "hot" and p.get("shard") == shard)

    def log_directory(self, shard: int = 0) -> Path:
        """Shard ``shard``'s write-ahead log directory in the warehouse."""
        return self.warehouse / "_wal" / f"shard-{shard}"

    def stop(self) -> None:
        """Graceful stop (SIGTERM), then SIGKILL if it lingers."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.kill9()

    def restart(self) -> ServiceProcess:
        """Start again on the same port and warehouse."""
        return self.start()

    def log_tail(self, lines: int = 40) -> str:
        """The end of the service's log, for failure messages."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def client(self, token: str | None = ADMIN_TOKEN, **kwargs: Any) -> httpx.Client:
        """An ``httpx.Client`` on the service with a bearer token."""
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=kwargs.pop("timeout", 30.0), **kwargs)
