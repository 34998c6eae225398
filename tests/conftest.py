"""Shared fixtures: one Spark session for the whole suite (starting one costs ~5 s)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    """The process's Spark session on ``local[2]``, shared by every Spark test."""
    from spark_jobs.session import get_spark

    yield get_spark("local[2]")
