"""The Spark session: one per process, sized for small data, loading the fetched JVM packages.

``get_spark()`` starts (once) a session on ``local[*]``, or on the master named by the argument
or by ``SPARK_MASTER``. It keeps shuffles small (4 partitions), turns adaptive execution off
(measured: AQE re-plans every round of an iteration and made rounds slower), silences the logs
and sets a checkpoint directory so iterations may cut their lineage.

The jars that ``bin/_setup.sh`` fetched (:mod:`spark_jobs.jars`) go on ``spark.jars`` as local
paths, so starting a session needs no network and executors of a cluster get them from the
driver; when delta-spark is among them, Delta's SQL extension and catalog are configured.
``TRACKER_SPARK_JARS=none`` starts a session without them (the fallback paths: delta-rs and the
DataFrame cycle closure). The classes are still *detected* by loading them (``has_delta_jvm``,
``has_graphframes_jvm``), so jars put on the classpath by other means count too.

The GraphX helper (:mod:`spark_jobs.graphx`) goes on ``spark.jars`` too, unless
``TRACKER_GRAPH_ENGINE=dataframe``; :func:`graph_engine` says which engine runs the graph work.
A missing helper stops the session from starting, with one line (:class:`HelperMissing`).

The JVM this process launches dies with it, however it ends: pyspark's gateway exits when its
stdin closes, but only after Spark's shutdown hooks, which wait for running jobs (minutes, holding
gigabytes). A watchdog process (:func:`tie_to_parent`) reads a pipe from this process and, once
it closes (exit, crash, ``kill -9``), gives the JVM :data:`JVM_GRACE` seconds, then kills it.

Example (starts a JVM, so not run as a doctest)::

    spark = get_spark("local[2]")
    has_delta_jvm(spark), has_graphframes_jvm(spark)   # (True, False): GraphFrames is not served
    graph_engine(spark)                                # 'graphx (helper /root/.cache/...)'
"""

from __future__ import annotations

import glob
import os
import re
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from spark_jobs.graphx import ENTRY_CLASS, HelperMissing, engine_choice, helper_jars

_LOCK = threading.Lock()
_SESSION: SparkSession | None = None

DELTA_CLASS = "io.delta.tables.DeltaTable"
GRAPHFRAMES_CLASS = "org.graphframes.GraphFrame"
SHUFFLE_PARTITIONS = 4
JVM_GRACE = 1.5
"""Seconds the JVM has to exit by itself after its parent ended, before the watchdog kills it."""
_WATCHDOGS: dict[int, subprocess.Popen[bytes]] = {}  # by JVM pid; their stdin pipes stay open while we live

# Run by the watchdog: wait for the pipe to close, then for the JVM, then kill it.
_WATCHDOG = """
import os, signal, sys, time
pid, grace = int(sys.argv[1]), float(sys.argv[2])
sys.stdin.buffer.read()
deadline = time.monotonic() + grace
def alive():
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
while alive() and time.monotonic() < deadline:
    time.sleep(0.05)
if alive():
    os.kill(pid, signal.SIGKILL)
"""


def resolve_master(master: str | None = None) -> str:
    """The master URL to use: the argument, else env ``SPARK_MASTER``, else ``local[*]``.

    >>> resolve_master("local[2]")
    'local[2]'
    """
    return master or os.environ.get("SPARK_MASTER") or "local[*]"


_MASTER = re.compile(r"local(\[(\*|\d+)(,\s*\d+)?\])?|local-cluster\[.+\]|yarn|(spark|k8s|mesos)://\S+|sc://\S+")


def master_problem(master: str) -> str | None:
    """Why Spark would refuse ``master`` (checked up front: Spark's own error comes as a Java
    stack trace ending in "Java gateway process exited"), or ``None``.

    >>> master_problem("spark://host:7077") is None, master_problem("bogus://x") is not None
    (True, True)
    """
    if _MASTER.fullmatch(master):
        return None
    return (f"{master!r} is not a Spark master URL: use local[*], local[N], spark://HOST:PORT, yarn, "
            "k8s://https://HOST:PORT or sc://HOST:PORT")


def _jar_dirs() -> list[Path]:
    """Directories whose jars end up on the driver's classpath."""
    import pyspark

    dirs = [Path(pyspark.__file__).parent / "jars"]
    if os.environ.get("SPARK_HOME"):
        dirs.append(Path(os.environ["SPARK_HOME"]) / "jars")
    return dirs


def package_jars() -> list[str]:
    """The fetched jars this process's session loads (empty with ``TRACKER_SPARK_JARS=none``)."""
    if os.environ.get("TRACKER_SPARK_JARS", "").lower() == "none":
        return []
    from spark_jobs.jars import jar_paths

    return jar_paths()


def delta_jars_present() -> bool:
    """True iff a Delta jar is visible before the session starts (so its extensions may be set).

    Looks in the fetched jars, in pyspark's and ``SPARK_HOME``'s jar directories and in the jars
    or packages named by ``PYSPARK_SUBMIT_ARGS``; configuring the extension without the jar would
    fail the session.
    """
    if any(Path(p).name.startswith("delta-spark") for p in package_jars()):
        return True
    for directory in _jar_dirs():
        if glob.glob(str(directory / "delta-spark*.jar")) or glob.glob(str(directory / "delta-core*.jar")):
            return True
    submit = os.environ.get("PYSPARK_SUBMIT_ARGS", "")
    return "delta-spark" in submit or "delta-core" in submit


def get_spark(master: str | None = None, quick_start: bool = False) -> SparkSession:
    """The process's Spark session, started on first call and shared afterwards.

    ``master`` (or env ``SPARK_MASTER``, else ``local[*]``) is only used by the first call; later
    calls return the same session whatever they pass, because a JVM hosts one SparkContext.
    ``quick_start`` (a short job's session, ``tracker jobs``): on a local master, the driver JVM
    gets :mod:`spark_jobs.quickstart`'s options (quick JIT, class-data archive).

    Example::

        get_spark("local[2]").conf.get("spark.sql.shuffle.partitions")   # '4'
    """
    global _SESSION
    with _LOCK:
        if _SESSION is not None and not _SESSION.sparkContext._jsc.sc().isStopped():
            return _SESSION
        builder = (
            SparkSession.builder.master(resolve_master(master))
            .appName("timely-progress-tracker")
            .config("spark.sql.shuffle.partitions", str(SHUFFLE_PARTITIONS))
            .config("spark.default.parallelism", str(SHUFFLE_PARTITIONS))
            .config("spark.sql.adaptive.enabled", "false")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.session.timeZone", "UTC")
            .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        )
        url = resolve_master(master)
        if url.startswith("local") or re.match(r"spark://(127\.0\.0\.1|localhost)[:/]", url):
            # An embedded session (or a cluster on this machine's loopback) talks only to this
            # machine: keep the driver on loopback rather than whatever the hostname resolves to.
            builder = builder.config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
        if quick_start and url.startswith("local"):
            builder = _quick_start(builder)
        jars = package_jars() + helper_jars()  # raises HelperMissing before any JVM starts
        if jars:
            builder = builder.config("spark.jars", ",".join(jars))
        if delta_jars_present():
            builder = (
                builder.config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
                .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
                # Rebuilding a snapshot's state is a Spark job over 50 partitions by default:
                # seconds of task overhead per commit for logs of a few hundred actions.
                .config("spark.databricks.delta.snapshotPartitions", "2")
                # Each of these is one more Spark job per commit, for checks this project does
                # not rely on (readers never read the checksum files).
                .config("spark.databricks.delta.writeChecksumFile.enabled", "false")
                .config("spark.databricks.delta.stateReconstructionValidation.enabled", "false")
            )
        _launch_tied_jvm(builder)
        spark = builder.getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
        checkpoint_dir = os.environ.get("TRACKER_SPARK_CHECKPOINT_DIR") or tempfile.mkdtemp(prefix="tracker-ckpt-")
        spark.sparkContext.setCheckpointDir(checkpoint_dir)
        _SESSION = spark
        return spark


def _quick_start(builder: SparkSession.Builder) -> SparkSession.Builder:
    from spark_jobs import quickstart

    if not quickstart.enabled():
        return builder
    dump = os.environ.get("TRACKER_JOBS_QUICK_START_DUMP")  # set by the archive's build only
    options = (f"{' '.join(quickstart.JVM_OPTIONS)} -XX:ArchiveClassesAtExit={dump}" if dump
               else quickstart.driver_options(quickstart.archive_path()))
    return builder.config("spark.driver.extraJavaOptions", options)


def tie_to_parent(pid: int, grace: float = JVM_GRACE) -> subprocess.Popen[bytes]:
    """Start a watchdog that kills process ``pid`` (with SIGKILL) ``grace`` seconds after this
    process ends, unless it exited by then. The watchdog runs in its own session, so the SIGINT
    of a terminal's Ctrl-C does not reach it, and needs nothing but ``/proc`` (Linux)."""
    watchdog = subprocess.Popen([sys.executable, "-c", _WATCHDOG, str(pid), str(grace)], stdin=subprocess.PIPE,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    _WATCHDOGS[pid] = watchdog
    return watchdog


def _launch_tied_jvm(builder: SparkSession.Builder) -> None:
    """Launch the JVM gateway as ``getOrCreate`` would (same settings), tied to this process by
    :func:`tie_to_parent` as soon as its pid is known; pyspark then uses it. Nothing if a
    gateway runs already or off Linux (``/proc``)."""
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    if SparkContext._gateway is not None or sys.platform != "linux" or os.environ.get("SPARK_CONNECT_MODE_ENABLED"):
        return
    conf = SparkConf()
    for key, value in builder._options.items():  # what getOrCreate hands to launch_gateway
        conf.set(key, str(value))
    gateway = launch_gateway(conf)
    proc = getattr(gateway, "proc", None)
    if proc is not None:
        tie_to_parent(proc.pid)
    SparkContext._ensure_initialized(gateway=gateway)


def _has_class(spark: SparkSession, name: str) -> bool:
    """Try to load a JVM class through the session's class loader; False on any failure."""
    try:
        jvm: Any = spark._jvm
        loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
        jvm.java.lang.Class.forName(name, False, loader)
        return True
    except Exception:  # Py4J wraps ClassNotFoundException; no JVM (Connect) also means "absent"
        return False


def has_delta_jvm(spark: SparkSession) -> bool:
    """True iff Delta's JVM classes load in this session (then delta-spark reads and writes)."""
    return _has_class(spark, DELTA_CLASS)


def has_graphframes_jvm(spark: SparkSession) -> bool:
    """True iff GraphFrames' JVM package loads in this session (it is not served: nothing uses
    it; the GraphX helper runs the graph work)."""
    return _has_class(spark, GRAPHFRAMES_CLASS)


def graph_engine(spark: SparkSession | None = None) -> str:
    """Which graph engine runs the cycle check and propagation, and why, in one line:
    ``"graphx (helper <jar>)"`` or ``"dataframe (TRACKER_GRAPH_ENGINE=dataframe)"``. With
    ``spark``, also checks that the helper's classes load in that session.

    Raises:
        HelperMissing: GraphX is chosen but its helper is not built, or does not load in
            ``spark`` (one line; a set-up error, never a silent fallback).
        ValueError: ``TRACKER_GRAPH_ENGINE`` names no engine.

    >>> import os; os.environ["TRACKER_GRAPH_ENGINE"] = "dataframe"
    >>> graph_engine()
    'dataframe (TRACKER_GRAPH_ENGINE=dataframe)'
    >>> del os.environ["TRACKER_GRAPH_ENGINE"]
    """
    if engine_choice() == "dataframe":
        return "dataframe (TRACKER_GRAPH_ENGINE=dataframe)"
    [jar] = helper_jars()
    if spark is not None and not _has_class(spark, ENTRY_CLASS):
        raise HelperMissing(f"the GraphX helper {jar} does not load in this Spark session")
    return f"graphx (helper {jar})"


def main(argv: list[str] | None = None) -> int:
    """``python -m spark_jobs.session --verify``: fetch the JVM packages (idempotent), then fail
    unless a Spark session loads every package Maven Central served (the Docker build runs it)."""
    import sys

    from spark_jobs.jars import fetch

    argv = sys.argv[1:] if argv is None else argv
    result = fetch()
    if "--verify" not in argv:
        return 0
    spark = get_spark("local[1]")
    loaded = {"delta-spark": has_delta_jvm(spark), "graphframes": has_graphframes_jvm(spark)}
    try:
        engine = graph_engine(spark)
    except HelperMissing as error:
        print(f"[setup] graph engine: {error}", file=sys.stderr)
        return 1
    finally:
        spark.stop()
    print(f"[setup] graph engine: {engine}", file=sys.stderr)
    wanted = {name for name in loaded if any(name in c for c in result["fetched"])}
    for name, ok in loaded.items():
        state = "loaded" if ok else "fetched but does not load" if name in wanted else "not served"
        if name == "graphframes" and not ok:
            state += "; GraphX runs the graph work through the helper instead"
        print(f"[setup] {name}: {state}", file=sys.stderr)
    missing = [name for name in wanted if not loaded[name]]
    if missing:
        print(f"[setup] a Spark session does not load {missing}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
