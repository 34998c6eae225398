"""Shared fixtures: one Spark session for the whole suite (starting one costs ~5 s), and the real
service (``tracker serve`` in a subprocess, :class:`api.run.process.ServiceProcess`).

Two ways to get a service, both stopping every service they started at teardown:

* ``service``: one service for the whole module, configured by the module's ``service`` marker,
  whose keyword arguments are those of :class:`tests.helpers.ServiceStarter`, e.g.
  ``pytestmark = pytest.mark.service(TRACKER_HISTORY="20")`` or
  ``pytest.mark.service(spark=True, SPARK_MASTER="local[1]")``;
* ``start_service``: a factory for tests that need their own fresh warehouse (crash tests,
  restarts, an environment of their own): ``service = start_service(TRACKER_DELTA="0")``.

Helpers shared by test modules are in ``tests/helpers.py``, never in another test module.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from api.run.process import ServiceProcess
from tests.helpers import ServiceStarter

# The services' Delta threads at the event loop's priority, as their Spark process is (see
# ServiceProcess.start): tests wait for what Delta holds, and beside the other test process's
# Spark on 2 cores a Delta thread at the default +19 fell more than 30 s behind. The test of the
# priority itself asks for the default.
os.environ.setdefault("TRACKER_DELTA_NICE", "0")


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    """The process's Spark session on ``local[2]``, shared by every Spark test."""
    from spark_jobs.jars import fetch
    from spark_jobs.session import get_spark

    fetch()  # a no-op once the set-up fetched the jars; makes a bare `pytest` run complete
    yield get_spark("local[2]")


@pytest.fixture
def start_service(tmp_path: Path) -> Iterator[ServiceStarter]:
    """A factory starting services on fresh warehouses (``start_service(**env)``) for one test;
    the first one's warehouse is ``tmp_path / "warehouse"``."""
    starter = ServiceStarter(tmp_path)
    try:
        yield starter
    finally:
        starter.stop_all()


@pytest.fixture(scope="module")
def service(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    """One service shared by the module's tests, started with the module's ``service`` marker's
    keyword arguments (none: the defaults, Spark off)."""
    marker = request.node.get_closest_marker("service")
    starter = ServiceStarter(tmp_path_factory.mktemp(request.module.__name__.rpartition(".")[2]))
    try:
        yield starter(**(marker.kwargs if marker else {}))
    finally:
        starter.stop_all()


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """A standalone master and one 2-core worker, started on first use, stopped at the end."""
    import sys

    from spark_jobs.cluster import start

    cluster = start(tmp_path_factory.mktemp("spark-cluster"), sys.executable)
    try:
        yield cluster
    finally:
        cluster.stop()


# The longest modules (minutes each: Spark sessions, a standalone cluster, subprocess jobs)
# start first, so that the two test processes of `bin/test` finish together instead of one
# of them starting a long module at the end.
_LONG_FIRST = ("test_spark_cluster", "test_spark_cli", "test_api_engine_spark", "test_api_spark_bounds",
               "test_spark_storage", "test_api_spark", "test_spark_jobs", "test_spark_scopes",
               "test_spark_incremental", "test_dashboard", "test_shards_hosts", "test_chaos")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        module = item.nodeid.split("::")[0].rpartition("/")[2].removesuffix(".py")
        return _LONG_FIRST.index(module) if module in _LONG_FIRST else len(_LONG_FIRST)

    items.sort(key=rank)  # stable: the order within a module, and of the rest, is kept
