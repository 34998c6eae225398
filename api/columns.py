"""Arrow columns for the ``progress`` and ``frontier_changes`` tables, decoded from JSON by Arrow.

Every acknowledged update becomes a ``progress`` row and every published frontier change a
``frontier_changes`` row. Building those rows from Python objects cost about a microsecond
each *while holding the GIL*, on a thread beside the event loop: under load that was a tenth of
the service's time. But both already exist as JSON: the request body as received (it is what
the write-ahead log stores) and the change list encoded once per version for the streams. So
the Delta thread hands the JSON to Arrow's reader, which decodes it in C++ without the GIL, and
only the per-batch columns (a few per batch, not per row) are built in Python.

The request bodies were decoded once already, by :func:`api.parsing.parse_progress`, which is
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
from typing import NamedTuple

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from spark_jobs.tables import TABLES

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


ProgressItem = tuple[str, int, str, int, RawBatch, float]
"""``(dataflow_id, version, worker, seq, raw batch, received_at)``."""
ChangeItem = tuple[str, int, str, float]
"""``(dataflow_id, version, encoded change list, at)``."""


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
    """The ``frontier_changes`` rows of ``items`` (change lists this service encoded itself)."""
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
