"""A 3-node Apache Kafka cluster (KRaft) on loopback for the benchmarks, its jars from Maven Central.

:func:`broker_jars` fetches ``org.apache.kafka:kafka_2.13`` and a log4j 2 binding with
``mvn dependency:copy-dependencies`` into :data:`CACHE` once; :class:`Cluster` formats each node's
storage (``kafka.tools.StorageTool format``) and runs ``kafka.Kafka`` in a JVM per node, each
broker and controller (``process.roles=broker,controller``, a static ``controller.quorum.voters``),
on free loopback ports with its data in a directory of the caller's. Nothing starts on import.
"""

from __future__ import annotations

import base64
import shutil
import socket
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

KAFKA = "4.1.1"
LOG4J = "2.24.3"
"""Kafka 4.1's own log4j 2; ``log4j-slf4j-impl`` (not ``-slf4j2-``) binds the slf4j 1.7 Kafka depends on."""
CACHE = Path.home() / ".cache" / "tracker-bench" / f"kafka-{KAFKA}"
NODES = (1, 2, 3)
JVM = ["-Xms128m", "-Xmx384m", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20", "-Djava.awt.headless=true"]
"""Small heaps (two cores, three brokers and the CI's work); G1 with a short pause goal, as Kafka's scripts."""
TOPIC = {"min.insync.replicas": "2"}
POM = f"""<?xml version="1.0" encoding="UTF-8"?>
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>tracker.bench</groupId><artifactId>kafka-broker-jars</artifactId><version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId><version>{KAFKA}</version>
    </dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-slf4j-impl</artifactId>
      <version>{LOG4J}</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-core</artifactId>
      <version>{LOG4J}</version></dependency>
  </dependencies>
</project>
"""
LOG4J_CONFIG = """status = warn
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = info
rootLogger.appenderRef.out.ref = out
"""


def broker_jars() -> tuple[Path, float | None]:
    """The broker's jars (fetched once into :data:`CACHE`) and the seconds the fetch took (None: cached)."""
    jars, complete = CACHE / "jars", CACHE / "complete"
    if complete.exists():  # written only after a whole copy: an interrupted fetch is redone
        print(f"kafka {KAFKA}: {len(list(jars.glob('*.jar')))} jars cached in {jars}", flush=True)
        return jars, None
    CACHE.mkdir(parents=True, exist_ok=True)
    (CACHE / "pom.xml").write_text(POM)
    print(f"kafka {KAFKA}: fetching org.apache.kafka:kafka_2.13:{KAFKA} and its dependencies from Maven Central "
          "(mvn dependency:copy-dependencies, once)...", flush=True)
    started = time.perf_counter()
    shutil.rmtree(jars, ignore_errors=True)
    subprocess.run(["mvn", "-q", "-B", "-Dstyle.color=never", "-f", str(CACHE / "pom.xml"),
                    "dependency:copy-dependencies", f"-DoutputDirectory={jars}"], check=True)
    seconds = time.perf_counter() - started
    complete.write_text(f"{seconds:.1f}\n")
    print(f"kafka {KAFKA}: {len(list(jars.glob('*.jar')))} jars in {seconds:.1f}s", flush=True)
    return jars, seconds


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class Cluster:
    """Three KRaft nodes on loopback, each broker and controller (a static quorum); ``settings``
    are added to each node's ``server.properties`` (e.g. ``broker.session.timeout.ms``, 9 s by
    default: how long a killed node goes unnoticed, so how long ``acks=all`` stalls)."""

    def __init__(self, jars: Path, root: Path, settings: dict[str, Any] | None = None) -> None:
        self.jars, self.root, self.settings = jars, root, settings or {}
        self.ports = {node: (_free_port(), _free_port()) for node in NODES}  # (broker, controller)
        self.processes: dict[int, subprocess.Popen[bytes]] = {}
        self.bootstrap = ",".join(f"127.0.0.1:{broker}" for broker, _ in self.ports.values())
        (root / "log4j2.properties").write_text(LOG4J_CONFIG)

    def _java(self, main: str, *args: str) -> list[str]:
        return ["java", *JVM, f"-Dlog4j2.configurationFile={self.root / 'log4j2.properties'}",
                "-cp", f"{self.jars}/*", main, *args]

    def _config(self, node: int) -> Path:
        broker, controller = self.ports[node]
        voters = ",".join(f"{n}@127.0.0.1:{c}" for n, (_, c) in self.ports.items())
        # The internal topics replicated like the log: the transaction coordinator's state is what
        # fences an old owner. One partition each: a broker starts (and recovers) sooner.
        settings = {
            "process.roles": "broker,controller", "node.id": node, "controller.quorum.voters": voters,
            "listeners": f"PLAINTEXT://127.0.0.1:{broker},CONTROLLER://127.0.0.1:{controller}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{broker}",
            "controller.listener.names": "CONTROLLER", "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": self.root / f"node{node}" / "data", "auto.create.topics.enable": "false",
            "offsets.topic.replication.factor": 3, "offsets.topic.num.partitions": 1,
            "transaction.state.log.replication.factor": 3, "transaction.state.log.min.isr": 2,
            "transaction.state.log.num.partitions": 1, "group.initial.rebalance.delay.ms": 0, **self.settings}
        path = self.root / f"node{node}" / "server.properties"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(f"{key}={value}\n" for key, value in settings.items()))
        return path

    def format(self) -> None:
        # A Kafka Uuid: 16 random bytes, URL-safe base64 without padding.
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        for node in NODES:
            subprocess.run(self._java("kafka.tools.StorageTool", "format", "--cluster-id", cluster_id,
                                      "--config", str(self._config(node))),
                           check=True, stdout=subprocess.DEVNULL)

    def start(self, node: int) -> None:
        with open(self.root / f"node{node}" / "server.log", "ab") as out:
            self.processes[node] = subprocess.Popen(
                self._java("kafka.Kafka", str(self.root / f"node{node}" / "server.properties")),
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def kill9(self, node: int) -> None:
        self.processes[node].kill()
        self.processes[node].wait()

    def stop(self) -> None:
        # SIGKILL: the cluster's data is thrown away, and a controlled shutdown of the last nodes
        # waits on a quorum that is already gone.
        for process in self.processes.values():
            if process.poll() is None:
                process.kill()
            process.wait()

    def wait_brokers(self, admin: AdminClient, count: int = len(NODES), timeout: float = 120) -> float:
        started = time.perf_counter()
        while time.perf_counter() - started < timeout:
            for node, process in self.processes.items():
                if process.poll() is None or process.returncode == -9:
                    continue
                tail = (self.root / f"node{node}" / "server.log").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"kafka node {node} exited ({process.returncode}):\n{tail}")
            try:
                if len(admin.list_topics(timeout=2).brokers) >= count:
                    return time.perf_counter() - started
            except KafkaException:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"{count} kafka brokers not up after {timeout}s")


def client(cluster: Cluster, **extra: Any) -> dict[str, Any]:
    # log_level 2: a killed broker's refused connections are expected, reported by delivery instead.
    return {"bootstrap.servers": cluster.bootstrap, "log_level": 2, **extra}


def new_producer(cluster: Cluster, **extra: Any) -> Producer:
    # 60 s to deliver: longer than a failover, and no longer than a transaction may stay open
    # (``transaction.timeout.ms``; librdkafka refuses a transactional producer otherwise).
    return Producer(client(cluster, **{"acks": "all", "enable.idempotence": True, "linger.ms": 0,
                                        "delivery.timeout.ms": 60_000, **extra}))


def create_topic(admin: AdminClient, name: str) -> None:
    """A 1-partition, 3-replica topic, returned once its 3 replicas are in sync."""
    admin.create_topics([NewTopic(name, num_partitions=1, replication_factor=3, config=TOPIC)])[name].result(60)
    deadline = time.perf_counter() + 60
    while time.perf_counter() < deadline:
        partitions = admin.list_topics(name, timeout=5).topics[name].partitions
        if partitions and partitions[0].leader >= 0 and len(partitions[0].isrs) == len(NODES):
            return
        time.sleep(0.2)
    raise TimeoutError(f"topic {name}: replicas not in sync after 60s")


def leader_of(admin: AdminClient, topic: str) -> int:
    leader: int = admin.list_topics(topic, timeout=10).topics[topic].partitions[0].leader
    return leader
