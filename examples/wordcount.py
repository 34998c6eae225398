"""Streaming word count per epoch: one notification per epoch per vertex.

``input -> split -> count (exchanged by word) -> sink (all on worker 0)``. ``count`` adds up
the words of each epoch and, notified when the epoch is complete, sends the epoch's totals;
``sink`` is notified once all totals of the epoch have arrived and records one row per epoch.

The guarantee: each epoch's row equals the sequential :func:`reference`, on any number of
workers (``examples/__init__.py`` runs it on one worker against an in-process tracker).

>>> rows = reference({"epochs": 2, "lines": 3, "words": 4, "seed": 1})
>>> [row["epoch"] for row in rows], sum(n for _, n in rows[0]["counts"]) == 3 * 4
([0, 1], True)
"""

from __future__ import annotations

import random
import zlib
from collections import Counter, defaultdict
from typing import Any

from examples._common import epochs, sink_rows
from tracker.timestamp import Timestamp
from tracker.worker import Worker
from tracker.worker.vertex import Dataflow, Vertex

DEFAULTS: dict[str, Any] = {"epochs": 5, "lines": 20, "words": 8, "seed": 1, "vocabulary": 50, "pace": 0.0}
INPUT, SPLIT, COUNT, SINK = 0, 1, 2, 3


def word_hash(word: str) -> int:
    """A hash that is the same in every process (``hash(str)`` is salted per process)."""
    return zlib.crc32(word.encode())


def make_input(config: dict[str, Any]) -> list[list[str]]:
    """The lines of every epoch, deterministic for ``config["seed"]``."""
    c = {**DEFAULTS, **config}
    rng = random.Random(c["seed"])
    vocabulary = [f"w{i:03d}" for i in range(c["vocabulary"])]
    return [[" ".join(rng.choice(vocabulary) for _ in range(c["words"])) for _ in range(c["lines"])]
            for _ in range(c["epochs"])]


class Split(Vertex):
    """Lines to words, at the line's time."""

    def on_recv(self, edge: int, message: Any, time: Timestamp) -> None:
        for word in message.split():
            self.send_by(0, word, time)


class Count(Vertex):
    """Counts words per epoch; sends ``[word, count]`` when the epoch is complete."""

    def __init__(self) -> None:
        self.counts: dict[Timestamp, Counter[str]] = defaultdict(Counter)

    def on_recv(self, edge: int, message: Any, time: Timestamp) -> None:
        self.counts[time][message] += 1
        self.notify_at(time)

    def on_notify(self, time: Timestamp) -> None:
        for word, count in sorted(self.counts.pop(time).items()):
            self.send_by(0, [word, count], time)


class Sink(Vertex):
    """Collects the totals of each epoch; one row per epoch once it is complete."""

    def __init__(self) -> None:
        self.pending: dict[Timestamp, dict[str, int]] = defaultdict(dict)
        self.rows: list[dict[str, Any]] = []

    def on_recv(self, edge: int, message: Any, time: Timestamp) -> None:
        word, count = message
        self.pending[time][word] = count
        self.notify_at(time)

    def on_notify(self, time: Timestamp) -> None:
        self.rows.append({"epoch": time[0], "counts": sorted([w, n] for w, n in self.pending.pop(time).items())})


def build(config: dict[str, Any]) -> Dataflow:
    """The dataflow (arity 1: epochs)."""
    flow = Dataflow("wordcount", arity=1)
    flow.input("lines")
    flow.stage("split", lambda i, n: Split(), inputs=1, outputs=1)
    flow.stage("count", lambda i, n: Count(), inputs=1, outputs=1)
    flow.stage("sink", lambda i, n: Sink(), inputs=1, outputs=0)
    flow.connect((INPUT, 0), (SPLIT, 0))
    flow.connect((SPLIT, 0), (COUNT, 0), partition=word_hash)
    flow.connect((COUNT, 0), (SINK, 0), partition=lambda message: 0)
    return flow


async def drive(worker: Worker, config: dict[str, Any]) -> None:
    """Feed this worker's share of each epoch's lines, advancing the input after each epoch."""
    handle = worker.input(INPUT)
    async for _, lines in epochs(worker, handle, SINK, make_input(config), config):
        handle.send(line for i, line in enumerate(lines) if i % worker.peers == worker.index)


def collect(worker: Worker) -> list[dict[str, Any]]:
    """This worker's rows (only worker 0's sink receives any)."""
    return sink_rows(worker, SINK)


def reference(config: dict[str, Any]) -> list[dict[str, Any]]:
    """The same counts, computed sequentially."""
    rows = []
    for epoch, lines in enumerate(make_input(config)):
        counts = Counter(word for line in lines for word in line.split())
        if counts:
            rows.append({"epoch": epoch, "counts": sorted([w, n] for w, n in counts.items())})
    return rows


def render(rows: list[dict[str, Any]]) -> list[str]:
    """One line per epoch: the five most frequent words and the number of words."""
    lines = []
    for row in sorted(rows, key=lambda r: r["epoch"]):
        top = sorted(row["counts"], key=lambda wn: (-wn[1], wn[0]))[:5]
        total = sum(n for _, n in row["counts"])
        lines.append(f"epoch {row['epoch']}: {total} words, {len(row['counts'])} distinct; top "
                     + ", ".join(f"{w}={n}" for w, n in top))
    return lines
