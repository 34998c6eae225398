"""The JVM jars the Spark session loads: delta-spark and GraphFrames, fetched once from Maven Central.

Guarantees:

* The coordinates follow the Python packages installed next to pyspark, so the JVM and Python
  sides match: ``io.delta:delta-spark_<spark major.minor>_2.13:<delta-spark version>`` (the
  naming of delta-spark's own ``configure_spark_with_delta_pip``) and
  ``io.graphframes:graphframes-spark<spark major>_2.13:<graphframes-py version>``. When Maven
  Central does not serve the exact patch release of a Python package, the newest lower patch
  release of the same minor version is taken (a Python patch release without a JVM one changes
  nothing the JVM side needs) and the fallback is recorded.
* :func:`fetch` resolves each package with Spark's own Ivy (shipped inside pyspark, so no other
  tool is needed) into a cache directory named by the versions, copies only the jars pyspark
  does not ship already (so no second copy of a Spark dependency lands on the classpath), and
  writes ``manifest.json`` last. Re-running it is a no-op once the manifest exists, including the
  record that a package is not served (asking again would only be told no again).
* :func:`jar_paths` lists the cached jars for ``spark.jars``: local paths, so starting a session
  needs no network; executors get the jars from the driver.

The cache is ``$TRACKER_SPARK_JARS`` if set, else ``$XDG_CACHE_HOME`` (default ``~/.cache``)
``/timely-progress-service/spark-jars/<versions>``.

>>> coordinates("4.2.0", "4.4.1", "0.12.3")
['io.delta:delta-spark_4.2_2.13:4.4.1', 'io.graphframes:graphframes-spark4_2.13:0.12.3']
>>> strip_organisation("io.delta_delta-storage-4.4.0.jar")
'delta-storage-4.4.0.jar'
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Any

SCALA = "2.13"
MANIFEST = "manifest.json"


def coordinates(spark_version: str, delta_version: str, graphframes_version: str) -> list[str]:
    """The Maven coordinates of delta-spark and GraphFrames for these Python package versions."""
    major, minor = spark_version.split(".")[:2]
    return [f"io.delta:delta-spark_{major}.{minor}_{SCALA}:{delta_version}",
            f"io.graphframes:graphframes-spark{major}_{SCALA}:{graphframes_version}"]


def installed_coordinates() -> list[str]:
    """:func:`coordinates` for the packages installed in this environment."""
    import pyspark

    return coordinates(pyspark.__version__, metadata.version("delta-spark"), metadata.version("graphframes-py"))


def patch_fallbacks(coordinate: str) -> list[str]:
    """The coordinate, then the same artifact at each lower patch release of its minor version.

    >>> [c.rpartition(":")[2] for c in patch_fallbacks("io.delta:delta-spark_4.2_2.13:4.4.2")]
    ['4.4.2', '4.4.1', '4.4.0']
    """
    group_artifact, _, version = coordinate.rpartition(":")
    match = re.fullmatch(r"(\d+)\.(\d+)\.(\d+)", version)
    if not match:
        return [coordinate]
    major, minor, patch = (int(p) for p in match.groups())
    return [f"{group_artifact}:{major}.{minor}.{p}" for p in range(patch, -1, -1)]


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


def cache_dir() -> Path:
    """Where the jars of the installed versions live (see the module docstring)."""
    if os.environ.get("TRACKER_SPARK_JARS"):
        return Path(os.environ["TRACKER_SPARK_JARS"])
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    import pyspark

    key = (f"spark{pyspark.__version__}-delta{metadata.version('delta-spark')}"
           f"-graphframes{metadata.version('graphframes-py')}")
    return base / "timely-progress-service" / "spark-jars" / key


def manifest(directory: Path | None = None) -> dict[str, Any] | None:
    """The cache's manifest (what was fetched, what is not served), or ``None`` before a fetch."""
    path = (directory or cache_dir()) / MANIFEST
    try:
        loaded = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return loaded if isinstance(loaded, dict) else None


def jar_paths(directory: Path | None = None) -> list[str]:
    """Absolute paths of the cached jars (empty before a fetch), for ``spark.jars``."""
    directory = directory or cache_dir()
    found = manifest(directory)
    if found is None:
        return []
    return [str(directory / name) for name in found.get("jars", []) if (directory / name).is_file()]


def has_package(prefix: str, directory: Path | None = None) -> bool:
    """True iff a cached jar's name starts with ``prefix`` (``"delta-spark"``, ``"graphframes"``)."""
    return any(Path(p).name.startswith(prefix) for p in jar_paths(directory))


def _resolve(coordinate: str, ivy: Path) -> list[Path] | None:
    """The jars Spark's Ivy resolves for one coordinate (``None`` if Maven Central has no such
    release). A local session with ``spark.jars.packages`` is the one public entry point to
    Spark's resolver; it starts in a child process so that this one stays JVM-free."""
    script = (
        "from pyspark.sql import SparkSession\n"
        f"s = SparkSession.builder.master('local[1]').config('spark.jars.packages', {coordinate!r})"
        f".config('spark.jars.ivy', {str(ivy)!r}).config('spark.ui.enabled', 'false').getOrCreate()\n"
        "s.stop()\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    if done.returncode != 0:
        if "not found" in done.stderr or "unresolved dependency" in done.stderr:
            return None
        tail = "\n".join(done.stderr.strip().splitlines()[-5:])
        raise RuntimeError(f"resolving {coordinate} failed:\n{tail}")
    return sorted((ivy / "jars").glob("*.jar"))


def fetch(directory: Path | None = None, quiet: bool = False) -> dict[str, Any]:
    """Fetch the jars into the cache unless its manifest exists; return the manifest."""
    import pyspark

    directory = directory or cache_dir()
    found = manifest(directory)
    if found is not None:
        return found
    directory.mkdir(parents=True, exist_ok=True)
    shipped = [p.name for p in (Path(pyspark.__file__).parent / "jars").glob("*.jar")]
    started = time.perf_counter()
    fetched: dict[str, str] = {}
    not_served: list[str] = []
    jars: list[str] = []
    # One Ivy home for every attempt: its cache keeps what an earlier attempt downloaded.
    ivy = Path(tempfile.mkdtemp(prefix="tracker-ivy-"))
    for wanted in installed_coordinates():
        if not quiet:
            print(f"[setup] fetching {wanted} and its dependencies from Maven Central into {directory}",
                  file=sys.stderr, flush=True)
        for coordinate in patch_fallbacks(wanted):
            shutil.rmtree(ivy / "jars", ignore_errors=True)  # what this attempt retrieves, only
            resolved = _resolve(coordinate, ivy)
            if resolved is None:
                continue
            for name in to_copy([p.name for p in resolved], shipped + jars):
                shutil.copy(ivy / "jars" / name, directory / strip_organisation(name))
                jars.append(strip_organisation(name))
            fetched[wanted] = coordinate
            break
        else:
            not_served.append(wanted)
    shutil.rmtree(ivy, ignore_errors=True)
    if not fetched:  # nothing at all: rather the network than Maven Central; ask again next time
        raise RuntimeError(f"none of {installed_coordinates()} could be resolved (no network?)")
    result = {"fetched": fetched, "not_served": not_served, "jars": sorted(jars),
              "seconds": round(time.perf_counter() - started, 1)}
    (directory / (MANIFEST + ".tmp")).write_text(json.dumps(result, indent=1))
    (directory / (MANIFEST + ".tmp")).replace(directory / MANIFEST)
    if not quiet:
        served = ", ".join(f"{c}" + (f" (as {r})" if r != c else "") for c, r in fetched.items())
        missing = f"; not served by Maven Central: {', '.join(not_served)}" if not_served else ""
        print(f"[setup] {len(jars)} jars for {served or 'nothing'}{missing} ({result['seconds']} s)",
              file=sys.stderr, flush=True)
    return result


def main(argv: list[str] | None = None) -> int:
    """``python -m spark_jobs.jars``: fetch (idempotent). ``python -m spark_jobs.session
    --verify`` fetches too, then checks that a session loads every fetched package."""
    fetch()
    return 0


if __name__ == "__main__":
    sys.exit(main())
