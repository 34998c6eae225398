"""Arrow columns for the ``progress`` and ``frontier_changes`` tables, decoded from JSON by Arrow.

Every acknowledged update becomes a ``progress`` row and every published frontier change a
``frontier_changes`` row. Building those rows from Python objects cost about a microsecond
each *while holding the GIL*, on a thread beside the event loop: under load that was a tenth of
the service's time. But both already exist as JSON: the request body as received (it is what
the write-ahead log stores) and the change list encoded once per version for the streams. So
the Delta thread hands the JSON to Arrow's reader, which decodes it in C++ without the GIL, and
only the per-batch columns (a few per batch, not per row) are built in Python.

A compiled engine's change list needs no JSON at all: :func:`progress_engine.change_columns`
hands its integers over as buffers, which become Arrow arrays as they are (no copy, no object
per change), and a dataflow's locations are looked up once per flush (:class:`Places`).

The request bodies were decoded once already, by :func:`api.schema.parsing.parse_progress`, which is
what the tracker applied; if Arrow reads one differently (duplicate keys, which Arrow refuses
and ``msgspec`` resolves to the last) the rows would not be what was applied. Each body's row
count and the absence of nulls are therefore checked, and on any doubt the caller falls back
to the Python path (:func:`progress_table` returns ``None``).

>>> body = b'{"worker":"w","seq":0,"updates":[{"location":{"node":1,"port":0,"kind":"target"},"time":[4],"delta":1}]}'
>>> row = progress_table([("df", 1, "w", 0, RawBatch(body, 1), 0.0)]).to_pylist()[0]
>>> row["scope"], row["time"]
([], [4])
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, NamedTuple

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from spark_jobs.tables import TABLES
from tracker.graph import Location

if TYPE_CHECKING:
    from progress_engine import ChangeBatch

_PATH = pa.list_(pa.int32())
_LOCATION = pa.struct([("scope", _PATH), ("node", pa.int32()), ("port", pa.int32()), ("kind", pa.string())])
_TIME = pa.list_(pa.int64())
_UPDATE = pa.struct([("location", _LOCATION), ("time", _TIME), ("delta", pa.int64())])
_CHANGE = pa.struct([("location", _LOCATION), ("time", _TIME), ("diff", pa.int64())])
_BODY = pa.schema([("updates", pa.list_(_UPDATE))])
_CHANGES = pa.schema([("changes", pa.list_(_CHANGE))])


class RawBatch(NamedTuple):
    """A non-empty progress body as received, and how many updates (``progress`` rows) the
    tracker applied from it."""

    body: bytes
    rows: int


class Places(NamedTuple):
    """A compiled engine's locations in its index order, as Arrow columns (built once per
    dataflow): location ``i`` of the engine is ``(node[i], port[i], kind[i])``.

    >>> Places.of([Location.source(0, 0), Location.target(1, 0)]).kind.to_pylist()
    ['source', 'target']
    """

    node: pa.Array
    port: pa.Array
    kind: pa.Array

    @classmethod
    def of(cls, locations: Sequence[Location]) -> Places:
        """The columns of ``locations`` (index ``i`` is ``locations[i]``)."""
        return cls(pa.array([loc.node for loc in locations], pa.int32()),
                   pa.array([loc.port for loc in locations], pa.int32()),
                   pa.array([loc.kind for loc in locations], pa.string()))


ProgressItem = tuple[str, int, str, int, RawBatch, float]
"""``(dataflow_id, version, worker, seq, raw batch, received_at)``."""
NativeChanges = tuple["ChangeBatch", Places]
"""A compiled engine's change list and its engine's locations."""
ChangeItem = tuple[str, int, "str | NativeChanges", float]
"""``(dataflow_id, version, change list encoded as the streams send it (or as the compiled
engine returned it), at)``."""


def progress_table(items: Sequence[ProgressItem]) -> pa.Table | None:
    """The ``progress`` rows of ``items``, or ``None`` if Arrow's reading of a body is in doubt."""
    lines = [_one_line(item[4].body) for item in items]
    try:
        updates = _read(lines, _BODY).column("updates").combine_chunks()
    except pa.ArrowInvalid:
        return None
    expected = pa.array([item[4].rows for item in items], type=pa.int32())
    if not pc.all(pc.equal(pc.list_value_length(updates), expected)).as_py():
        return None
    flat = pc.list_flatten(updates)
    location = flat.field("location")
    rows = {"node": location.field("node"), "port": location.field("port"), "kind": location.field("kind"),
            "time": flat.field("time"), "delta": flat.field("delta")}
    if any(column.null_count for column in rows.values()):
        return None
    rows["scope"] = _root_if_absent(location.field("scope"))
    parents = pc.list_parent_indices(updates)
    per_batch: dict[str, list[object]] = {
                 "dataflow_id": [i[0] for i in items], "version": [i[1] for i in items],
                 "worker": [i[2] for i in items], "seq": [i[3] for i in items],
                 "received_at": [datetime.fromtimestamp(i[5], UTC) for i in items]}
    return _assemble("progress", rows, per_batch, parents)


def changes_table(items: Sequence[ChangeItem]) -> pa.Table:
    """The ``frontier_changes`` rows of ``items`` (change lists this service encoded itself, or
    the compiled engine's), in no particular order."""
    encoded = [item for item in items if isinstance(item[2], str)]
    native = [(d, v, changes, at) for d, v, changes, at in items if not isinstance(changes, str)]
    tables = [_native_changes_table(native)] if native else []
    if encoded or not tables:
        tables.append(_encoded_changes_table(encoded))
    return tables[0] if len(tables) == 1 else pa.concat_tables(tables)


def _native_changes_table(items: Sequence[tuple[str, int, NativeChanges, float]]) -> pa.Table:
    from progress_engine import change_columns

    bases: dict[int, int] = {}  # id(places) -> the index its first location gets in the concatenation
    every: list[Places] = []
    batches: list[ChangeBatch] = []
    batch_bases: list[int] = []
    total = 0
    for item in items:
        batch, where = item[2]
        base = bases.get(id(where))
        if base is None:
            base = bases[id(where)] = total
            every.append(where)
            total += len(where.node)
        batches.append(batch)
        batch_bases.append(base)
    buffers = change_columns(batches, batch_bases)
    batch_offsets, locations, time_offsets, times, diffs = (pa.py_buffer(b) for b in buffers)
    rows = len(locations) // 4
    index = pa.Array.from_buffers(pa.uint32(), rows, [None, locations])
    columns = {name: pa.concat_arrays([getattr(p, name) for p in every]).take(index) for name in Places._fields}
    time = pa.ListArray.from_arrays(pa.Array.from_buffers(pa.int32(), rows + 1, [None, time_offsets]),
                                    pa.Array.from_buffers(pa.int64(), len(times) // 8, [None, times]))
    empty = pa.Array.from_buffers(pa.int32(), rows + 1, [None, pa.py_buffer(bytes(4 * (rows + 1)))])
    root = pa.ListArray.from_arrays(empty, pa.array([], pa.int32()))  # a flat dataflow: every scope is []
    per_batch: dict[str, list[object]] = {
                 "dataflow_id": [i[0] for i in items], "version": [i[1] for i in items],
                 "at": [datetime.fromtimestamp(i[3], UTC) for i in items]}
    offsets = pa.Array.from_buffers(pa.int32(), len(items) + 1, [None, batch_offsets])
    parents = pc.list_parent_indices(pa.ListArray.from_arrays(offsets, index))
    return _assemble("frontier_changes", {"scope": root, **columns, "time": time,
                                          "diff": pa.Array.from_buffers(pa.int64(), rows, [None, diffs])},
                     per_batch, parents)


def _encoded_changes_table(items: Sequence[ChangeItem]) -> pa.Table:
    lines = [f'{{"changes":{item[2]}}}'.encode() for item in items]
    changes = _read(lines, _CHANGES).column("changes").combine_chunks()
    flat = pc.list_flatten(changes)
    location = flat.field("location")
    rows = {"scope": _root_if_absent(location.field("scope")), "node": location.field("node"),
            "port": location.field("port"), "kind": location.field("kind"), "time": flat.field("time"),
            "diff": flat.field("diff")}
    per_batch: dict[str, list[object]] = {
                 "dataflow_id": [i[0] for i in items], "version": [i[1] for i in items],
                 "at": [datetime.fromtimestamp(i[3], UTC) for i in items]}
    return _assemble("frontier_changes", rows, per_batch, pc.list_parent_indices(changes))


def _root_if_absent(scope: pa.Array) -> pa.Array:
    # A location without "scope" (every flat dataflow's, and a nested one's root locations) is
    # the root's: the column says [] rather than null.
    if not scope.null_count:
        return scope
    return pc.if_else(pc.is_null(scope), pa.scalar([], type=_PATH), scope)


def _one_line(body: bytes) -> bytes:
    # A raw CR or LF in valid JSON can only be whitespace (inside strings they must be escaped).
    return body.replace(b"\n", b" ").replace(b"\r", b" ") if b"\n" in body or b"\r" in body else body


def _read(lines: list[bytes], schema: pa.Schema) -> pa.Table:
    data = b"\n".join(lines)
    options = pj.ReadOptions(use_threads=False, block_size=max(1 << 20, len(data) + 1))
    parse = pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
    return pj.read_json(pa.py_buffer(data), read_options=options, parse_options=parse)


def _assemble(table: str, rows: dict[str, pa.Array], per_batch: dict[str, list[object]], parents: pa.Array
              ) -> pa.Table:
    schema = TABLES[table]
    columns = []
    for field in schema:
        if field.name in rows:
            columns.append(rows[field.name].cast(field.type))
        else:
            columns.append(pa.array(per_batch[field.name], type=field.type).take(parents))
    return pa.Table.from_arrays(columns, schema=schema)
