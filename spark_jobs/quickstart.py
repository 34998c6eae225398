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

import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

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
    done = subprocess.run([sys.executable, "-m", "spark_jobs.quickstart_dump", str(partial)],
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
    print(build() or "no class-data archive")
    return 0


if __name__ == "__main__":
    sys.exit(main())
