"""replicated_log: a batch acknowledged once a 3-node Kafka (KRaft) holds it, against the local log's fdatasync.

What a Kafka topic as the write-ahead log would cost before building it: the service acknowledges a
batch once ``write`` + ``fdatasync`` of its record returned (:mod:`api.durability.wal`); here the
option is one topic partition, replication factor 3, ``min.insync.replicas=2``, written with
``acks=all`` by an idempotent producer (a transactional one per shard, so that a shard's old owner
is fenced). The cluster (:mod:`bench._kafka`): Kafka's jars from Maven Central, three JVMs on
loopback, each broker and controller, their logs in a temporary directory, killed at the end
whatever happens.

Measured, records of 200 bytes and 4 KB, one in flight (a worker waiting for its ack): the local
log's write + ``fdatasync`` and Kafka's produce-to-delivery, interleaved in chunks of
:data:`CHUNK` so the shared machine's load falls on both alike; Kafka with :data:`WINDOW` in
flight; a transaction per record. Then the faults, each on a fresh topic while one record at a
time is produced: ``kill -9`` of a follower, then of the partition's leader (the longest gap
between acks; every acknowledged record read back exactly once); and two of the three nodes killed
(nothing may be acknowledged; since every node is also a controller, the quorum goes too).

Kafka's ``acks=all`` means "in the page cache of the in-sync replicas": the brokers do not
``fsync`` per record (``flush.messages`` unset), unlike the local log.

>>> _percentile([3.0, 1.0, 2.0], 50)
2.0
>>> _seq(_record(7, 200)), len(_record(7, 200))
(7, 200)
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from bench._kafka import KAFKA, NODES, Cluster, broker_jars, client, create_topic, leader_of, new_producer

SIZES = (200, 4096)
WINDOW = 8
CHUNK = 100

_SILENT = logging.getLogger("bench.replicated_log.fenced")
_SILENT.disabled = True


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def _record(seq: int, size: int) -> bytes:
    """A record of ``size`` bytes whose first 8 are its sequence number (checked when read back)."""
    return seq.to_bytes(8, "big") + bytes(size - 8)


def _seq(value: bytes) -> int:
    return int.from_bytes(value[:8], "big")


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _send(producer: Producer, topic: str, value: bytes) -> KafkaError | None:
    """Produce one record and wait for its delivery report: its error, None once acknowledged."""
    outcome: list[KafkaError | None] = []
    producer.produce(topic, value, on_delivery=lambda error, _message: outcome.append(error))
    while not outcome:
        producer.poll(1.0)
    return outcome[0]


@dataclass
class Acks:
    """One-in-flight produce: each acknowledged record's latency and time, the failed records."""
    latencies: list[float] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    acked: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def send(self, producer: Producer, topic: str, seq: int, size: int) -> None:
        started = time.perf_counter()
        error = _send(producer, topic, _record(seq, size))
        now = time.perf_counter()
        if error is None:
            self.latencies.append(now - started)
            self.times.append(now)
            self.acked.append(seq)
        else:
            self.errors.append(error.name())


def _local_append(fd: int, latencies: list[float], seq: int, size: int) -> None:
    """What the log's quiet path does for a lone batch: one ``write``, one ``fdatasync``."""
    started = time.perf_counter()
    os.write(fd, _record(seq, size))
    os.fdatasync(fd)
    latencies.append(time.perf_counter() - started)


def _windowed(producer: Producer, topic: str, size: int, count: int) -> tuple[list[float], float]:
    """:data:`WINDOW` records in flight: each one's latency, and the records acknowledged per second."""
    latencies: list[float] = []
    failed: list[str] = []

    def delivered(started: float, error: KafkaError | None, _message: Message) -> None:
        (latencies.append(time.perf_counter() - started) if error is None else failed.append(error.name()))

    began = time.perf_counter()
    for seq in range(count):
        while seq - len(latencies) - len(failed) >= WINDOW:
            producer.poll(1.0)
        producer.produce(topic, _record(seq, size), on_delivery=partial(delivered, time.perf_counter()))
    producer.flush(120)
    if failed:
        raise RuntimeError(f"{len(failed)} records failed with {WINDOW} in flight: {Counter(failed)}")
    return latencies, count / (time.perf_counter() - began)


def _transactions(cluster: Cluster, topic: str, size: int, count: int) -> tuple[list[float], str]:
    """A transaction per record (begin, produce, commit): the latencies; then a second producer
    with the same ``transactional.id`` (a shard's new owner), and what the old one's commit met."""
    config = {"transactional.id": f"shard-0-{topic}"}
    # Its fencing is expected: librdkafka's fatal-error log goes to a logger that drops it.
    producer = new_producer(cluster, **config, logger=_SILENT)
    producer.init_transactions(60)
    latencies = []
    for seq in range(-50, count):  # 50 unmeasured: connections, the coordinator's first lookups
        started = time.perf_counter()
        producer.begin_transaction()
        producer.produce(topic, _record(max(seq, 0), size))
        producer.commit_transaction(60)
        if seq >= 0:
            latencies.append(time.perf_counter() - started)
    new_producer(cluster, **config).init_transactions(60)
    try:
        producer.begin_transaction()
        producer.produce(topic, _record(0, size))
        producer.commit_transaction(30)
    except KafkaException as fenced:
        return latencies, fenced.args[0].name()
    return latencies, "NOT FENCED"


def _read_back(cluster: Cluster, topic: str) -> Counter[int]:
    """Every record of ``topic`` from its start: how many times each sequence number is there."""
    consumer = Consumer(client(cluster, **{"group.id": f"check-{topic}", "enable.auto.commit": False}))
    seen: Counter[int] = Counter()
    try:
        _, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=30)
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        deadline = time.perf_counter() + 60
        while sum(seen.values()) < high and time.perf_counter() < deadline:
            for message in consumer.consume(1000, 1.0):
                if message.error() is None:
                    seen[_seq(message.value() or b"")] += 1
    finally:
        consumer.close()
    return seen


def _failover(cluster: Cluster, admin: AdminClient, victim: str, count: int) -> dict[str, Any]:
    """Produce ``count`` records one at a time on a fresh topic, killing the partition's leader or a
    follower a quarter of the way; the longest wait for an ack, and the acked records read back."""
    topic = f"failover-{victim}"
    create_topic(admin, topic)
    leader = leader_of(admin, topic)
    node = leader if victim == "leader" else next(n for n in NODES if n != leader)
    producer, acks = new_producer(cluster), Acks()
    for seq in [*range(count, count + 20), *range(count)]:  # 20 first, unmeasured, numbered past the rest
        if seq == count // 4:
            cluster.kill9(node)
            acks.times.append(time.perf_counter())  # the gap counts from the kill
        acks.send(producer, topic, seq, SIZES[0])
    gaps = [b - a for a, b in zip(acks.times, acks.times[1:], strict=False)]
    seen = _read_back(cluster, topic)
    acked = [seq for seq in acks.acked if seq < count]
    result = {
        "killed_node": node, "new_leader": leader_of(admin, topic), "acked": len(acked),
        "errors": dict(Counter(acks.errors)), "max_gap_s": max(gaps), "lost": sum(seen[s] == 0 for s in acked),
        "duplicated": sum(n > 1 for n in seen.values()), "exactly_once": all(seen[s] == 1 for s in acked)
        and all(n == 1 for n in seen.values())}
    cluster.start(node)
    cluster.wait_brokers(admin)
    return result


def _no_majority(cluster: Cluster, admin: AdminClient) -> dict[str, Any]:
    """Kill two of the three nodes (the followers: the leader stays) and produce one record: it
    must fail, not be acknowledged. Then start one again: how soon a record is acknowledged."""
    topic = "no-majority"
    create_topic(admin, topic)
    leader = leader_of(admin, topic)
    producer = new_producer(cluster, **{"delivery.timeout.ms": 20_000, "request.timeout.ms": 5_000})
    for seq in range(10):
        if (error := _send(producer, topic, _record(seq, SIZES[0]))) is not None:
            raise RuntimeError(f"before the kill: {error}")
    others = [n for n in NODES if n != leader]
    for node in others:
        cluster.kill9(node)
    started = time.perf_counter()
    error = _send(producer, topic, _record(10, SIZES[0]))
    answered = time.perf_counter() - started
    cluster.start(others[0])
    started = time.perf_counter()
    resumed = _send(new_producer(cluster), topic, _record(11, SIZES[0]))
    return {"acked": error is None, "error": error.name() if error else None, "answered_s": answered,
            "resumed_s": time.perf_counter() - started if resumed is None else None}


def _stats(latencies: list[float]) -> dict[str, float]:
    return {"p50_ms": _percentile(latencies, 50) * 1e3, "p99_ms": _percentile(latencies, 99) * 1e3,
            "max_ms": max(latencies) * 1e3}


def _against_local(cluster: Cluster, admin: AdminClient, root: Path, size: int, count: int) -> dict[str, Any]:
    """The rows of one record size: local log, Kafka one and :data:`WINDOW` in flight, a transaction
    per record; and what fencing did to the old owner."""
    topic = f"wal-{size}"
    create_topic(admin, topic)
    producer, acks, local = new_producer(cluster), Acks(), list[float]()
    fd = os.open(root / f"local-{size}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        for seq in range(50):  # unmeasured: the first connection and metadata, the file's first blocks
            _send(producer, topic, _record(seq, size))
            _local_append(fd, [], seq, size)
        # Interleaved chunks: the CI's load, which comes and goes, falls on both alike.
        for start in range(0, count, CHUNK):
            for seq in range(start, min(start + CHUNK, count)):
                _local_append(fd, local, seq, size)
            for seq in range(start, min(start + CHUNK, count)):
                acks.send(producer, topic, seq, size)
    finally:
        os.close(fd)
    if acks.errors:
        raise RuntimeError(f"{len(acks.errors)} records failed: {Counter(acks.errors)}")
    windowed, rate = _windowed(producer, topic, size, count)
    create_topic(admin, f"txn-{size}")
    transactions, fenced = _transactions(cluster, f"txn-{size}", size, count // 2)
    return {"rows": {f"local fdatasync, {size} B": _stats(local), f"kafka acks=all, {size} B": _stats(acks.latencies),
                     f"kafka {WINDOW} in flight, {size} B": {**_stats(windowed), "per_s": rate},
                     f"kafka transaction, {size} B": _stats(transactions)}, "fenced": fenced}


def _print(count: int, load: tuple[str, str], rows: dict[str, dict[str, float]], ratios: dict[str, float],
           faults: dict[str, dict[str, Any]], two_down: dict[str, Any], fenced: str) -> None:
    print(f"\nreplicated_log: kafka {KAFKA} (KRaft, 3 nodes on loopback, RF 3, min.insync.replicas 2), "
          f"{count} records per row; load average before {load[0]}, after {load[1]}")
    print(f"{'':34} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'per s':>8}")
    for label, row in rows.items():
        per_s = f"{row['per_s']:8.0f}" if "per_s" in row else ""
        print(f"{label:34} {row['p50_ms']:8.2f} {row['p99_ms']:8.2f} {row['max_ms']:8.2f} {per_s}")
    for size in SIZES:
        print(f"kafka / local, {size} B: p50 {ratios[f'p50_ratio_{size}']:.2f}x, "
              f"p99 {ratios[f'p99_ratio_{size}']:.2f}x (target: p50 at most 2x)")
    for victim, fault in faults.items():
        print(f"kill -9 {victim} (node {fault['killed_node']}; leader then {fault['new_leader']}): longest wait for an "
              f"ack {fault['max_gap_s']:.2f}s; {fault['acked']} acked, errors {fault['errors'] or 'none'}, "
              f"{fault['lost']} lost, {fault['duplicated']} duplicated, exactly once: {fault['exactly_once']}")
    resumed = f"{two_down['resumed_s']:.1f}s" if two_down["resumed_s"] is not None else "never"
    print(f"kill -9 two of three: acked {two_down['acked']}, {two_down['error']} after {two_down['answered_s']:.1f}s; "
          f"one node back, the next record acked after {resumed}")
    print(f"transactional.id taken by a new producer: the old owner's commit failed with {fenced}")


def run(quick: bool) -> dict[str, Any]:
    """Measure, print a table, return the figures."""
    count = 500 if quick else 3_000
    load_before = _load()
    jars, fetch_seconds = broker_jars()
    root = Path(tempfile.mkdtemp(prefix="bench-replicated-log-"))
    cluster = Cluster(jars, root)
    rows: dict[str, dict[str, float]] = {}
    try:
        cluster.format()
        for node in NODES:
            cluster.start(node)
        admin = AdminClient(client(cluster))
        ready = cluster.wait_brokers(admin)
        print(f"kafka {KAFKA}: 3 nodes ready {ready:.1f}s after start (logs in {root})", flush=True)
        for size in SIZES:
            measured = _against_local(cluster, admin, root, size, count)
            rows.update(measured["rows"])
        print("faults: kill -9 a follower, then the leader, then two of three...", flush=True)
        faults = {victim: _failover(cluster, admin, victim, count) for victim in ("follower", "leader")}
        two_down = _no_majority(cluster, admin)
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
    load_after = _load()
    ratios = {f"{q}_ratio_{size}": rows[f"kafka acks=all, {size} B"][f"{q}_ms"] / rows[f"local fdatasync, {size} B"][
        f"{q}_ms"] for size in SIZES for q in ("p50", "p99")}
    _print(count, (load_before, load_after), rows, ratios, faults, two_down, measured["fenced"])
    figures = {"kafka_version": KAFKA, "jar_fetch_seconds": fetch_seconds, "load_before": load_before,
               "load_after": load_after, "rows": rows, **ratios, "faults": faults, "two_down": two_down,
               "fenced": measured["fenced"]}
    return {"name": "replicated_log", "figures": figures, "targets": {f"p50_ratio_{size}": 2.0 for size in SIZES}}
