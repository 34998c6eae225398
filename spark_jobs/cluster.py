"""A Spark standalone cluster on loopback: one master and one or more workers started from the project's
pyspark, stopped (with every process they started) however the caller ends (tests, benchmarks).

>>> free_port() > 0
True
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path


def free_port() -> int:
    """A TCP port nobody listens on right now (loopback)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Cluster:
    """A running master and worker: ``url`` is ``spark://127.0.0.1:P``; ``work_dir`` is the
    worker's directory, where each application that got executors leaves an ``app-*`` folder."""

    url: str
    ui: str
    work_dir: Path
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def applications(self) -> list[str]:
        """The ids of the applications the worker ran executors for."""
        return sorted(p.name for p in self.work_dir.glob("app-*"))

    def stop(self) -> None:
        """Stop worker then master, their whole process groups; idempotent."""
        for process in reversed(self.processes):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in reversed(self.processes):
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        self.processes.clear()


def start(root: Path, python: str, cores: int = 2, memory: str = "1g", timeout: float = 90, workers: int = 1
          ) -> Cluster:
    """Start a master and ``workers`` workers (``cores`` and ``memory`` each) under ``root``;
    return once every worker is registered."""
    import pyspark

    home = Path(pyspark.__file__).parent
    port, ui_port, worker_ui = free_port(), free_port(), free_port()
    env = {**os.environ, "SPARK_HOME": str(home), "PYSPARK_PYTHON": python, "SPARK_LOCAL_IP": "127.0.0.1",
           "SPARK_LOG_DIR": str(root / "logs"), "SPARK_NO_DAEMONIZE": "1"}
    (root / "logs").mkdir(parents=True, exist_ok=True)
    cluster = Cluster(f"spark://127.0.0.1:{port}", f"http://127.0.0.1:{ui_port}", root / "work")
    atexit.register(cluster.stop)  # a crashed test session must not leave JVMs behind
    spark_class = str(home / "bin" / "spark-class")
    commands = [
        [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
         "--webui-port", str(ui_port)],
        *([spark_class, "org.apache.spark.deploy.worker.Worker", cluster.url, "--host", "127.0.0.1",
           "--cores", str(cores), "--memory", memory, "--webui-port", str(worker_ui if n == 0 else free_port()),
           "--work-dir", str(cluster.work_dir)] for n in range(workers)),
    ]
    try:
        for i, command in enumerate(commands):
            log = open(root / "logs" / f"{'master' if i == 0 else f'worker{i}'}.out", "wb")  # noqa: SIM115
            cluster.processes.append(subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT,
                                                      start_new_session=True))
            if i == 0:
                _wait(lambda: _state(cluster.ui) is not None, timeout, "master")
        _wait(lambda: sum(w.get("state") == "ALIVE" for w in (_state(cluster.ui) or {}).get("workers", []))
              >= workers, timeout, "worker registration")
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _state(ui: str) -> dict | None:
    try:
        with urllib.request.urlopen(f"{ui}/json/", timeout=2) as response:
            loaded = json.loads(response.read())
            return loaded if isinstance(loaded, dict) else None
    except (OSError, ValueError):
        return None


def _wait(ready, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise TimeoutError(f"Spark standalone {what} not ready after {timeout:.0f} s")
        time.sleep(0.5)
