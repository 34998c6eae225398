"""Shared fixtures: one Spark session for the whole suite (starting one costs ~5 s)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    """The process's Spark session on ``local[2]``, shared by every Spark test."""
    from spark_jobs.jars import fetch
    from spark_jobs.session import get_spark

    fetch()  # a no-op once the set-up fetched the jars; makes a bare `pytest` run complete
    yield get_spark("local[2]")


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """A standalone master and one 2-core worker, started on first use, stopped at the end."""
    import sys

    from tests.cluster import start

    cluster = start(tmp_path_factory.mktemp("spark-cluster"), sys.executable)
    try:
        yield cluster
    finally:
        cluster.stop()
