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

Example (starts a JVM, so not run as a doctest)::

    spark = get_spark("local[2]")
    has_delta_jvm(spark), has_graphframes_jvm(spark)   # (True, False): GraphFrames is not served
"""

from __future__ import annotations

import glob
import os
import re
import tempfile
import threading
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

_LOCK = threading.Lock()
_SESSION: SparkSession | None = None

DELTA_CLASS = "io.delta.tables.DeltaTable"
GRAPHFRAMES_CLASS = "org.graphframes.GraphFrame"
SHUFFLE_PARTITIONS = 4


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


def get_spark(master: str | None = None) -> SparkSession:
    """The process's Spark session, started on first call and shared afterwards.

    ``master`` (or env ``SPARK_MASTER``, else ``local[*]``) is only used by the first call; later
    calls return the same session whatever they pass, because a JVM hosts one SparkContext.

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
        jars = package_jars()
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
        spark = builder.getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
        checkpoint_dir = os.environ.get("TRACKER_SPARK_CHECKPOINT_DIR") or tempfile.mkdtemp(prefix="tracker-ckpt-")
        spark.sparkContext.setCheckpointDir(checkpoint_dir)
        _SESSION = spark
        return spark


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
    """True iff GraphFrames' JVM package loads in this session (then SCC may use it)."""
    return _has_class(spark, GRAPHFRAMES_CLASS)


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
    spark.stop()
    wanted = {name for name in loaded if any(name in c for c in result["fetched"])}
    missing = [name for name in wanted if not loaded[name]]
    if missing:
        print(f"[setup] a Spark session does not load {missing}", file=sys.stderr)
        return 1
    print(f"[setup] a Spark session loads {sorted(n for n, ok in loaded.items() if ok)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
