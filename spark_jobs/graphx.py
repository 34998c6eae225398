"""The GraphX helper: a small JVM library (``spark_jobs/jvm/``, Java) that runs the cycle check
and frontier propagation on Spark's graph engine, GraphX, which ships inside pyspark.

Guarantees:

* :func:`build` compiles the Java sources with ``javac`` against pyspark's own jars (no
  download) into a jar cached under ``$XDG_CACHE_HOME`` (``~/.cache``)
  ``/timely-progress-service/graphx/<key>/``, where the key hashes the names and sizes of
  pyspark's jars (another pyspark is another key) and the sources; a second build with the same
  key is a no-op. ``bin/_setup.sh`` and the Docker image run it (``python -m spark_jobs.graphx``).
* The graph engine is ``graphx`` unless ``TRACKER_GRAPH_ENGINE=dataframe`` chooses the
  DataFrame path (the checked alternative). With ``graphx`` chosen and no jar built,
  :func:`graph_engine` (hence every Spark session, :func:`spark_jobs.session.get_spark`) raises
  :class:`HelperMissing` with one line saying how to build it: never a silent fallback.
* The session puts the jar on ``spark.jars``, so executors of a cluster receive it from the
  driver, as they do the Delta jars.

>>> engine_choice({"TRACKER_GRAPH_ENGINE": "dataframe"}), engine_choice({})
('dataframe', 'graphx')
>>> cache_key(["a.jar:10"], {"X.java": b"class X {}"}) == cache_key(["a.jar:10"], {"X.java": b"class X {}"})
True
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

SOURCES = Path(__file__).parent / "jvm" / "src"
JAR_NAME = "tracker-graphx.jar"
ENTRY_CLASS = "tracker.graphx.ProgressGraphs"
ENGINES = ("graphx", "dataframe")
Engine = Literal["graphx", "dataframe"]


class HelperMissing(RuntimeError):
    """The GraphX engine is chosen but its helper jar is not built (a set-up error)."""


def engine_choice(env: Mapping[str, str] | None = None) -> Engine:
    """The engine chosen by ``TRACKER_GRAPH_ENGINE`` (default ``graphx``); ``ValueError`` for
    anything else."""
    value = (os.environ if env is None else env).get("TRACKER_GRAPH_ENGINE", "").strip().lower() or "graphx"
    if value == "graphx":
        return "graphx"
    if value == "dataframe":
        return "dataframe"
    raise ValueError(f"TRACKER_GRAPH_ENGINE={value!r}: choose one of {', '.join(ENGINES)}")


def _pyspark_jars() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "jars"


def _source_files() -> dict[str, bytes]:
    return {str(p.relative_to(SOURCES)): p.read_bytes() for p in sorted(SOURCES.rglob("*.java"))}


def cache_key(jars: list[str], sources: Mapping[str, bytes]) -> str:
    """A short hash of pyspark's jars (``name:size`` each) and the helper's sources."""
    digest = hashlib.sha256()
    for entry in sorted(jars):
        digest.update(entry.encode() + b"\n")
    for name, content in sorted(sources.items()):
        digest.update(name.encode() + b"\0" + hashlib.sha256(content).digest())
    return digest.hexdigest()[:16]


def jar_path() -> Path:
    """Where the jar for this pyspark and these sources is (built or not)."""
    jars = [f"{p.name}:{p.stat().st_size}" for p in _pyspark_jars().glob("*.jar")]
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "timely-progress-service" / "graphx" / cache_key(jars, _source_files()) / JAR_NAME


def build(quiet: bool = False) -> Path:
    """Compile the helper into :func:`jar_path` unless it is there; return its path.

    Raises:
        HelperMissing: no ``javac`` (a JDK is needed, not only a JRE), or it failed (its
            first error lines in the message).
    """
    target = jar_path()
    if target.is_file():
        return target
    javac = shutil.which("javac") or (str(Path(os.environ["JAVA_HOME"]) / "bin" / "javac")
                                      if os.environ.get("JAVA_HOME") else None)
    if not javac or not Path(javac).exists():
        raise HelperMissing("the GraphX helper needs javac (a JDK, e.g. Debian's openjdk-17-jdk-headless) to be built")
    if not quiet:
        print(f"[setup] building the GraphX helper (javac against pyspark's jars) into {target}", file=sys.stderr,
              flush=True)
    with tempfile.TemporaryDirectory(prefix="tracker-graphx-") as work:
        classes = Path(work) / "classes"
        classes.mkdir()
        sources = [str(p) for p in sorted(SOURCES.rglob("*.java"))]
        done = subprocess.run([javac, "-nowarn", "--release", "17", "-cp", str(_pyspark_jars() / "*"),
                               "-d", str(classes), *sources], capture_output=True, text=True)
        if done.returncode != 0:
            head = " | ".join(done.stderr.strip().splitlines()[:3])
            raise HelperMissing(f"javac failed on the GraphX helper: {head}")
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_suffix(".jar.tmp")
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as jar:
            jar.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\nCreated-By: spark_jobs.graphx\n\n")
            for path in sorted(classes.rglob("*.class")):
                jar.write(path, str(path.relative_to(classes)))
        partial.replace(target)  # atomic: a reader sees no jar or the whole jar
    return target


def helper_jars() -> list[str]:
    """The jars a session must load for the chosen engine: the helper's, or none for the
    DataFrame path.

    Raises:
        HelperMissing: ``graphx`` chosen and the jar not built (one line saying how to build it).
    """
    if engine_choice() == "dataframe":
        return []
    target = jar_path()
    if not target.is_file():
        raise HelperMissing(f"the GraphX helper is not built (no {target}): run the set-up (bin/test or bin/serve) "
                            "or `python -m spark_jobs.graphx`, or choose TRACKER_GRAPH_ENGINE=dataframe")
    return [str(target)]


def main(argv: list[str] | None = None) -> int:
    """``python -m spark_jobs.graphx``: build the helper (idempotent); exit 1 with one line if
    it cannot be built."""
    try:
        print(build())
    except HelperMissing as error:
        print(f"[setup] {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())


# ---- calls into the helper (each starts Spark jobs; the session must have loaded the jar) ----

Method = Literal["local", "pregel"]
"""``local``: GraphX's graph partitioned by dataflow, each edge partition computed whole in one
stage (the default: measured faster); ``pregel``: GraphX's own algorithms (SCC, Pregel), one or
more Spark jobs per superstep (the checked alternative)."""


def _helper(df: DataFrame) -> Any:
    return getattr(df.sparkSession._jvm, ENTRY_CLASS.rpartition(".")[0]).ProgressGraphs


def cycles(zero: DataFrame, method: Method = "local") -> DataFrame:
    """``(dataflow_id, src, dst)`` of the transitions of ``zero`` (``dataflow_id, src, dst``,
    transitions that do not advance time) lying on a cycle: both ends in one strongly connected
    component (a self-loop included). Materialised (checkpointed) on return."""
    from pyspark.sql import DataFrame

    return DataFrame(_helper(zero).cycles(zero.select("dataflow_id", "src", "dst")._jdf, method), zero.sparkSession)


def propagate(transitions: DataFrame, times: DataFrame, method: Method = "local",
              max_supersteps: int = 100_000) -> DataFrame:
    """``(dataflow_id, loc, time)``: every location's frontier, the lower envelope of the times
    reachable from ``times`` (``dataflow_id, loc, time``) along ``transitions`` (``dataflow_id,
    src, dst, summary``); locations reached by nothing are absent. Materialised on return.
    ``pregel`` needs the transitions free of non-incrementing cycles (else it stops after
    ``max_supersteps``); ``local`` ends on any graph."""
    from pyspark.sql import DataFrame

    jdf = _helper(transitions).propagate(transitions.select("dataflow_id", "src", "dst", "summary")._jdf,
                                         times.select("dataflow_id", "loc", "time")._jdf, method, max_supersteps)
    return DataFrame(jdf, transitions.sparkSession)


def psi(transitions: DataFrame, locations: DataFrame) -> DataFrame:
    """``Psi`` as ``(dataflow_id, src, dst, summary)``: for every location of ``locations``
    (``dataflow_id, loc, arity``) and every location it reaches along ``transitions``, itself
    included with the zero summary, the minimal path summaries; each dataflow's in one task.
    The transitions must pass the cycle check. Materialised on return."""
    from pyspark.sql import DataFrame

    jdf = _helper(transitions).psi(transitions.select("dataflow_id", "src", "dst", "summary")._jdf,
                                   locations.select("dataflow_id", "loc", "arity")._jdf)
    return DataFrame(jdf, transitions.sparkSession)


class IndexedPsi(NamedTuple):
    """``Psi`` partitioned by dataflow and indexed in the executors' memory (:func:`index_psi`):
    :func:`incremental` zips a batch's partitions with it instead of shuffling ``Psi`` again,
    and reads only the entries of the locations the batch can move."""

    psi: DataFrame
    """The ``Psi`` frame it was built from (``dataflow_id, src, dst, summary``)."""
    index: Any
    """The helper's cached ``JavaRDD`` of per-partition indexes."""


def index_psi(psi: DataFrame) -> IndexedPsi:
    """``psi`` shuffled and indexed once for many batches (:class:`IndexedPsi`); one Spark job.
    The cache is dropped when the handle is garbage-collected (Spark's context cleaner)."""
    return IndexedPsi(psi, _incremental_helper(psi).index(psi.select("dataflow_id", "src", "dst", "summary")._jdf))


def _incremental_helper(df: DataFrame) -> Any:
    return getattr(df.sparkSession._jvm, ENTRY_CLASS.rpartition(".")[0]).Incremental


def incremental(psi: DataFrame | IndexedPsi, points: DataFrame, batch: DataFrame, frontiers: DataFrame
                ) -> DataFrame:
    """A batch applied, each dataflow in one task (the helper's ``Incremental``): tagged rows
    ``(dataflow_id, tag, loc, time, value)``, ``tag`` ``p`` the new counts (``value`` the
    count), ``c`` the frontier changes (``value`` +1/-1), ``f`` the new frontiers; materialised.
    Inputs as :func:`spark_jobs.incremental.incremental` takes them; ``psi`` already indexed
    (:func:`index_psi`) is not shuffled again: one shuffle of the other three, one Spark job."""
    from pyspark.sql import DataFrame

    helper = _incremental_helper(points)
    rest = (points.select("dataflow_id", "loc", "time", "count")._jdf,
            batch.select("dataflow_id", "loc", "time", "delta")._jdf,
            frontiers.select("dataflow_id", "loc", "time")._jdf)
    if isinstance(psi, IndexedPsi):
        jdf = helper.applyIndexed(psi.index, *rest)
    else:
        jdf = helper.apply(psi.select("dataflow_id", "src", "dst", "summary")._jdf, *rest)
    return DataFrame(jdf, points.sparkSession)


class IncrementalState:
    """Counts and frontiers kept in the executors beside an indexed ``Psi``, partitioned like it
    (the helper's ``IncrementalState``): :meth:`apply` ships a batch's rows from the driver to
    the partitions holding their dataflows, so a batch is one Spark stage without a shuffle.
    A state never changes: ``apply`` returns the next one and leaves this one usable (a failed
    batch leaves nothing half-applied)."""

    def __init__(self, handle: Any, spark: Any) -> None:
        self._handle, self._spark = handle, spark

    @classmethod
    def start(cls, indexed: IndexedPsi, points: DataFrame, frontiers: DataFrame) -> IncrementalState:
        """The state of ``points`` (``dataflow_id, loc, time, count``) and ``frontiers``
        (``dataflow_id, loc, time``) beside ``indexed``; one Spark job, cached on return."""
        helper = getattr(points.sparkSession._jvm, ENTRY_CLASS.rpartition(".")[0]).IncrementalState
        handle = helper.of(indexed.index, points.select("dataflow_id", "loc", "time", "count")._jdf,
                           frontiers.select("dataflow_id", "loc", "time")._jdf)
        return cls(handle, points.sparkSession)

    def apply(self, batch: list[tuple[str, int, list[int], int]]
              ) -> tuple[IncrementalState, list[tuple[str, int, tuple[int, ...], int]]]:
        """The next state after ``batch`` (``dataflow_id, loc, time, delta`` rows) and its exact
        frontier changes ``(dataflow_id, loc, time, diff)`` (+1 a time entering a frontier, -1
        one leaving it). One Spark job of one stage."""
        import json

        handle = self._handle.apply(json.dumps(batch))
        changes = [(k, loc, tuple(t), d) for k, loc, t, d in json.loads(handle.changesJson())]
        return IncrementalState(handle, self._spark), changes

    def _tagged(self, tag: str, value: str) -> DataFrame:
        from pyspark.sql import DataFrame
        from pyspark.sql import functions as F

        rows = DataFrame(self._handle.rows(), self._spark)
        return rows.where(F.col("tag") == tag).select("dataflow_id", "loc", "time", F.col("value").alias(value))

    def points(self) -> DataFrame:
        """The non-zero counts ``(dataflow_id, loc, time, count)`` (read when used)."""
        return self._tagged("p", "count")

    def frontiers(self) -> DataFrame:
        """The frontiers ``(dataflow_id, loc, time)`` (read when used)."""
        return self._tagged("f", "value").drop("value")

    def drop(self) -> None:
        """Release the cached partitions; the state must not be used afterwards."""
        self._handle.unpersist()
