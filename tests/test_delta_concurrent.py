"""Several processes commit to one Delta warehouse at once, as the shards and the Spark process
do: appends, partition replacements with watermarks, deletions of a partition's rows and
``OPTIMIZE`` of their own partitions, each through :class:`spark_jobs.storage.Warehouse`
(delta-rs, the service's writer), starting on an empty warehouse so that the first commits also
race to create the tables. An independent reader (Polars) then finds every row: none lost, none
twice, each partition as its writer last left it, each watermark the last one written.
"""

from __future__ import annotations

import multiprocessing
from pathlib import Path
from typing import Any

import polars as pl

WRITERS = 4
ROUNDS = 22
DATAFLOWS = 3


def _ids(writer: int) -> list[str]:
    return [f"s{writer}-{j:029x}" for j in range(DATAFLOWS)]


def _write(root: str, writer: int, start: Any) -> None:
    """One writer's commits: per round, one append of a batch for each of its dataflows, one
    replacement of their ``pointstamps`` with a watermark each, a replacement or a deletion of
    one ``frontiers`` partition, and now and then an ``OPTIMIZE`` of its ``progress`` partitions."""
    from spark_jobs.storage import POINTSTAMPS_APP, Warehouse

    warehouse = Warehouse(root)
    ids = _ids(writer)
    start.wait(120)  # every writer imported: the first commits race to create the tables
    for round_ in range(ROUNDS):
        warehouse.append("progress", [{"dataflow_id": d, "version": round_, "worker": f"w{writer}", "seq": round_,
                                       "node": 0, "port": 0, "kind": "source", "time": [round_], "delta": 1}
                                      for d in ids])
        warehouse.replace_partitions("pointstamps", ids, [{"dataflow_id": d, "node": 0, "port": 0, "kind": "source",
                                                           "time": [round_], "count": round_ + 1} for d in ids],
                                     {POINTSTAMPS_APP + d: round_ for d in ids})
        frontier = [] if round_ % 4 == 3 else [{"dataflow_id": ids[0], "node": 1, "port": 0, "kind": "target",
                                                "time": [round_]}]
        warehouse.replace_partitions("frontiers", [ids[0]], frontier)
        if round_ % 6 == 5:
            warehouse.optimize("progress", ids)


def test_concurrent_writers_lose_no_row_and_keep_each_partition_exact(tmp_path: Path) -> None:
    from deltalake import DeltaTable

    from spark_jobs.storage import POINTSTAMPS_APP

    root = tmp_path / "warehouse"
    root.mkdir()
    context = multiprocessing.get_context("spawn")  # delta-rs' runtime does not survive a fork
    start = context.Barrier(WRITERS)
    writers = [context.Process(target=_write, args=(str(root), k, start)) for k in range(WRITERS)]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(300)
    assert [w.exitcode for w in writers] == [0] * WRITERS, "a writer failed (see its traceback above)"

    progress = pl.read_delta(str(root / "progress"))
    assert progress.height == WRITERS * DATAFLOWS * ROUNDS
    assert progress.select("dataflow_id", "version").unique().height == progress.height  # none twice
    expected: dict[str, Any] = {d: list(range(ROUNDS)) for k in range(WRITERS) for d in _ids(k)}
    found = progress.group_by("dataflow_id").agg(pl.col("version").sort()).to_dicts()
    assert {row["dataflow_id"]: row["version"] for row in found} == expected

    pointstamps = pl.read_delta(str(root / "pointstamps")).sort("dataflow_id")
    assert pointstamps.select("dataflow_id", "count").rows() == [(d, ROUNDS) for d in sorted(expected)]
    table = DeltaTable(str(root / "pointstamps"))
    assert {d: table.transaction_version(POINTSTAMPS_APP + d) for d in expected} == {d: ROUNDS - 1 for d in expected}

    last = ROUNDS - 1
    frontiers = pl.read_delta(str(root / "frontiers"))
    kept = [] if last % 4 == 3 else [(_ids(k)[0], [last]) for k in range(WRITERS)]
    assert sorted(frontiers.select("dataflow_id", "time").rows()) == sorted(kept)
