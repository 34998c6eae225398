"""The messages between a hot-path process and the Spark process, as ``msgspec`` structs in one
tagged union per direction (the tag is the ``"t"`` field), encoded with MessagePack.

Locations travel as ``(node, port, kind)``, times as lists of ints, counts and changes as rows;
the helpers below convert them.

>>> from tracker.graph import Location
>>> row = change_row(Location(1, 0, "target"), (2, 0), -1)
>>> row, from_change_row(row)
((1, 0, 'target', (2, 0), -1), (Location(node=1, port=0, kind='target'), (2, 0), -1))
>>> decode_to_spark(encode(Check(df="d1")))
Check(df='d1')
"""

from __future__ import annotations

from typing import Any

import msgspec

from api.schema.spec import Spec
from tracker.graph import Location
from tracker.timestamp import Timestamp

Row = tuple[int, int, str, tuple[int, ...], int]
"""A location, a time and a count (or a diff): ``(node, port, kind, time, n)``."""


# -- to the Spark process ---------------------------------------------------------------------

class Hello(msgspec.Struct, frozen=True, tag="hello", tag_field="t"):
    """First message of a hot-path process on every connect: who it is."""

    pid: int
    role: str = "hot"


class Know(msgspec.Struct, frozen=True, tag="know", tag_field="t"):
    """Desired state: a dataflow whose graph the Spark process must know (replayed on every connect).
    ``spec`` is the registration as logged, scopes nested in their nodes: the Spark process
    builds a dataflow with nested scopes from it as the hot path does."""

    df: str
    spec: Spec


class Forget(msgspec.Struct, frozen=True, tag="forget", tag_field="t"):
    """The dataflow was deleted: drop its graph and engine."""

    df: str


class Check(msgspec.Struct, frozen=True, tag="check", tag_field="t"):
    """Run the registration check of a known dataflow (batched with others waiting)."""

    df: str


class Audit(msgspec.Struct, frozen=True, tag="audit", tag_field="t"):
    """Compare Spark's from-scratch frontier of ``counts`` with ``live``, both as of ``version``.

    For a dataflow with nested scopes the rows name real locations of their scopes: ``scopes[i]``
    is the scope path of ``counts[i]`` and ``live_scopes[i]`` that of ``live[i]`` (``None`` for a
    flat dataflow, whose rows are root locations)."""

    df: str
    version: int
    counts: list[Row]
    live: list[tuple[int, int, str, list[tuple[int, ...]]]]
    scopes: list[list[int]] | None = None
    live_scopes: list[list[int]] | None = None


class MicroBatch(msgspec.Struct, frozen=True, tag="microbatch", tag_field="t"):
    """``--engine spark``: apply ``updates`` (through ``version``); ``reset``: start a new engine
    from them (they are then the dataflow's whole counts)."""

    df: str
    version: int
    updates: list[Row]
    reset: bool = False


ToSpark = Hello | Know | Forget | Check | Audit | MicroBatch


# -- to the hot path ------------------------------------------------------------------------------

class Status(msgspec.Struct, frozen=True, tag="status", tag_field="t"):
    """The Spark process's state: ``starting``, ``ready``, or why its session failed; sent on
    connect and whenever it changes. ``graph_engine``: the graph engine its session runs, as
    :func:`spark_jobs.session.graph_engine` says it (``"graphx (helper <jar>)"``, ``"dataframe
    (TRACKER_GRAPH_ENGINE=dataframe)"``), empty until the session is up."""

    pid: int
    state: str
    jvm: int | None = None
    pyspark: bool = True
    master: str = ""
    nice: int = 0
    graph_engine: str = ""


class Running(msgspec.Struct, frozen=True, tag="running", tag_field="t"):
    """These dataflows' checks are running now."""

    dfs: list[str]


class Checked(msgspec.Struct, frozen=True, tag="checked", tag_field="t"):
    """A concluded check: ``agreed``, ``disagreed``, ``timed_out`` or ``error``."""

    df: str
    result: str
    detail: str


class Audited(msgspec.Struct, frozen=True, tag="audited", tag_field="t"):
    """An audit's result (the ``status.audit`` object); ``stop``: do not audit this dataflow again."""

    df: str
    version: int
    audit: dict[str, Any]
    stop: bool = False


class Applied(msgspec.Struct, frozen=True, tag="applied", tag_field="t"):
    """A micro-batch's frontier changes (from the empty frontier after a reset), or its error."""

    df: str
    version: int
    changes: list[Row]
    reset: bool = False
    error: str | None = None


ToHot = Status | Running | Checked | Audited | Applied

_ENCODER = msgspec.msgpack.Encoder()
_TO_SPARK = msgspec.msgpack.Decoder(ToSpark)
_TO_HOT = msgspec.msgpack.Decoder(ToHot)


def encode(message: ToSpark | ToHot) -> bytes:
    """A message's MessagePack bytes (without the frame's length)."""
    return _ENCODER.encode(message)


def decode_to_spark(data: bytes) -> ToSpark:
    """A message for the Spark process; ``msgspec.ValidationError`` if it is none."""
    return _TO_SPARK.decode(data)


def decode_to_hot(data: bytes) -> ToHot:
    """A message for a hot-path process; ``msgspec.ValidationError`` if it is none."""
    return _TO_HOT.decode(data)


def change_row(location: Location, time: Timestamp, n: int) -> Row:
    """A location, time and count (or diff) as a row."""
    return (location.node, location.port, location.kind, tuple(time), n)


def from_change_row(row: Row) -> tuple[Location, Timestamp, int]:
    """A row back as ``(Location, time, n)``."""
    node, port, kind, time, n = row
    return Location(node, port, kind), tuple(time), n  # type: ignore[arg-type]  # kind: checked by the sender
