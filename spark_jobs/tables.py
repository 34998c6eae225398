"""The Delta tables' schemas and the conversion of rows to them.

``dataflow_id`` is a string everywhere; locations are ``scope ARRAY<INT>`` (the scope-node ids
from the root, empty for the root), ``node INT, port INT, kind STRING``; times and summaries
``ARRAY<BIGINT>`` (the arity of the location's scope); timestamps microseconds in UTC.

>>> TABLES["frontiers"].names
['dataflow_id', 'scope', 'node', 'port', 'kind', 'time', 'since']
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any, TypeAlias

import pyarrow as pa

_INT = pa.int32()
_LONG = pa.int64()
_STR = pa.string()
_ARR = pa.list_(pa.int64())
_TS = pa.timestamp("us", tz="UTC")
_PATH = pa.list_(pa.int32())
_SCOPE = ("scope", _PATH)
_LOC = [_SCOPE, ("node", _INT), ("port", _INT), ("kind", _STR)]

TABLES: dict[str, pa.Schema] = {
    "dataflows": pa.schema(
        [
            ("dataflow_id", _STR),
            ("name", _STR),
            ("timestamp_arity", _INT),
            ("graph_version", _LONG),
            ("created_at", _TS),
            ("deleted_at", _TS),
        ]
    ),
    "scopes": pa.schema([("dataflow_id", _STR), _SCOPE, ("kind", _STR), ("arity", _INT)]),
    "nodes": pa.schema(
        [("dataflow_id", _STR), _SCOPE, ("node", _INT), ("name", _STR), ("inputs", _INT), ("outputs", _INT),
         ("is_scope", pa.bool_())]
    ),
    "connections": pa.schema(
        [("dataflow_id", _STR), _SCOPE, ("node", _INT), ("input_port", _INT), ("output_port", _INT), ("summary", _ARR)]
    ),
    "edges": pa.schema(
        [("dataflow_id", _STR), _SCOPE, ("src_node", _INT), ("src_port", _INT), ("dst_node", _INT),
         ("dst_port", _INT)]
    ),
    "summaries": pa.schema(
        [
            ("dataflow_id", _STR),
            _SCOPE,
            ("from_node", _INT),
            ("from_port", _INT),
            ("from_kind", _STR),
            ("to_node", _INT),
            ("to_port", _INT),
            ("to_kind", _STR),
            ("summary", _ARR),
        ]
    ),
    "progress": pa.schema(
        [
            ("dataflow_id", _STR),
            ("version", _LONG),
            ("worker", _STR),
            ("seq", _LONG),
            *_LOC,
            ("time", _ARR),
            ("delta", _LONG),
            ("received_at", _TS),
        ]
    ),
    "pointstamps": pa.schema([("dataflow_id", _STR), *_LOC, ("time", _ARR), ("count", _LONG), ("born_at", _TS),
                              ("worker", _STR)]),
    "frontiers": pa.schema([("dataflow_id", _STR), *_LOC, ("time", _ARR), ("since", _TS)]),
    "frontier_changes": pa.schema(
        [("dataflow_id", _STR), ("version", _LONG), *_LOC, ("time", _ARR), ("diff", _LONG), ("at", _TS)]
    ),
    "operator_stats": pa.schema(
        [("dataflow_id", _STR), ("worker", _STR), ("at", _TS), ("seconds", pa.float64()), _SCOPE, ("node", _INT),
         ("busy_ns", _LONG), ("schedules", _LONG)]
    ),
    "channel_stats": pa.schema(
        [("dataflow_id", _STR), ("worker", _STR), ("at", _TS), ("seconds", pa.float64()), _SCOPE,
         ("src_node", _INT), ("src_port", _INT), ("dst_node", _INT), ("dst_port", _INT), ("messages", _LONG),
         ("records", _LONG)]
    ),
}
"""Every table's Arrow schema, exactly as stored."""

ADDED_COLUMNS: dict[str, tuple[str, ...]] = {"pointstamps": ("born_at", "worker"), "frontiers": ("since",)}
"""Columns added to tables after their first release: nullable, so a table written before them
is upgraded in place (:meth:`spark_jobs.storage.Warehouse.check_layout`), its old rows null
there (their ages unknown)."""
_NOW_COLUMNS = ("created_at", "received_at", "at")
_DEFAULTS: dict[str, Any] = {"scope": [], "deleted_at": None, "is_scope": False}
"""Columns a writer may leave out: the root scope, not deleted, not a scope node (and the
:data:`ADDED_COLUMNS` of their tables: unknown)."""


def _defaults(table: str) -> dict[str, Any]:
    return {**_DEFAULTS, **dict.fromkeys(ADDED_COLUMNS.get(table, ()))}


Rows: TypeAlias = pa.Table | Iterable[Mapping[str, Any]]


def to_arrow(table: str, rows: Rows) -> pa.Table:
    """``rows`` (Arrow or dicts) as an Arrow table of ``table``'s exact schema.

    Missing timestamp columns (``created_at``, ``received_at``, ``at``) are filled with now,
    a missing ``scope`` with the root's ``[]`` (so a flat dataflow's writer need not name it),
    ``deleted_at`` with null, ``is_scope`` with false and the ages (``born_at``, ``worker``,
    ``since``) with null.

    >>> to_arrow("frontiers", [{"dataflow_id": "d", "node": 1, "port": 0, "kind": "target", "time": [3]}]).num_rows
    1
    """
    schema = schema_of(table)
    defaults = _defaults(table)
    now = datetime.now(UTC)
    if isinstance(rows, pa.Table):
        columns = []
        for field in schema:
            if field.name in rows.column_names:
                columns.append(rows.column(field.name).cast(field.type))
            elif field.name in _NOW_COLUMNS:
                columns.append(pa.array([now] * rows.num_rows, type=field.type))
            elif field.name in defaults:
                columns.append(pa.array([defaults[field.name]] * rows.num_rows, type=field.type))
            else:
                raise ValueError(f"{table}: missing column {field.name}")
        return pa.Table.from_arrays(columns, schema=schema)
    filled = []
    for row in rows:
        row = dict(row)
        for name in _NOW_COLUMNS:
            if name in schema.names and row.get(name) is None:
                row[name] = now
        for name, value in defaults.items():
            if name in schema.names and name not in row:
                row[name] = value
        missing = [n for n in schema.names if n not in row]
        if missing:
            raise ValueError(f"{table}: row {row!r} lacks {missing}")
        filled.append(row)
    return pa.Table.from_pylist(filled, schema=schema)


def with_dataflow_id(rows: pa.Table, dataflow_id: str) -> pa.Table:
    """``rows`` with every row's ``dataflow_id`` set: rows built once for a graph shape, given
    to each dataflow of that shape.

    >>> with_dataflow_id(pa.table({"dataflow_id": ["", ""], "x": [1, 2]}), "d").column("dataflow_id").to_pylist()
    ['d', 'd']
    """
    column = rows.schema.get_field_index("dataflow_id")
    return rows.set_column(column, "dataflow_id", pa.array([dataflow_id] * rows.num_rows, pa.string()))


def missing_columns(table: str, stored: Iterable[str]) -> list[str]:
    """The columns of ``table``'s schema that a stored table's schema lacks (a warehouse written
    by an older version of this project: before scopes, ``scope`` is missing everywhere).

    >>> missing_columns("frontiers", ["dataflow_id", "node", "port", "kind", "time"])
    ['scope', 'since']
    """
    have = set(stored)
    return [name for name in schema_of(table).names if name not in have]


def schema_of(table: str) -> pa.Schema:
    """``table``'s schema; ``ValueError`` naming the known tables for any other name."""
    if table not in TABLES:
        raise ValueError(f"unknown table {table!r}; tables are {sorted(TABLES)}")
    return TABLES[table]
