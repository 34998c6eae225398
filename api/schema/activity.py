"""The body of ``POST /v1/dataflows/{id}/stats``: one worker's statistics over one interval (or
several, merged while the service was out of reach), as a timely program's connector sends them.

Guarantee: a valid :class:`ActivityReport` has every number non-negative and within the
tables' integer types, a positive interval and at most :data:`MAX_ENTRIES` operators and
channels (the route answers any other body 400 or 422, as every route does); whether its
operators and channels are the dataflow's is checked against the graph
(:mod:`api.live.activity`).

>>> report = ActivityReport.model_validate_json(b'{"worker": "w0", "seconds": 1.0, "busy_ns": 5, "operators": '
...                                             b'[{"scope": [], "node": 2, "busy_ns": 5, "schedules": 1}]}')
>>> report.operators[0].node, report.seconds, report.channels
(2, 1.0, [])
>>> from pydantic import ValidationError
>>> try:
...     ActivityReport.model_validate_json(b'{"worker": "w0", "seconds": 0}')
... except ValidationError as error:
...     print(error.errors()[0]["loc"], error.errors()[0]["type"])
('seconds',) greater_than
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

MAX_ENTRIES = 20_000
"""Operators, and channels, one report may name (a body stays far under the 1 MiB limit)."""
_NODE = Annotated[int, Field(ge=0, le=2**31 - 1)]
_COUNT = Annotated[int, Field(ge=0, le=2**63 - 1)]
_SCOPE = Annotated[list[_NODE], Field(max_length=64, description="the scope path, [] for the root")]


class OperatorActivity(BaseModel):
    """One operator's share of the interval: nanoseconds the worker spent in it, and how many
    times it was scheduled. A scope's time includes its operators'."""

    model_config = ConfigDict(extra="forbid")
    scope: _SCOPE = []
    node: _NODE
    busy_ns: _COUNT
    schedules: _COUNT = 0


class ChannelActivity(BaseModel):
    """One channel's traffic in the interval: messages and records its source sent on it."""

    model_config = ConfigDict(extra="forbid")
    scope: _SCOPE = []
    source: tuple[_NODE, _NODE] = Field(description="[node, output port]")
    target: tuple[_NODE, _NODE] = Field(description="[node, input port]")
    messages: _COUNT
    records: _COUNT


class ActivityReport(BaseModel):
    """One worker's statistics of one dataflow over ``seconds`` of its time."""

    model_config = ConfigDict(extra="forbid")
    worker: str = Field(min_length=1, max_length=64)
    seconds: float = Field(gt=0, le=86_400, description="the worker time the report covers")
    busy_ns: _COUNT = Field(0, description="nanoseconds the worker spent in the dataflow as a whole")
    operators: list[OperatorActivity] = Field(default_factory=list, max_length=MAX_ENTRIES)
    channels: list[ChannelActivity] = Field(default_factory=list, max_length=MAX_ENTRIES)

