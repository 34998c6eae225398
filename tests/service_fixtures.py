"""Start the real service (``tracker serve`` under uvicorn) as a subprocess on a loopback port.

Used by the ``tests/test_api_*.py`` modules and by ``bench/service.py``. Spark is off unless a
test asks for it (``spark=True``), so tests never wait for a JVM they do not exercise.
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

ROOT = Path(__file__).resolve().parent.parent
ADMIN = "test-admin-token"


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServiceProcess:
    """One service process; ``restart`` reuses port and warehouse (as after a crash)."""

    def __init__(self, warehouse: Path, *, spark: bool = False, env: dict[str, str] | None = None,
                 engine: str = "native") -> None:
        self.warehouse = Path(warehouse)
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
        return {"Authorization": f"Bearer {ADMIN}"}

    def start(self, timeout: float = 60.0) -> ServiceProcess:
        """Start and wait until ``/healthz`` answers."""
        env = {**os.environ, "TRACKER_ADMIN_TOKEN": ADMIN, "TRACKER_SPARK": "1" if self.spark else "0",
               "PYTHONUNBUFFERED": "1", **self.extra_env}
        self.starts += 1
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child keeps writing to it
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tracker.cli", "serve", "--host", "127.0.0.1", "--port", str(self.port),
             "--warehouse", str(self.warehouse), "--engine", self.engine],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"service exited with {self.process.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(self.url + "/healthz", timeout=1.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"service did not start within {timeout}s:\n{self.log_tail()}")

    def kill9(self) -> None:
        """``kill -9``: no shutdown code runs."""
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait(10)

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

    def client(self, token: str | None = ADMIN, **kwargs: Any) -> httpx.Client:
        """An ``httpx.Client`` on the service with a bearer token."""
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=kwargs.pop("timeout", 30.0), **kwargs)


def loop_graph(operators: int = 3, arity: int = 1, name: str = "loop") -> dict[str, Any]:
    """A registration body: an input operator feeding a ring of ``operators`` operators whose
    last one increments the last coordinate (a feedback loop)."""
    increment = [0] * (arity - 1) + [1]
    nodes: list[dict[str, Any]] = [{"id": 0, "name": "input", "inputs": 0, "outputs": 1}]
    for i in range(1, operators + 1):
        node: dict[str, Any] = {"id": i, "name": f"op{i}", "inputs": 2 if i == 1 else 1, "outputs": 1}
        if i == operators:
            node["connections"] = [{"input": 0, "output": 0, "summaries": [increment]}]
        nodes.append(node)
    edges = [{"source": {"node": 0, "port": 0}, "target": {"node": 1, "port": 1}}]
    for i in range(1, operators + 1):
        nxt = 1 if i == operators else i + 1
        edges.append({"source": {"node": i, "port": 0}, "target": {"node": nxt, "port": 0}})
    return {"name": name, "timestamp_arity": arity, "nodes": nodes, "edges": edges}


def core_graph(body: dict[str, Any]) -> tuple[Any, list[Any]]:
    """The core ``Graph`` and initial pointstamps of a registration body, built exactly as the
    service builds them (for local oracles and native baselines)."""
    from api.models import RegisterRequest
    from api.service import build_graph, registration_record

    return build_graph(registration_record(RegisterRequest.model_validate(body)))


def register(service: ServiceProcess, body: dict[str, Any]) -> tuple[str, str]:
    """Register ``body``; returns ``(id, token)``."""
    with service.client() as client:
        answer = client.post("/v1/dataflows", json=body)
    assert answer.status_code == 201, answer.text
    data = answer.json()
    return data["id"], data["token"]


def update(node: int, port: int, kind: str, time_: list[int], delta: int) -> dict[str, Any]:
    """One update's JSON."""
    return {"location": {"node": node, "port": port, "kind": kind}, "time": time_, "delta": delta}
