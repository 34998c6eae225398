"""The history views: the warehouse's Delta tables under their own names (``frontier_changes``,
``progress``, ``nodes``...; docs/tables.md), read through delta-rs's Arrow datasets.

Each view is the table's current Delta version, opened when a query names it (off the event
loop: opening reads the table's log) and scanned by DuckDB through Arrow, which prunes
partitions and columns; a table not written yet is an empty view of its schema. Confined to
one dataflow, a view holds only that dataflow's files (its ``dataflow_id`` partition) and, to
be sure, only its rows: nothing of another dataflow is reachable from the query.

>>> {'frontier_changes', 'progress', 'nodes'} <= set(HISTORY)
True
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow.dataset as pads
from deltalake import DeltaTable

from spark_jobs.tables import TABLES, schema_of

HISTORY = frozenset(TABLES)
"""The names of the history views: every Delta table of the warehouse."""


def history_view(warehouse: Path | str, table: str, dataflow_id: str | None) -> Any:
    """The Arrow dataset (or empty table) of ``table``; only ``dataflow_id``'s rows if given."""
    path = f"{str(warehouse).rstrip('/')}/{table}"
    schema = schema_of(table)
    if not DeltaTable.is_deltatable(path):
        return schema.empty_table()
    delta = DeltaTable(path)
    if dataflow_id is None:
        return delta.to_pyarrow_dataset()
    dataset = delta.to_pyarrow_dataset(file_pruning_predicate=[("dataflow_id", "=", dataflow_id)])
    return dataset.filter(pads.field("dataflow_id") == dataflow_id)
