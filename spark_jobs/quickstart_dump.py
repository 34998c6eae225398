"""The dump behind :func:`spark_jobs.quickstart.build`, run in a fresh process
(``python -m spark_jobs.quickstart_dump TARGET``): a small ``tracker jobs propagate`` in a JVM
that writes the classes it loaded to ``TARGET`` when it exits.

Its own module because it runs a whole job (the session, the warehouse, the CLI), which the
quick start's options, read by :mod:`spark_jobs.session`, must not import.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def dump(target: Path) -> int:
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


if __name__ == "__main__":
    sys.exit(dump(Path(sys.argv[1])))
