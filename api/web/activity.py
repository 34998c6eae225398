"""Why slow: the routes of a program's statistics (busy time per operator, messages and records
per channel), as a timely program's connector sends them (``Attach::statistics``).

Guarantees: a report is accepted only for a dataflow the caller may access (the program token
for the dataflows it registered, the dataflow's own token, the admin token), whole or not at
all: a body without the report's shape is 400/422 (FastAPI's validation, answered as every
route answers it) and one naming an operator or channel the
dataflow does not have is 422 ``unknown_location``, and neither changes anything; an accepted
report is kept in memory (:mod:`api.live.activity`) and queued for the Delta tables
``operator_stats`` and ``channel_stats`` (:mod:`api.delta.activity`). Nothing here touches the
progress path: a report is its own request, parsed and kept on the event loop in microseconds.
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, HTTPException

from api.host.ingest import gone
from api.host.tenant import Tenant
from api.live.activity import Activity, Shape
from api.schema.activity import ActivityReport
from api.web.deps import DataflowDep, ServiceDep
from api.web.params import ERRORS

router = APIRouter(prefix="/v1")


def shape_of(tenant: Tenant) -> Shape:
    """The operators and channels of a dataflow, every scope's (boundaries are not operators)."""
    if tenant.hosting is None:
        return Shape.of([((), tenant.graph, frozenset())])
    return Shape.of([(path, scope.graph, scope.children) for path, scope in tenant.hosting.nested.scopes.items()])


def activity_of(tenant: Tenant) -> Activity:
    """The dataflow's statistics (an empty one, kept, before its first report)."""
    if tenant.activity is None:
        tenant.activity = Activity(shape_of(tenant))
    return tenant.activity


@router.post("/dataflows/{id}/stats", summary="Report a worker's statistics",
             responses={**ERRORS, 410: {"description": "the dataflow was deleted"}})
async def report_activity(report: ActivityReport, dataflow: DataflowDep, service: ServiceDep) -> dict[str, Any]:
    """One worker's statistics over an interval (body ``ActivityReport``): per operator the
    nanoseconds the worker spent in it and its schedules, per channel the messages and records
    the worker sent on it. 200 ``{"accepted": true, "reports": n}``; 410 once the dataflow is
    deleted; 422 ``unknown_location`` for an operator or channel the dataflow does not have."""
    if dataflow.deleted_at is not None:
        raise gone(dataflow)
    activity = activity_of(dataflow)
    problem = activity.problem(report)
    if problem is not None:
        service.metrics.activity_refused.inc()
        raise HTTPException(422, {"error": "unknown_location", "detail": problem})
    now = time.time()
    activity.add(report, now)
    service.syncer.activity.add(dataflow.id, now, report)
    service.metrics.activity_accepted.inc()
    return {"accepted": True, "reports": activity.reports}


@router.get("/dataflows/{id}/stats", summary="Why slow: busy operators and busy channels", responses=ERRORS)
async def activity(dataflow: DataflowDep) -> dict[str, Any]:
    """The program's statistics over the last 10 s of reports and in total: every operator with
    its busy share (of the workers' time) busiest first (scopes, whose time includes their
    operators', after the operators), every channel that carried records with its records and
    messages per second, most first; ``reports`` 0 while the program sends none (statistics
    off)."""
    return activity_of(dataflow).view()
