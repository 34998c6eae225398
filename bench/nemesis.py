"""The chaos suite's nemesis (:mod:`bench.chaos`): one fault at a time, each held for a while and
then healed, and a record of every one.

The faults (:data:`KINDS`), on a service of two shards, shard 0 here and shard 1 on another
host (:class:`bench.hosts.Host`):

* ``kill-ROLE`` (``kill -9``) and ``stop-ROLE`` (SIGSTOP, then SIGCONT after a bounded time,
  well under the supervisor's 30 s of silence) of every process kind: each shard's hot path
  (``hot-K``) and its log's sync process (``sync-K``), the Spark process and its JVM, the front,
  HAProxy. A killed process is healed once the supervisor's replacement runs (and, for a shard's
  processes, once the shard answers ``/healthz`` again);
* ``drop-in-1`` and ``drop-out-1``: shard 1's host drops the packets arriving for its port
  (requests lost) or leaving it (requests served, answers lost), by ``iptables`` in its
  namespace; ``link-down-1``: its link down (``ip link set ... down``);
* ``costly-K``: shard K's costly tenant sends a burst of costly batches (a load, not a
  failure: nobody's acknowledgements may suffer from it).

Every fault records what it touched (:attr:`Fault.component`: ``shard:K`` for a shard's
processes and host, ``proxy`` for HAProxy, nothing for the Spark process, its JVM, the front
and costly batches, which no tenant's acknowledgements depend on by contract), when it began
and when it healed. :meth:`Nemesis.heal_all` undoes whatever a failure left (stopped processes
continued, rules removed, the link up), and never raises.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

from api.run.process import ServiceProcess, descendants
from bench.hosts import Host

PROCESS_ROLES = ("hot-0", "hot-1", "sync-0", "sync-1", "spark", "jvm", "front", "haproxy")
KINDS = (*(f"{signal_}-{role}" for role in PROCESS_ROLES for signal_ in ("kill", "stop")),
         "drop-in-1", "drop-out-1", "link-down-1", "costly-0", "costly-1")
"""Every fault kind, in the report's order."""
LABELS = {"hot": "hot path", "sync": "log sync process", "spark": "Spark process", "jvm": "Spark JVM",
          "front": "front", "haproxy": "HAProxy"}
HEAL_SECONDS = 90.0
"""How long a killed process may take to be replaced before the fault is recorded as not healed."""
FIND_SECONDS = 20.0
"""How long the nemesis waits for a fault's process to exist (a JVM starting) before skipping it."""


@dataclass
class Fault:
    """One fault: its kind, what it touched, when (``time.monotonic()``) it began and healed."""

    kind: str
    component: str | None
    start: float
    healed: float | None = None
    detail: str = ""
    skipped: bool = False


@dataclass
class Durations:
    """Seconds, as ``(low, high)`` ranges drawn uniformly: a process stopped, a network fault
    held (above the tenants' timeout, so answers lost are noticed), the pause between faults."""

    stop: tuple[float, float]
    network: tuple[float, float]
    pause: tuple[float, float]


def describe(kind: str) -> str:
    """A fault kind in words.

    >>> describe("kill-sync-1"), describe("stop-jvm"), describe("drop-out-1")
    ('kill -9 of the log sync process of shard 1', 'SIGSTOP of the Spark JVM', "shard 1's host drops its answers")
    """
    words = kind.split("-")
    if words[0] in ("kill", "stop"):
        what = LABELS[words[1]] + (f" of shard {words[2]}" if len(words) > 2 else "")
        return f"{'kill -9' if words[0] == 'kill' else 'SIGSTOP'} of the {what}"
    return {"drop-in": "shard {}'s host drops the requests", "drop-out": "shard {}'s host drops its answers",
            "link-down": "shard {}'s link down", "costly": "costly batches on shard {}"}[
        "-".join(words[:-1])].format(words[-1])


def component(kind: str) -> str | None:
    """What a fault of ``kind`` touches that tenants depend on: ``shard:K`` (its processes, its
    host), ``proxy`` (HAProxy), or nothing.

    >>> [component(k) for k in ("kill-hot-0", "stop-sync-1", "drop-out-1", "stop-haproxy", "kill-jvm", "costly-1")]
    ['shard:0', 'shard:1', 'shard:1', 'proxy', None, None]
    """
    if kind.endswith("haproxy"):
        return "proxy"
    if kind.startswith(("drop", "link")) or kind.split("-")[1] in ("hot", "sync"):
        return f"shard:{kind[-1]}"
    return None


def _command(pid: int) -> list[bytes]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return []


def _is(role: str, command: list[bytes]) -> bool:
    program = os.path.basename(command[0]) if command else b""
    if role == "jvm":  # the JVM itself, not the spark-class script before it execs nor its launcher
        return program == b"java" and b"org.apache.spark.deploy.SparkSubmit" in command \
            and b"org.apache.spark.launcher.Main" not in command
    if role == "haproxy":
        return program == b"haproxy"
    module = {"hot": b"api.run.hot", "sync": b"api.durability.syncer", "spark": b"api.spark.process",
              "front": b"api.run.front"}[role]
    return module in command[:3]


class Nemesis:
    """Faults on ``service`` (shard 0, the front, HAProxy, Spark) and ``host`` (shard 1);
    ``costly(K)`` asks shard K's costly tenant for a burst; ``say`` prints a line of the log."""

    def __init__(self, service: ServiceProcess, host: Host, costly: Callable[[int], None], rng: random.Random,
                 durations: Durations, say: Callable[[str], None]) -> None:
        self.service, self.host, self.costly, self.rng = service, host, costly, rng
        self.durations, self.say = durations, say
        self.endpoints = {0: service.endpoint(0), 1: host.url}
        self.faults: list[Fault] = []
        self.stopped: set[int] = set()
        self.started = time.monotonic()

    def pids(self, role: str, shard: int | None = None) -> list[int]:
        """The running processes of ``role`` (of ``shard``'s tree for ``hot`` and ``sync``)."""
        root = self.host.process.pid if shard == 1 else self.service.process.pid if self.service.process else 0
        if root == 0:
            return []
        return [pid for pid in [root, *descendants(root)] if _is(role, _command(pid))]

    def _answers(self, url: str) -> bool:
        try:
            return httpx.get(url + "/healthz", timeout=2.0).status_code == 200
        except httpx.HTTPError:
            return False

    def inject(self, kind: str) -> Fault:
        """Inject one fault of ``kind``, hold it, heal it, and wait until what it touched is back."""
        words = kind.split("-")
        shard = int(words[-1]) if words[-1].isdigit() else None
        fault = Fault(kind, component(kind), time.monotonic())
        self.faults.append(fault)
        try:
            if words[0] in ("kill", "stop"):
                self._process(fault, words[1], shard)
            elif words[0] == "costly":
                assert shard is not None
                self.costly(shard)
                fault.healed = fault.start
            else:
                self._network(fault, words[0] if words[0] == "link" else f"drop-{words[1]}")
        finally:
            if fault.healed is None and not fault.skipped:
                self.heal_all()
                fault.healed = time.monotonic()
        at = fault.start - self.started
        held = (fault.healed or fault.start) - fault.start
        what = "skipped: " + fault.detail if fault.skipped else f"healed after {held:.1f} s" + (
            f" ({fault.detail})" if fault.detail else "")
        self.say(f"{at:7.1f} s  {describe(kind)}: {what}")
        return fault

    def _process(self, fault: Fault, role: str, shard: int | None) -> None:
        found: list[int] = []
        deadline = time.monotonic() + FIND_SECONDS
        while not (found := self.pids(role, shard)) and time.monotonic() < deadline:
            time.sleep(0.2)
        if not found:
            fault.skipped, fault.detail = True, f"no {LABELS[role]} running for {FIND_SECONDS:.0f} s"
            return
        pid = found[0]
        fault.start = time.monotonic()
        if fault.kind.startswith("stop"):
            os.kill(pid, signal.SIGSTOP)
            self.stopped.add(pid)
            time.sleep(self.rng.uniform(*self.durations.stop))
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
            self.stopped.discard(pid)
            fault.healed = time.monotonic()
            fault.detail = f"pid {pid}, stopped {fault.healed - fault.start:.1f} s"
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        url = self.endpoints[shard] if shard is not None else self.service.url if role in ("front", "haproxy") else ""
        deadline = time.monotonic() + HEAL_SECONDS
        while time.monotonic() < deadline:
            if any(p != pid for p in self.pids(role, shard)) and (not url or self._answers(url)):
                fault.healed = time.monotonic()
                fault.detail = f"pid {pid}"
                return
            time.sleep(0.1)
        fault.healed = time.monotonic()
        fault.detail = f"pid {pid}; NOT BACK after {HEAL_SECONDS:.0f} s"

    def _network(self, fault: Fault, what: str) -> None:
        hold = self.rng.uniform(*self.durations.network)
        if what == "link":
            self.host.link(up=False)
        else:
            self.host.drop(True, what.split("-")[1])
        time.sleep(hold)
        if what == "link":
            self.host.link(up=True)
        else:
            self.host.drop(False, what.split("-")[1])
        fault.healed = time.monotonic()

    def run(self, seconds: float, going: Callable[[], bool]) -> None:
        """Inject faults one after another, with a random pause between two: first every kind
        once, in a random order (a kind skipped because its process was not there is tried once
        more, at the end), then random kinds until ``seconds`` have passed since the first;
        stop early once ``going()`` is false."""
        self.started = time.monotonic()
        first = self.rng.sample(KINDS, len(KINDS))
        again = set(KINDS)
        while (first or time.monotonic() < self.started + seconds) and going():
            fault = self.inject(first.pop() if first else self.rng.choice(KINDS))
            if fault.skipped and fault.kind in again:
                again.discard(fault.kind)
                first.insert(0, fault.kind)
            time.sleep(self.rng.uniform(*self.durations.pause))

    def heal_all(self) -> None:
        """Continue every process stopped here, remove the host's rules, bring its link up."""
        for pid in list(self.stopped):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
            self.stopped.discard(pid)
        with contextlib.suppress(Exception):
            for direction in ("in", "out"):
                self.host.drop(False, direction)
        with contextlib.suppress(Exception):
            self.host.link(up=True)

    def wait_healthy(self, timeout: float = 120.0) -> bool:
        """Whether both shards, and the front through HAProxy, answer ``/healthz`` within ``timeout``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(self._answers(url) for url in (*self.endpoints.values(), self.service.url)):
                return True
            time.sleep(0.2)
        return False
