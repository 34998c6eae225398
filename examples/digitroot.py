"""Digital roots by two nested loops: a fixed point per epoch whose step itself iterates.

The digital root of ``n`` is what repeated digit sums reach: ``987 -> 24 -> 6``. Here the
outer loop repeats the step until a single digit is left, and the step, the digit sum, is an
inner loop that moves one digit per iteration::

    numbers -> rounds[ check -> digits[ sum -> carry (+1 digit) -> sum ] -> again (+1 round) -> check ] -> sink

* ``numbers`` and ``sink`` live in the root scope and see epochs ``(e,)``;
* ``check`` and ``again`` live in the iterative scope ``rounds`` and see ``(e, round)``;
  ``check`` sends single digits out to the sink and the others into ``digits``;
* ``sum`` and ``carry`` live in ``digits``, nested in ``rounds``, and see ``(e, round, digit)``:
  ``sum`` adds the last digit to an accumulator and sends the rest around again, or, once no
  digit is left, sends the sum out of ``digits`` to ``again``, which starts the next round.

Records cross scopes with their times transformed by the runtime (entering appends ``0``,
leaving drops the loop counter). ``check`` and ``sum`` work in rounds: they buffer what arrives
and process it when notified, at times of arity 2 and 3; the sink is notified at ``(e,)`` once
nothing of epoch ``e`` is left anywhere in either loop, and records one row per epoch:
``[n, root, rounds]`` for every number of the epoch.

The guarantee: each epoch's row equals the sequential :func:`reference`, on any number of
workers. On one worker against an in-process tracker:

>>> import asyncio
>>> from tracker.worker import LocalHub
>>> config = {**DEFAULTS, "epochs": 2}
>>> flow = build(config)
>>> [(stage.name, flow.arity_of(stage.id)) for stage in flow.stages]
[('numbers', 1), ('check', 2), ('sum', 3), ('carry', 3), ('again', 2), ('sink', 1)]
>>> worker = Worker(flow, 0, 1, LocalHub.for_dataflow(flow, workers=1).link("w0"))
>>> _ = asyncio.run(worker.run(lambda w: drive(w, config)))
>>> collect(worker) == reference(config)
True
>>> for line in render(collect(worker)):
...     print(line)
epoch 0: 8 numbers, at most 3 rounds; roots 1:1 3:2 5:1 6:1 7:1 8:1 9:1
epoch 1: 8 numbers, at most 3 rounds; roots 0:1 2:1 5:1 6:1 7:2 8:1 9:1
"""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from typing import Any

from examples._common import epochs, sink_rows
from tracker.timestamp import Timestamp
from tracker.worker import Worker
from tracker.worker.vertex import Dataflow, Vertex

DEFAULTS: dict[str, Any] = {"epochs": 4, "numbers": 8, "digits": 24, "seed": 1, "pace": 0.0}
INPUT, CHECK, SUM, CARRY, AGAIN, SINK = 0, 1, 2, 3, 4, 5  # stage ids, in declaration order


def make_input(config: dict[str, Any]) -> list[list[int]]:
    """Each epoch's numbers (at least one per epoch, up to ``digits`` digits), deterministic for
    the seed."""
    c = {**DEFAULTS, **config}
    rng = random.Random(c["seed"])
    return [[rng.randrange(10 ** rng.randint(1, c["digits"])) for _ in range(max(1, c["numbers"]))]
            for _ in range(c["epochs"])]


class Rounds(Vertex):
    """A vertex that buffers what arrives at each time and handles it all when notified."""

    def __init__(self) -> None:
        self.pending: dict[Timestamp, list[Any]] = defaultdict(list)

    def on_recv(self, edge: int, message: Any, time: Timestamp) -> None:
        self.pending[time].append(message)
        self.notify_at(time)

    def on_notify(self, time: Timestamp) -> None:
        for message in sorted(self.pending.pop(time)):
            self.step(message, time)

    def step(self, message: Any, time: Timestamp) -> None:
        raise NotImplementedError


class Check(Rounds):
    """``[n, value, rounds]`` at ``(e, round)``: single digits leave (output 1, to the sink), the
    others go to the digit sum (output 0) as ``[n, value, rounds, rest, sum]``."""

    def step(self, message: Any, time: Timestamp) -> None:
        n, value, rounds = message
        if value < 10:
            self.send_by(1, [n, value, rounds], time)
        else:
            self.send_by(0, [n, value, rounds, value, 0], time)


class Sum(Rounds):
    """``[n, value, rounds, rest, sum]`` at ``(e, round, digit)``: one digit of ``rest`` into
    ``sum`` (output 0, around the inner loop), or, with no digit left, ``[n, sum, rounds + 1]``
    out of the inner loop (output 1)."""

    def step(self, message: Any, time: Timestamp) -> None:
        n, value, rounds, rest, total = message
        if rest == 0:
            self.send_by(1, [n, total, rounds + 1], time)
        else:
            self.send_by(0, [n, value, rounds, rest // 10, total + rest % 10], time)


class Sink(Vertex):
    """Collects ``[n, root, rounds]`` per epoch; one row when the epoch is over."""

    def __init__(self) -> None:
        self.results: dict[int, list[list[int]]] = defaultdict(list)
        self.rows: list[dict[str, Any]] = []

    def on_recv(self, edge: int, message: Any, time: Timestamp) -> None:
        self.results[time[0]].append(list(message))
        self.notify_at(time)

    def on_notify(self, time: Timestamp) -> None:
        self.rows.append({"epoch": time[0], "roots": sorted(self.results.pop(time[0]))})


def build(config: dict[str, Any]) -> Dataflow:
    """The dataflow: epochs at the root, ``(epoch, round)`` in ``rounds``, ``(epoch, round,
    digit)`` in ``digits``."""
    flow = Dataflow("digitroot")
    numbers = flow.input("numbers")
    with flow.scope("rounds") as rounds:
        check = rounds.stage("check", lambda i, n: Check(), inputs=2, outputs=2)
        with rounds.scope("digits") as digits:
            add = digits.stage("sum", lambda i, n: Sum(), inputs=2, outputs=2)
            carry = digits.feedback("carry")
        again = rounds.feedback("again")
    sink = flow.stage("sink", lambda i, n: Sink(), inputs=1, outputs=0)
    assert (numbers, check, add, carry, again, sink) == (INPUT, CHECK, SUM, CARRY, AGAIN, SINK)
    flow.connect((numbers, 0), (check, 0), partition=lambda m: m[0])  # into rounds
    flow.connect((check, 0), (add, 0), partition=lambda m: m[1])  # into digits
    flow.connect((add, 0), (carry, 0), partition=lambda m: m[3])
    flow.connect((carry, 0), (add, 1))
    flow.connect((add, 1), (again, 0), partition=lambda m: m[1])  # out of digits
    flow.connect((again, 0), (check, 1))
    flow.connect((check, 1), (sink, 0), partition=lambda m: 0)  # out of rounds
    return flow


async def drive(worker: Worker, config: dict[str, Any]) -> None:
    """Feed this worker's share of each epoch's numbers as ``[n, n, 0]``."""
    handle = worker.input(INPUT)
    async for _, numbers in epochs(worker, handle, SINK, make_input(config), config):
        handle.send([n, n, 0] for i, n in enumerate(numbers) if i % worker.peers == worker.index)


def collect(worker: Worker) -> list[dict[str, Any]]:
    """This worker's rows (only worker 0's sink receives any)."""
    return sink_rows(worker, SINK)


def reference(config: dict[str, Any]) -> list[dict[str, Any]]:
    """Repeated digit sums, sequentially: the same rows."""
    rows = []
    for epoch, numbers in enumerate(make_input(config)):
        roots = []
        for n in numbers:
            value, rounds = n, 0
            while value >= 10:
                value, rounds = sum(int(d) for d in str(value)), rounds + 1
            roots.append([n, value, rounds])
        rows.append({"epoch": epoch, "roots": sorted(roots)})
    return rows


def render(rows: list[dict[str, Any]]) -> list[str]:
    """One line per epoch: how many numbers, the most rounds any needed, how often each root."""
    lines = []
    for row in sorted(rows, key=lambda r: r["epoch"]):
        roots = Counter(root for _, root, _ in row["roots"])
        lines.append(f"epoch {row['epoch']}: {len(row['roots'])} numbers, at most "
                     f"{max(rounds for _, _, rounds in row['roots'])} rounds; roots "
                     + " ".join(f"{root}:{count}" for root, count in sorted(roots.items())))
    return lines
