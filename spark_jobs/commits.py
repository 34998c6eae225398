"""Delta commits through delta-spark: the executors write the files, the driver commits the log.

What delta-spark's public ``DataFrameWriter`` cannot do, this module does through its JVM
classes (``DeltaLog``, ``OptimisticTransaction``): replace the partitions of several dataflows
*and* record one application transaction (``txn``) per dataflow in the same commit, as the
``pointstamps`` watermarks need (the writer's ``txnAppId`` option records only one). Everything
else goes through the public writer.

Guarantees: one call, one Delta commit (atomic: readers see all of it or none of it); the data
files are written by Spark tasks (executors on a cluster), never collected to the driver; the
tables are the same standard Delta tables delta-rs and Polars read.

Example (starts a JVM, so not run as a doctest)::

    replace(spark, "/wh/pointstamps", df, ["a", "b"], {"tracker-pointstamps:a": 7, "tracker-pointstamps:b": 3})
    transaction_version(spark, "/wh/pointstamps", "tracker-pointstamps:a")   # 7
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pyspark.sql import DataFrame, SparkSession


def _jvm(spark: SparkSession) -> Any:
    return spark._jvm


def _log(spark: SparkSession, path: str) -> Any:
    return _jvm(spark).org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, path)


def _none(spark: SparkSession) -> Any:
    return _jvm(spark).scala.Option.empty()


def _seq(spark: SparkSession, items: list[Any]) -> Any:
    jvm = _jvm(spark)
    java_list = jvm.java.util.ArrayList()
    for item in items:
        java_list.add(item)
    return jvm.scala.jdk.javaapi.CollectionConverters.asScala(java_list).toSeq()


def _snapshot(spark: SparkSession, path: str) -> Any:
    return _log(spark, path).update(False, _none(spark), _none(spark))


def table_exists(spark: SparkSession, path: str) -> bool:
    """True iff ``path`` holds a Delta table (a committed log)."""
    return bool(_jvm(spark).io.delta.tables.DeltaTable.isDeltaTable(spark._jsparkSession, path))


def table_version(spark: SparkSession, path: str) -> int | None:
    """The table's current version, ``None`` if there is no table."""
    return int(_snapshot(spark, path).version()) if table_exists(spark, path) else None


def transaction_version(spark: SparkSession, path: str, app_id: str) -> int | None:
    """The last version recorded under ``app_id`` (a ``txn`` action), or ``None``."""
    if not table_exists(spark, path):
        return None
    found = _snapshot(spark, path).transactions().get(app_id)
    return int(found.get()) if found.isDefined() else None


def _quote(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def append(spark: SparkSession, path: str, df: DataFrame, partition: str = "dataflow_id") -> int:
    """Append ``df`` in one commit (creating the table on first write); the new version."""
    df.write.format("delta").mode("append").partitionBy(partition).save(path)
    return int(_snapshot(spark, path).version())


def replace(
    spark: SparkSession,
    path: str,
    df: DataFrame,
    ids: Sequence[str],
    watermarks: Mapping[str, int] | None = None,
    partition: str = "dataflow_id",
) -> int:
    """Replace every row whose ``partition`` is in ``ids`` by ``df`` (whose rows must all be in
    ``ids``), recording ``watermarks`` (app id -> version), in one commit; the new version."""
    marks = dict(watermarks or {})
    predicate = f"{partition} IN (" + ", ".join(_quote(i) for i in ids) + ")" if ids else "false"
    if len(marks) <= 1 or not table_exists(spark, path):
        writer = df.write.format("delta").mode("overwrite").option("replaceWhere", predicate)
        if len(marks) > 1:  # a new table: create it empty first, then commit as below
            spark.createDataFrame([], df.schema).write.format("delta").partitionBy(partition).save(path)
            return replace(spark, path, df, ids, marks, partition)
        for app_id, version in marks.items():
            writer = writer.option("txnAppId", app_id).option("txnVersion", version)
        writer.partitionBy(partition).save(path)
        return int(_snapshot(spark, path).version())
    wanted = set(ids)
    # Rows outside ``ids`` would survive as duplicates of what the next replace writes: keep
    # them out here rather than pay a job to find them.
    df = df.where(df[partition].isin(list(wanted)))
    log = _log(spark, path)
    txn = log.startTransaction(_none(spark), _none(spark))
    actions: list[Any] = []
    for added in _java_list(spark, txn.writeFiles(df._jdf)):
        actions.append(added)
    # filterFiles() with no filter records a read of the whole table, so a concurrent commit
    # to any partition makes this one retry or fail rather than silently interleave.
    for existing in _java_list(spark, txn.filterFiles()):
        value = existing.partitionValues().get(partition)
        if value.isDefined() and value.get() in wanted:
            actions.append(existing.remove())
    for app_id, version in marks.items():
        txn.updateSetTransaction(app_id, int(version), _none(spark))
    manual = getattr(_jvm(spark).org.apache.spark.sql.delta, "DeltaOperations$ManualUpdate$")
    return int(txn.commit(_seq(spark, actions), getattr(manual, "MODULE$")))


def _java_list(spark: SparkSession, seq: Any) -> Any:
    return _jvm(spark).scala.jdk.javaapi.CollectionConverters.asJava(seq)
