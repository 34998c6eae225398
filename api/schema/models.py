"""Pydantic models for every JSON body of the v1 surface: the documented schemas of the
OpenAPI document (the hot path parses progress bodies with :mod:`api.schema.parsing`, to the same shape).

Integers are strict (``true``, ``1.5`` and ``"3"`` are refused, not coerced) because a silently
coerced time or delta would corrupt occurrence counts; the shapes that depend on the dataflow
(arity, known locations) are checked afterwards against the graph.

Long because: one model per v1 body, all of them the OpenAPI document's schemas, which refer to
each other (locations, blockers, statuses); split, a body's schema would be read in pieces.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    StrictInt,
    StrictStr,
    model_serializer,
)

from tracker.graph import MAX_DELTA, MAX_NODE_ID, Location
from tracker.timestamp import MAX_INCREMENT, MAX_TIME

NonNegInt = StrictInt
MAX_SEQ = 2**63 - 1
"""The largest batch sequence number (stored as a 64-bit integer)."""
Kind = Literal["source", "target"]


# Bounds the OpenAPI document states but the graph checks, so that an id, a time or an
# increment out of range gets the graph's own 422 (``invalid_graph``/``invalid_update``), which
# names the culprit, rather than a generic schema error.
NodeId = Annotated[StrictInt, Field(ge=0, json_schema_extra={"maximum": MAX_NODE_ID})]
TimeCoordinate = Annotated[StrictInt, Field(json_schema_extra={"minimum": 0, "maximum": MAX_TIME})]
Increment = Annotated[StrictInt, Field(json_schema_extra={"minimum": 0, "maximum": MAX_INCREMENT})]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LocationModel(_Model):
    """An operator port: ``{"node": 3, "port": 0, "kind": "target"}``; in a dataflow with nested
    scopes, ``scope`` is the path of scope-node ids from the root (omitted or ``[]``: the root)."""

    scope: list[StrictInt] | None = Field(default=None, max_length=64)
    node: NodeId
    port: StrictInt = Field(ge=0)
    kind: Kind


class PortRef(_Model):
    """One end of an edge: ``{"node", "port"}`` (the kind follows from the side)."""

    node: NodeId
    port: StrictInt = Field(ge=0)


class ConnectionModel(_Model):
    """An internal connection from ``input`` to ``output`` with an antichain of summaries."""

    input: StrictInt = Field(ge=0)
    output: StrictInt = Field(ge=0)
    summaries: list[list[Increment]] = Field(min_length=1, max_length=1024)


class NodeModel(_Model):
    """An operator; omitted ``connections`` means every input reaches every output unchanged."""

    id: NodeId
    name: StrictStr = Field(default="", max_length=200)
    inputs: StrictInt = Field(ge=0, le=4096)
    outputs: StrictInt = Field(ge=0, le=4096)
    connections: list[ConnectionModel] | None = None
    scope: ScopeModel | None = Field(default=None, description="this node is a nested scope (and has no "
                                     "connections of its own: its summaries are computed from its inside)")

    @model_serializer(mode="wrap")
    def _without_null_scope(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """An operator is served back without a ``scope`` key (flat dataflows answer as before)."""
        data: dict[str, Any] = handler(self)
        if data.get("scope", 0) is None:
            del data["scope"]
        return data


class ScopeModel(_Model):
    """A nested scope: ``kind`` ``iterative`` (inner times have one more coordinate) or ``region``;
    inside, node 0 is the boundary (not listed; edges name it to take records in and out)."""

    kind: StrictStr
    nodes: list[NodeModel] = Field(max_length=100_000)
    edges: list[EdgeModel] = Field(default_factory=list, max_length=1_000_000)


class EdgeModel(_Model):
    """A channel from an operator output to an operator input."""

    source: PortRef
    target: PortRef


NodeModel.model_rebuild()


class UpdateModel(_Model):
    """A change to an occurrence count: ``{"location", "time": [..], "delta"}``."""

    location: LocationModel
    time: list[TimeCoordinate] = Field(max_length=64)
    delta: StrictInt = Field(ge=-MAX_DELTA, le=MAX_DELTA)


class RegisterRequest(_Model):
    """Body of ``POST /v1/dataflows``."""

    name: StrictStr = Field(min_length=1, max_length=200)
    timestamp_arity: StrictInt = Field(default=1, ge=1, le=64)
    nodes: list[NodeModel] = Field(max_length=100_000)
    edges: list[EdgeModel] = Field(default_factory=list, max_length=1_000_000)
    initial: list[UpdateModel] | None = None
    last_epoch: StrictInt | None = Field(default=None, ge=0, le=MAX_TIME, description=(
        "the last epoch (first time coordinate) any input will send at, if known: progress estimates then "
        "say when each operator should be done"))


class RegisterResponse(BaseModel):
    """The new dataflow's id and its token (shown once; only its hash is stored)."""

    id: str
    token: str
    endpoint: str = Field(description="the base URL of the dataflow's shard: its routes answer under it too, "
                                      "one hop shorter than through the service's public address")


class ProgressRequest(_Model):
    """An atomic batch of updates from one worker, identified by ``(worker, seq)``.

    A worker's first ``seq`` is 0 and each next batch has the next integer.
    """

    worker: StrictStr = Field(min_length=1, max_length=200)
    seq: StrictInt = Field(ge=0, le=MAX_SEQ)
    updates: list[UpdateModel] = Field(max_length=100_000)


class ProgressResponse(BaseModel):
    """``applied``: this request changed the state; ``duplicate``: it had been applied already."""

    applied: bool
    duplicate: bool
    version: int


class LocationFrontier(BaseModel):
    """One location's frontier: the minimal times that may still appear there."""

    location: LocationModel
    frontier: list[list[int]]


class FrontierResponse(BaseModel):
    """Every (matching) location's frontier as of ``version``."""

    version: int
    locations: list[LocationFrontier]


class PointstampRow(BaseModel):
    """A non-zero occurrence count."""

    location: dict[str, Any] = Field(description="a location (with its `scope` in a nested dataflow)")
    time: list[int]
    count: int


class SummaryRow(BaseModel):
    """``Psi[from, to]``: the minimal summaries of the paths from ``from`` to ``to``."""

    model_config = ConfigDict(populate_by_name=True)

    from_: LocationModel = Field(alias="from")
    to: LocationModel
    summaries: list[list[int]]


State = Literal["running", "complete", "stalled", "violation", "deleted"]


class Violation(BaseModel):
    """A negative occurrence count that no live pointstamp explains: its time is not at or above
    its location's frontier (a message consumed twice, a capability dropped twice)."""

    location: dict[str, Any] = Field(description="a location (with its `scope` in a nested dataflow)")
    time: list[int]
    count: int


class Regression(BaseModel):
    """An update that moved a frontier backwards: a pointstamp at a time its location's frontier
    did not allow (nothing held could have produced it), and the version that applied it."""

    location: dict[str, Any] = Field(description="a location (with its `scope` in a nested dataflow)")
    time: list[int]
    version: int


class DataflowStatus(BaseModel):
    """What the service knows about a dataflow: its lifecycle state (``api.live.lifecycle``) and more."""

    state: State = Field(description="running; complete once every frontier is empty; stalled when live "
                         "pointstamps saw no frontier change for TRACKER_STALL_SECONDS; violation when an update moved "
                         "a frontier backwards, or a count is negative and no live pointstamp explains it (its time is "
                         "not at or above its location's frontier); deleted")
    deleted_at: str | None = None
    last_frontier_change_at: str | None = None
    last_batch_at: str | None = None
    violation_count: int = 0
    violations: list[Violation] = Field(default_factory=list, description="the first 20, sorted by location")
    regression_count: int = Field(default=0, description="updates that moved a frontier backwards (since the "
                                  "service started)")
    regressions: list[Regression] = Field(default_factory=list, description="the first 20 of them")
    spark_check: str = Field(description="pending | running | agreed | disagreed | skipped | timed_out | error")
    spark_detail: str | None = None
    audit: dict[str, Any] | None = Field(default=None, description="last Spark audit of the live frontier")
    durable_version: int = 0
    frontier_version: int = Field(default=0, description="the version the frontier is exact for; with "
                                  "--engine spark it may trail durable_version (-1: not computed yet)")
    engine: str = "native"
    graph_stored: bool = Field(default=False, description="the graph tables (and, without Spark, the native "
                               "Psi) have been written to Delta")
    delta_version: int = Field(default=0, description="highest version in the Delta progress table")
    workers: dict[str, int] = Field(default_factory=dict, description="last seq per worker")
    lane: dict[str, Any] = Field(default_factory=dict, description=(
        "`in_lane`: its batches propagate in a thread of its own (they are costly); `queued`: batches waiting "
        "there (at TRACKER_LANE_BACKLOG, new batches are refused 429 dataflow_busy); `batches`: batches "
        "propagated there since the service started"))


class DataflowSummary(BaseModel):
    """A dataflow in the listing."""

    id: str
    name: str
    timestamp_arity: int
    version: int
    created_at: str
    state: State


class ListedDataflow(BaseModel):
    """A dataflow in ``GET /v1/dataflows``: a hosted one, or one recovery refused (state
    ``damaged``: ``detail`` says why; its routes answer 503 ``dataflow_damaged``; what its
    registration did not tell is ``null``)."""

    id: str
    name: str | None
    timestamp_arity: int | None
    version: int | None
    created_at: str | None
    state: State | Literal["damaged"]
    detail: str | None = Field(default=None, description="why a damaged dataflow was refused at recovery")


class DataflowDetail(DataflowSummary):
    """A dataflow with its graph and status."""

    nodes: list[NodeModel]
    edges: list[EdgeModel]
    initial: list[UpdateModel] | None = Field(default=None, description=(
        "the initial pointstamps as registered (`null`: none were named, so each output of each root input "
        "holds one capability at time zero)"))
    last_epoch: int | None = Field(default=None, description="the inputs' last epoch, as registered")
    endpoint: str = Field(description="the base URL of the dataflow's shard (see the registration's answer)")
    status: DataflowStatus


class PathStep(BaseModel):
    """One transition on a path: an edge (zero summary) or an internal connection."""

    model_config = ConfigDict(populate_by_name=True)

    from_: LocationModel = Field(alias="from")
    to: LocationModel
    summary: list[int]
    time: list[int] = Field(description="the blocker's time as it arrives at `to` along this path")
    via: Literal["edge", "operator", "ingress", "egress"] | None = Field(
        default=None, description="nested dataflows only: what the step is (ingress appends a 0 coordinate, "
                                  "egress drops the last one)")


StallKind = Literal["held_capability", "unconsumed_messages", "undrained_count"]
STALL_KIND_DOC = ("what the pointstamp is: held_capability (at an operator output: a capability kept), "
                  "unconsumed_messages (at an input: messages sent and not yet consumed), undrained_count (at an "
                  "input, and every worker has reported since it appeared: a count that does not drain, messages "
                  "kept unread or miscounted)")


class Blocker(BaseModel):
    """An active pointstamp that holds a (location, time) back, and why."""

    location: LocationModel
    time: list[int]
    count: int
    summary: list[int] | None = Field(description="a minimal path summary s with s(time) <= the queried time "
                                      "(null in a nested dataflow when the path crosses scopes)")
    arrives_as: list[int] = Field(description="s(time): the earliest time it can reach the queried location as")
    path: list[PathStep]
    text: str
    operator: str = Field(description="the name of the operator holding the pointstamp ('operator N' if unnamed)")
    port: str = Field(description="its port: 'in p' or 'out p' ('enter p' / 'leave p' on a scope's boundary)")
    worker: str | None = Field(description="the worker whose batch last changed its count (null: an initial "
                                           "pointstamp, or one recovered from a compacted snapshot)")
    age_seconds: float | None = Field(description="wall-clock seconds since its count left zero")
    age_at_least: bool = Field(default=False, description="the age counts from a restart from a compacted "
                               "snapshot (it was live before it): it is at least that")
    stall_kind: StallKind = Field(description=STALL_KIND_DOC)


class ExplainResponse(BaseModel):
    """Why a notification at (location, time) is or is not safe yet."""

    version: int
    location: LocationModel
    time: list[int]
    safe_to_notify: bool
    frontier: list[list[int]]
    blocker_count: int = Field(default=0, description="how many active pointstamps hold it back (the first 50 "
                               "are listed)")
    blockers: list[Blocker]
    explanation: str


class OldestPointstamp(BaseModel):
    """The live pointstamp of a location that appeared first."""

    time: list[int]
    worker: str | None = Field(description="the worker whose batch last changed its count (null: an initial "
                                           "pointstamp, or one recovered from a compacted snapshot)")
    age_seconds: float = Field(description="wall-clock seconds since its count left zero")
    age_at_least: bool = Field(default=False, description="the age counts from a restart from a compacted "
                               "snapshot (it was live before it): it is at least that")
    stall_kind: StallKind = Field(description=STALL_KIND_DOC)


class LagRow(BaseModel):
    """One location's frontier and how long it has been waiting."""

    location: LocationModel
    operator: str
    port: str = Field(description="'in p' or 'out p' ('enter p' / 'leave p' on a scope's boundary)")
    frontier: list[list[int]]
    lag_seconds: float | None = Field(description="wall-clock seconds since the frontier last changed; null when "
                                                  "it is empty (nothing more can arrive: nothing is awaited)")
    changed_at: float = Field(description="when it last changed (epoch seconds; the registration, or the last "
                                          "restart from a compacted snapshot, if it has not since)")
    lag_at_least: bool = Field(default=False, description="the frontier has not changed since a restart from a "
                               "compacted snapshot: the lag counts from the restart and is at least that")
    oldest_pointstamp: OldestPointstamp | None


class LagResponse(BaseModel):
    """Every location's lag as of one published version."""

    version: int
    at: float = Field(description="when this was computed (epoch seconds)")
    max_lag_seconds: float | None = Field(description="the largest lag_seconds (null when every frontier is empty)")
    max_lag_at_least: bool = Field(default=False, description="the largest lag is a lower bound (lag_at_least)")
    locations: list[LagRow]


class OperatorEstimate(BaseModel):
    """How fast one operator's epoch advances and when it should be done (``api.ops.estimate``)."""

    scope: list[int] | None = Field(default=None, description="its scope path (absent at the root)")
    node: int
    operator: str
    epoch: int | None = Field(description="the earliest epoch still open at its inputs, else (every input frontier "
                              "empty) the earliest it still holds at its outputs (null: done)")
    state: Literal["done", "estimated", "unknown"] = Field(
        description="done: every input and output frontier is empty (nothing can reach it, it holds nothing); "
                    "estimated: the rate is known and not 0; unknown: see reason")
    epochs_per_second: float | None = Field(description="epochs cleared per second over the window (null: unknown, "
                                                        "0: not advancing)")
    eta_seconds: float | None = Field(description="expected seconds until it is done (needs the last epoch and "
                                                  "a known rate)")
    reason: str | None = Field(description="why the rate or the expected time is unknown")


class ProgressEstimate(BaseModel):
    """Every operator's rate and expected time to done, as of one published version."""

    version: int
    at: float = Field(description="when this was computed (epoch seconds)")
    window_seconds: float = Field(description="the window the rates are measured over")
    last_epoch: int | None = Field(description="the inputs' last epoch, if known")
    last_epoch_source: Literal["declared", "inputs closed"] | None = Field(
        description="declared at registration, or the latest live epoch once every input is closed")
    operators: list[OperatorEstimate]


class ScopeSummaryRow(BaseModel):
    """A nested scope's summaries as an operator, from ``input`` to ``output``, in the parent's time."""

    input: int
    output: int
    summaries: list[list[int]]


class ScopeInfo(BaseModel):
    """A nested scope: its path, kind, the arity of its times and its summaries."""

    scope: list[int]
    kind: str
    arity: int
    summaries: list[ScopeSummaryRow]


class ErrorBody(BaseModel):
    """Every 4xx answer: a machine-readable ``error`` and a human ``detail``."""

    model_config = ConfigDict(extra="allow")

    error: str
    detail: Any = None


def location_json(location: Location) -> dict[str, Any]:
    """A core location as its JSON shape (faster than going through the model)."""
    return {"node": location.node, "port": location.port, "kind": location.kind}
