"""The session factory: one cached session, small shuffles, AQE off, checkpoint dir; JVM packages
detected by loading their classes (and the optional paths compared when they are present)."""

from __future__ import annotations

import pytest

from spark_jobs.cycles import find_cycles
from spark_jobs.frames import transitions_of
from spark_jobs.session import _has_class, get_spark, has_delta_jvm, has_graphframes_jvm, resolve_master
from tests.helpers import chain
from tracker.graph import Edge, Graph, Location, Node

pytestmark = pytest.mark.spark


def test_session_is_shared_and_configured(spark, monkeypatch) -> None:
    assert get_spark() is spark
    assert spark.conf.get("spark.sql.shuffle.partitions") == "4"
    assert spark.conf.get("spark.sql.adaptive.enabled") == "false"
    assert spark.sparkContext.getCheckpointDir()
    monkeypatch.setenv("SPARK_MASTER", "spark://elsewhere:7077")
    assert resolve_master(None) == "spark://elsewhere:7077" and resolve_master("local[3]") == "local[3]"
    monkeypatch.delenv("SPARK_MASTER")
    assert resolve_master(None) == "local[*]"


def test_jvm_detection_loads_classes(spark) -> None:
    assert _has_class(spark, "java.lang.String") is True
    assert _has_class(spark, "org.example.DoesNotExist") is False
    assert isinstance(has_delta_jvm(spark), bool) and isinstance(has_graphframes_jvm(spark), bool)


def test_delta_spark_is_loaded_from_the_fetched_jars(spark) -> None:
    from spark_jobs.jars import jar_paths

    assert has_delta_jvm(spark), "the set-up fetches delta-spark from Maven Central"
    loaded = spark.conf.get("spark.jars")
    assert jar_paths() and all(p in loaded for p in jar_paths())
    assert spark.conf.get("spark.sql.extensions") == "io.delta.sql.DeltaSparkSessionExtension"


def test_graphframes_is_recorded_as_not_served_and_graphx_runs_instead(spark) -> None:
    """GraphFrames' JVM package is not served (the manifest says so, never silently); the cycle
    check runs on GraphX through the helper, and agrees with the DataFrame path."""
    from spark_jobs.jars import installed_coordinates, manifest
    from spark_jobs.session import graph_engine

    bad = Graph.build(
        1,
        [Node(0, 1, 1), Node(1, 1, 1)],
        [Edge(Location.source(0, 0), Location.target(1, 0)), Edge(Location.source(1, 0), Location.target(0, 0))],
    )
    if not has_graphframes_jvm(spark):
        found = manifest()
        assert found is not None and installed_coordinates()[1] in found["not_served"], found
    assert graph_engine(spark).startswith("graphx")
    for graph in (bad, chain(3)):
        transitions = transitions_of(spark, graph)
        ours = sorted(map(tuple, find_cycles(transitions, engine="dataframe").collect()))
        theirs = sorted(map(tuple, find_cycles(transitions, engine="graphx").collect()))
        assert ours == theirs
    assert len(find_cycles(transitions_of(spark, bad)).collect()) == 4
