"""Build-time only: put Delta's and GraphFrames' JVM jars into pyspark's ``jars`` directory.

Run by ``docker/Dockerfile`` while the image is built (Maven Central is reachable there, not on
the development machines). The coordinates follow the Python packages installed next to
pyspark, so the JVM and Python sides always match: ``io.delta:delta-spark_<spark major.minor>_2.13:
<delta-spark version>`` (the naming delta-spark's own ``configure_spark_with_delta_pip`` uses)
and ``io.graphframes:graphframes-spark<spark major>_2.13:<graphframes-py version>``.

Ivy resolves the transitive dependencies through a throw-away local Spark session; only the
artifacts pyspark does not ship already are copied, so no second copy of a Spark dependency
(with another version) lands on the classpath. Then a fresh session must see both classes.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path

SCALA = "2.13"


def coordinates(spark_version: str, delta_version: str, graphframes_version: str) -> list[str]:
    """The Maven coordinates for these versions.

    >>> coordinates("4.2.0", "4.4.1", "0.12.3")
    ['io.delta:delta-spark_4.2_2.13:4.4.1', 'io.graphframes:graphframes-spark4_2.13:0.12.3']
    """
    major, minor = spark_version.split(".")[:2]
    return [f"io.delta:delta-spark_{major}.{minor}_{SCALA}:{delta_version}",
            f"io.graphframes:graphframes-spark{major}_{SCALA}:{graphframes_version}"]


def strip_organisation(jar_name: str) -> str:
    """Ivy names a jar ``<organisation>_<artifact>-<revision>.jar``; Spark ships ``<artifact>-<revision>.jar``.

    An organisation is dotted (``org.scala-lang``) while an artifact's ``_`` comes after its
    name (``spark-core_2.13``), which tells the two apart.

    >>> strip_organisation("org.scala-lang_scala-library-2.13.16.jar"), strip_organisation("spark-core_2.13-4.2.0.jar")
    ('scala-library-2.13.16.jar', 'spark-core_2.13-4.2.0.jar')
    """
    head, sep, rest = jar_name.partition("_")
    return rest if sep and "." in head else jar_name


def artifact(jar_name: str) -> str:
    """A jar's artifact name, without organisation prefix and revision.

    >>> artifact("io.delta_delta-storage-4.4.1.jar"), artifact("delta-spark_4.2_2.13-4.4.1.jar")
    ('delta-storage', 'delta-spark_4.2_2.13')
    """
    return re.sub(r"-\d[\w.\-]*$", "", strip_organisation(jar_name).removesuffix(".jar"))


def to_copy(resolved: list[str], shipped: list[str]) -> list[str]:
    """The resolved jars whose artifact pyspark does not ship.

    >>> to_copy(["io.delta_delta-storage-4.4.1.jar", "org.antlr_antlr4-runtime-4.13.1.jar"],
    ...         ["antlr4-runtime-4.13.1.jar"])
    ['io.delta_delta-storage-4.4.1.jar']
    """
    have = {artifact(j) for j in shipped}
    return [j for j in resolved if artifact(j) not in have]


def main() -> int:
    """Resolve, copy, verify; the exit code."""
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    packages = coordinates(pyspark.__version__, metadata.version("delta-spark"), metadata.version("graphframes-py"))
    ivy = Path(tempfile.mkdtemp(prefix="ivy-"))
    resolve = (
        "from pyspark.sql import SparkSession\n"
        f"s = SparkSession.builder.master('local[1]').config('spark.jars.packages', {','.join(packages)!r})"
        f".config('spark.jars.ivy', {str(ivy)!r}).getOrCreate()\n"
        "s.stop()\n"
    )
    subprocess.run([sys.executable, "-c", resolve], check=True)
    resolved = sorted(p.name for p in (ivy / "jars").glob("*.jar"))
    copied = to_copy(resolved, [p.name for p in jars.glob("*.jar")])
    for name in copied:
        # Drop Ivy's organisation prefix: session.py looks for delta-spark*.jar by name.
        shutil.copy(ivy / "jars" / name, jars / strip_organisation(name))
    shutil.rmtree(ivy, ignore_errors=True)
    print(f"[fetch_jars] {packages}: copied {copied} into {jars}")
    verify = (
        "from spark_jobs.session import get_spark, has_delta_jvm, has_graphframes_jvm\n"
        "s = get_spark('local[1]')\n"
        "assert has_delta_jvm(s) and has_graphframes_jvm(s), 'Delta or GraphFrames classes missing'\n"
        "s.stop()\n"
    )
    subprocess.run([sys.executable, "-c", verify], check=True)
    print("[fetch_jars] a Spark session sees delta-spark and GraphFrames")
    return 0


if __name__ == "__main__":
    sys.exit(main())
