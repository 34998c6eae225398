"""A quick start for short Spark jobs: the driver JVM of ``tracker jobs`` on a local master.

A one-dataflow ``tracker jobs propagate`` spends most of its wall time starting the JVM (loading
some ten thousand classes) and running its first Spark jobs (their code interpreted, then
compiled by the JIT). For such short runs the JVM is launched with:

* ``-XX:TieredStopAtLevel=1 -XX:+UseSerialGC``: only the quick (C1) JIT compiler and the
  serial collector, so two cores shared with other work are not spent on optimising compilers
  and parallel GC threads for a run of seconds (measured: the run about halves);
* ``-XX:SharedArchiveFile=<archive>`` when the set-up built one (:func:`build`): a class-data
  sharing archive of the classes a small job loads, mapped instead of parsed and verified
  (measured: the JVM's start about halves again). A missing or stale archive is ignored by
  the JVM (``-Xshare:auto``), never an error.

The archive is cached under ``$XDG_CACHE_HOME`` (``~/.cache``)
``/timely-progress-service/cds/<key>/spark.jsa``, the key hashing pyspark's jars (names and
sizes) and the ``java`` binary (its resolved path, size and modification time): another pyspark
or another JDK is another key. ``python -m spark_jobs.quickstart`` builds it (``bin/_setup.sh``
and the Docker image run it; a no-op when cached): it runs a small ``propagate`` in a JVM that
dumps the classes it loaded when it exits (some 30 s, ~150 MB). ``TRACKER_JOBS_QUICK_START=0``
turns all of this off (the JVM's defaults).

>>> options = driver_options(archive=None)
>>> options
'-XX:TieredStopAtLevel=1 -XX:+UseSerialGC'
>>> enabled({"TRACKER_JOBS_QUICK_START": "0"}), enabled({})
(False, True)
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

JVM_OPTIONS = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")
ARCHIVE_NAME = "spark.jsa"


def enabled(env: Mapping[str, str] | None = None) -> bool:
    """Whether the quick start is on (``TRACKER_JOBS_QUICK_START``, default on; ``0`` off)."""
    return (os.environ if env is None else env).get("TRACKER_JOBS_QUICK_START", "1").strip() != "0"


def _java() -> Path | None:
    home = os.environ.get("JAVA_HOME")
    found = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    return Path(found).resolve() if found and Path(found).exists() else None


def archive_path() -> Path | None:
    """Where the archive for this pyspark and this ``java`` is (built or not); ``None`` without
    a ``java``."""
    from spark_jobs.graphx import _pyspark_jars

    java = _java()
    if java is None:
        return None
    digest = hashlib.sha256()
    for jar in sorted(_pyspark_jars().glob("*.jar")):
        digest.update(f"{jar.name}:{jar.stat().st_size}\n".encode())
    stat = java.stat()
    digest.update(f"{java}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "timely-progress-service" / "cds" / digest.hexdigest()[:16] / ARCHIVE_NAME


def driver_options(archive: Path | None = None) -> str:
    """The driver JVM's options for a quick start: :data:`JVM_OPTIONS`, and the archive if it
    is given and exists."""
    options = list(JVM_OPTIONS)
    if archive is not None and archive.is_file():
        options.append(f"-XX:SharedArchiveFile={archive}")
    return " ".join(options)


def describe(options: str) -> str:
    """What the driver JVM's ``options`` say of its start, for a job's ``Spark ready`` line.

    >>> describe(driver_options(None)), describe("")
    ('quick start (no class-data archive)', 'default start')
    >>> describe("-XX:TieredStopAtLevel=1 -XX:SharedArchiveFile=/c/spark.jsa")
    'quick start (class-data archive /c/spark.jsa)'
    """
    if JVM_OPTIONS[0] not in options.split():
        return "default start"
    archive = next((o.partition("=")[2] for o in options.split() if o.startswith("-XX:SharedArchiveFile=")), None)
    return f"quick start ({f'class-data archive {archive}' if archive else 'no class-data archive'})"


def _dump(target: Path) -> int:
    """In a fresh process: run a small ``propagate`` in a JVM that writes ``target`` (the
    classes it loaded) when it exits, make it exit, and wait for it."""
    from datetime import UTC, datetime

    from pyspark import SparkContext

    from spark_jobs import session
    from spark_jobs.storage import Warehouse
    from tracker.cli import main as tracker
    from tracker.graph import Edge, Graph, Location, Node

    os.environ["TRACKER_JOBS_QUICK_START_DUMP"] = str(target)
    root = tempfile.mkdtemp(prefix="tracker-cds-")
    try:
        nodes = [Node(0, 0, 1, "input"), Node(1, 1, 1, "map"), Node(2, 1, 0, "sink")]
        graph = Graph.build(1, nodes, [Edge(Location.source(0, 0), Location.target(1, 0)),
                                       Edge(Location.source(1, 0), Location.target(2, 0))])
        wh = Warehouse(root)
        wh.write_dataflows([("cds", "cds", graph, datetime.now(UTC))])
        wh.write_states({"cds": (0, {(Location.source(0, 0), (0,)): 1}, None)})
        with open(os.devnull, "w") as quiet:
            sys.stdout = quiet
            code = tracker(["jobs", "propagate", "--warehouse", root, "--all", "--master", "local[1]"])
            sys.stdout = sys.__stdout__
        gateway = SparkContext._gateway
        pid = gateway.proc.pid if gateway is not None and getattr(gateway, "proc", None) else None
        jvm: Any = session.get_spark()._jvm
        with contextlib.suppress(Exception):  # the gateway's connection ends with the JVM
            jvm.System.exit(0)  # the archive is written during the exit
        deadline = time.monotonic() + 300
        while pid is not None and Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            if Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z":
                break
            time.sleep(0.2)
        return code
    finally:
        shutil.rmtree(root, ignore_errors=True)


def build(quiet: bool = False) -> Path | None:
    """Build the archive into :func:`archive_path` unless it is there; its path, or ``None``
    when it could not be built (the quick start then goes without it: not an error)."""
    target = archive_path()
    if target is None or target.is_file():
        return target
    if not quiet:
        print(f"[setup] building the Spark class-data archive for short jobs into {target}", file=sys.stderr,
              flush=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f"{ARCHIVE_NAME}.{os.getpid()}.tmp")
    done = subprocess.run([sys.executable, "-m", "spark_jobs.quickstart", "--dump", str(partial)],
                          capture_output=True, text=True, env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"})
    if done.returncode != 0 or not partial.is_file():
        partial.unlink(missing_ok=True)
        if not quiet:
            print(f"[setup] no class-data archive (short jobs start without it): {done.stderr.strip()[-300:]}",
                  file=sys.stderr)
        return None
    partial.replace(target)  # atomic: a JVM maps the whole archive or none
    return target


def main(argv: list[str] | None = None) -> int:
    """``python -m spark_jobs.quickstart``: build the archive (idempotent); print its path.
    Exit 0 even when it cannot be built (short jobs then start without it)."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--dump"]:
        return _dump(Path(argv[1]))
    print(build() or "no class-data archive")
    return 0


if __name__ == "__main__":
    sys.exit(main())
