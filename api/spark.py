"""The Spark side of the service: the shared session, and what Spark knows of each dataflow.

Guarantees: Spark never runs on the event loop or on the request path; every Spark job runs on
the one ``spark`` thread (:attr:`Spark.pool`), so a slow job delays only other Spark jobs, and
the session's start (5-10 s) delays nothing but them. The service works without Spark and says
so (:meth:`Spark.health`).

>>> state = SparkState()
>>> state.check, state.audit
('pending', None)
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from api.live import Counts
from api.publish import Publication
from tracker.graph import Graph, Update

log = logging.getLogger("tracker.spark")


@dataclass(eq=False)
class SparkState:
    """What Spark knows of one dataflow: its registration check (:mod:`api.checks`), its last
    audit (:mod:`api.audit`) and, with ``--engine spark``, the batches queued for the next
    micro-batch and the engine running them (:mod:`api.microbatch`)."""

    check: str = "pending"
    """pending | agreed | disagreed | skipped | error"""
    detail: str | None = None
    audit: dict[str, Any] | None = None
    queue: list[tuple[int, list[Update]]] = field(default_factory=list)
    engine: Any = None  # spark_jobs.incremental.SparkFrontierEngine, made on the spark thread
    audited: bool = True
    """False for a dataflow with nested scopes: Spark's jobs know no scopes yet (no check, no audit)."""


class Hosted(Protocol):
    """What the Spark tasks read of a dataflow."""

    @property
    def id(self) -> str: ...
    @property
    def graph(self) -> Graph: ...
    @property
    def ready(self) -> bool: ...
    @property
    def spark(self) -> SparkState: ...
    @property
    def publication(self) -> Publication: ...

    def counts(self) -> Counts:
        """Occurrence counts as of the published frontier's version."""
        ...


class Spark:
    """The shared Spark session, started in the background, and the thread its jobs run on."""

    def __init__(self, master: str | None, *, enabled: bool) -> None:
        self.master = master
        self.enabled = enabled
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="spark")
        self.session: Any = None  # a pyspark SparkSession once started
        self.error: str | None = None

    def start(self) -> None:
        """Start the session (about 5-10 s); runs on :attr:`pool` at start-up."""
        try:
            from spark_jobs.session import get_spark

            started = time.perf_counter()
            self.session = get_spark(self.master)
            log.info("spark session ready", extra={"seconds": round(time.perf_counter() - started, 2)})
        except Exception as error:  # the service works without Spark; say so in the status
            self.error = f"{type(error).__name__}: {error}"
            log.exception("spark session failed to start")

    def health(self) -> str:
        """``ready``, the start-up error, ``starting`` or ``disabled`` (for ``/healthz``)."""
        if self.session is not None:
            return "ready"
        return self.error or ("starting" if self.enabled else "disabled")
