"""The worker runtime: hosts one vertex per stage, runs their callbacks, reports progress.

A :class:`Worker` is one process's share of a :class:`~tracker.worker.vertex.Dataflow`. It delivers
messages to its own vertices directly and to other workers' vertices through a
:class:`~tracker.worker.transport.Transport`; it turns every callback into one atomic batch of
occurrence-count updates (see :mod:`tracker.worker.vertex` for the table) handed, in order, to a
:class:`~tracker.worker.link.Link` (the service over a WebSocket, or an in-process hub).

The guarantee: ``on_notify(t)`` runs only when (1) the frontier the link last received has
no element ``<= t`` at any input of the stage, and (2) no message at a time ``<= t`` waits in
this worker's queue for that vertex. (1) covers every message still in flight anywhere, its
own pointstamp or the one its producer consumed being still counted; (2) covers messages
that arrived but were not delivered yet. A stale frontier only delays notifications.
In a dataflow with nested scopes, every time is in the scope of the stage it concerns: a
message crossing scope boundaries is carried into the receiving input's time and counted there
(see :mod:`tracker.worker.vertex`).

One worker against an in-process tracker (:class:`~tracker.worker.link.LocalHub`; a
:class:`~tracker.worker.link.ServiceLink` talks to the service instead), feeding two epochs:

Long because: :class:`Worker` is one scheduler (delivery, notifications, progress batches,
frontier updates) whose ordering rules must be read together.

>>> import asyncio
>>> from tracker.reachability import Tracker
>>> from tracker.worker.link import LocalHub
>>> from tracker.worker.vertex import Dataflow, Vertex
>>> class Report(Vertex):
...     def on_recv(self, edge, message, time):
...         self.notify_at(time)
...     def on_notify(self, time):
...         print("epoch", time[0], "complete")
>>> flow = Dataflow("one")
>>> source = flow.input("in")
>>> sink = flow.stage("sink", lambda index, peers: Report(), inputs=1, outputs=0)
>>> flow.connect((source, 0), (sink, 0))
>>> tracker = Tracker(flow.graph())
>>> _ = tracker.apply(flow.initial(workers=1))
>>> async def drive(worker):
...     handle = worker.input(source)
...     handle.send(["a", "b"])
...     handle.advance_to(1)
...     handle.send(["c"])
...     handle.close()
>>> stats = asyncio.run(Worker(flow, 0, 1, LocalHub(tracker).link("w0")).run(drive))
epoch 0 complete
epoch 1 complete

With a loop scope, each vertex sees the times of its own scope: the runtime appends the loop
counter to a message entering the loop and drops it from one leaving, and a stage after the
loop is notified at ``(epoch,)`` once the loop holds nothing of that epoch any more:

>>> class Countdown(Vertex):
...     def on_recv(self, edge, n, time):
...         print("countdown", n, "at", time)
...         self.send_by(0 if n else 1, n - 1 if n else "liftoff", time)
>>> flow = Dataflow("countdown")
>>> source = flow.input("in")
>>> with flow.scope("loop") as loop:
...     count = loop.stage("count", lambda index, peers: Countdown(), inputs=2, outputs=2)
...     again = loop.feedback()
>>> after = flow.stage("after", lambda index, peers: Report(), inputs=1, outputs=0)
>>> for a, b in [((source, 0), (count, 0)), ((count, 0), (again, 0)), ((again, 0), (count, 1)),
...              ((count, 1), (after, 0))]:
...     flow.connect(a, b)
>>> async def drive(worker):
...     worker.input(source).send([2])
...     worker.input(source).close()
>>> stats = asyncio.run(Worker(flow, 0, 1, LocalHub.for_dataflow(flow, 1).link("w0")).run(drive))
countdown 2 at (0, 0)
countdown 1 at (0, 1)
countdown 0 at (0, 2)
epoch 0 complete
"""

from __future__ import annotations

import asyncio
import contextlib
import time as clock
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Coroutine, Iterable
from operator import methodcaller
from typing import Any

from tracker.graph import Location
from tracker.timestamp import Timestamp, less_equal
from tracker.worker.link import Link, Update
from tracker.worker.transport import Transport
from tracker.worker.vertex import AnyLocation, Channel, Dataflow, ProgressError, Vertex, reachable

Driver = Callable[["Worker"], Coroutine[Any, Any, None]]
"""Feeds a worker's inputs: an ``async def driver(worker)`` given to :meth:`Worker.run`."""
_SLICE = 256  # callbacks between two yields to the event loop (sockets must keep flowing)


class InputHandle:
    """Feeds one input stage from one worker; holds a capability at ``(epoch, 0, ...)``.

    ``send`` emits records at the current epoch, ``advance_to(e)`` moves the capability to a
    later epoch (``+1`` at the new time and ``-1`` at the old, in one batch), ``close()``
    drops it. Once every worker has advanced past epoch ``e``, notifications for ``e`` flow.
    Example, in a driver coroutine given to :meth:`Worker.run`::

        handle = worker.input(0)
        for epoch, records in enumerate(batches):
            handle.send(records)
            handle.advance_to(epoch + 1)
        handle.close()
    """

    def __init__(self, worker: Worker, stage: int) -> None:
        self.worker = worker
        self.stage = stage
        self.epoch = 0
        self.closed = False

    def time(self) -> Timestamp:
        """The current epoch as a full timestamp of the dataflow's arity."""
        return (self.epoch,) + (0,) * (self.worker.dataflow.arity - 1)

    def send(self, records: Iterable[Any], port: int = 0) -> None:
        """Send each record along output ``port`` at the current epoch (all or nothing).

        Raises:
            ProgressError: the input is closed, or a record goes to another worker and this
                worker has no transport.
        """
        if self.closed:
            raise ProgressError(f"input '{self._name()}' is closed")
        updates: list[Update] = []
        try:
            for record in records:
                self.worker._route(self.stage, port, record, self.time(), updates)
        except BaseException:
            self.worker._outbox = []  # all or nothing, as for callbacks
            raise
        self.worker._release()
        self.worker._submit(updates)

    def advance_to(self, epoch: int) -> None:
        """Promise that no record of an epoch before ``epoch`` will be sent any more.

        Raises:
            ProgressError: the input is closed, or ``epoch`` is not later than the current one.
        """
        if self.closed or epoch <= self.epoch:
            raise ProgressError(f"input '{self._name()}': cannot advance from epoch {self.epoch} to {epoch}")
        old = self.time()
        self.epoch = epoch
        self.worker._submit([u for p in range(self._outputs())
                             for u in ((self._source(p), self.time(), 1), (self._source(p), old, -1))])

    def close(self) -> None:
        """No more records at all: the capability is dropped."""
        if not self.closed:
            self.closed = True
            self.worker._submit([(self._source(p), self.time(), -1) for p in range(self._outputs())])

    def _name(self) -> str:
        return self.worker.dataflow.stages[self.stage].name

    def _outputs(self) -> int:
        return self.worker.dataflow.stages[self.stage].outputs

    def _source(self, port: int) -> AnyLocation:
        return self.worker.dataflow.stages[self.stage].source(port)


class Worker:
    """Worker ``index`` of ``peers``: see the module docstring for what it guarantees.

    ``trace``, if a list, receives ``("recv", stage, index, port, time)`` and
    ``("notify", stage, index, time)`` for every callback, in the order they ran.
    """

    def __init__(self, dataflow: Dataflow, index: int, peers: int, link: Link | None,
                 transport: Transport | None = None, *, trace: list[tuple[Any, ...]] | None = None) -> None:
        self.dataflow = dataflow
        self.index = index
        self.peers = peers
        self.link = link
        self.transport = transport
        self.trace = trace
        self.vertices: dict[int, Vertex] = {}
        for stage in dataflow.stages:
            if stage.factory is not None:
                vertex = stage.factory(index, peers)
                vertex.index, vertex.peers, vertex.stage, vertex._scheduler = index, peers, stage.id, self
                self.vertices[stage.id] = vertex
        self.inputs = {s.id: InputHandle(self, s.id) for s in dataflow.stages if s.factory is None}
        # Per stage (by id): its input and output locations as reported, and the arity of its times.
        self._targets = [[s.target(p) for p in range(s.inputs)] for s in dataflow.stages]
        self._sources = [[s.source(p) for p in range(s.outputs)] for s in dataflow.stages]
        self._arity = [dataflow.arity_of(s.id) for s in dataflow.stages]
        self._channels: dict[Location, list[Channel]] = defaultdict(list)
        for channel in dataflow.channels:
            self._channels[channel.source].append(channel)
        self.queue: deque[tuple[int, int, Timestamp, Any]] = deque()
        self.buffered: dict[int, Counter[Timestamp]] = defaultdict(Counter)
        self.requested: dict[int, set[Timestamp]] = defaultdict(set)
        self._active: tuple[int, str, int, Timestamp] | None = None  # stage, recv|notify, port, time
        self._updates: list[Update] = []
        self._outbox: list[tuple[int, Location, Timestamp, Any]] = []
        self._requests: list[Timestamp] = []
        self._event = asyncio.Event()
        self._probes: list[asyncio.Future[None]] = []
        self.stats: dict[str, float] = defaultdict(float)

    def input(self, stage: int) -> InputHandle:
        """This worker's handle on input stage ``stage``."""
        return self.inputs[stage]

    def passed(self, stage: int, time: Timestamp) -> bool:
        """True iff, as far as this worker knows, nothing at a time ``<= time`` can reach any
        input of ``stage`` any more (timely's probe); ``time`` is in the stage's scope."""
        view = self.link.view if self.link is not None else None
        return view is not None and not any(view.blocks(target, time) for target in self._targets[stage])

    async def probe(self, stage: int, time: Timestamp) -> None:
        """Wait until :meth:`passed` (e.g. an input driver pacing itself to the computation)."""
        while not self.passed(stage, time):
            waiter = asyncio.get_running_loop().create_future()
            self._probes.append(waiter)
            await waiter

    def _wake(self) -> None:
        self._event.set()
        probes, self._probes = self._probes, []
        for waiter in probes:
            if not waiter.done():
                waiter.set_result(None)

    # -- called by vertices (the Scheduler protocol of tracker.worker.vertex) ---------------------------

    def send_by(self, vertex: Vertex, port: int, message: Any, time: Timestamp) -> None:
        """Route ``message`` and count it; see :meth:`Vertex.send_by`."""
        stage, kind, held_port, held = self._holding(vertex)
        if not 0 <= port < self.dataflow.stages[stage].outputs:
            raise ProgressError(f"{self._named(stage)} has no output {port}")
        if len(time) != self._arity[stage]:
            raise ProgressError(f"time {time} does not have the arity {self._arity[stage]} of the scope of "
                                f"{self._named(stage)}")
        ok = less_equal(held, time) if kind == "notify" else reachable(
            self.dataflow.summaries(stage, held_port, port), held, time)
        if not ok:
            raise ProgressError(f"{self._named(stage)} holds {held} ({kind}) and cannot send at {time} on output "
                                f"{port}")
        self._route(stage, port, message, time, self._updates)

    def notify_at(self, vertex: Vertex, time: Timestamp) -> None:
        """Request ``on_notify(time)``; see :meth:`Vertex.notify_at`."""
        stage, kind, held_port, held = self._holding(vertex)
        outputs = self.dataflow.stages[stage].outputs
        if len(time) != self._arity[stage]:
            raise ProgressError(f"time {time} does not have the arity {self._arity[stage]} of the scope of "
                                f"{self._named(stage)}")
        if kind == "notify" or outputs == 0:
            ok = less_equal(held, time)
        else:
            ok = all(reachable(self.dataflow.summaries(stage, held_port, o), held, time) for o in range(outputs))
        if not ok:
            raise ProgressError(f"{self._named(stage)} holds {held} ({kind}) and cannot be notified at {time}")
        if time in self.requested[stage] or time in self._requests:
            return  # coalesced with the pending request: one capability, one on_notify
        self._requests.append(time)
        self._updates.extend((source, time, 1) for source in self._sources[stage])

    def _named(self, stage: int) -> str:
        """How errors name a stage: by its declared name (its id is an implementation detail)."""
        return f"stage '{self.dataflow.stages[stage].name}'"

    def _holding(self, vertex: Vertex) -> tuple[int, str, int, Timestamp]:
        if self._active is None or self._active[0] != vertex.stage:
            raise ProgressError("send_by and notify_at may only be called from the vertex's own callbacks")
        return self._active

    # -- routing and delivery --------------------------------------------------------------------

    def _route(self, stage: int, port: int, message: Any, time: Timestamp, updates: list[Update]) -> None:
        for channel in self._channels.get(Location.source(stage, port), ()):
            target = channel.target  # by stage id; its time is the receiving scope's
            dest = self.index if channel.partition is None else channel.partition(message) % self.peers
            if dest != self.index and self.transport is None:
                raise ProgressError(f"message for worker {dest} but this worker has no transport")
            arrives = channel.carry(time) if channel.leave or channel.enter else time
            updates.append((self._targets[target.node][target.port], arrives, 1))
            self._outbox.append((dest, target, arrives, message))

    def _release(self) -> None:
        """Hand the messages of a completed callback (or input call) on; a callback that
        raised releases nothing, so its effects are all or nothing."""
        outbox, self._outbox = self._outbox, []
        for dest, target, time, message in outbox:
            if dest == self.index:
                self.deliver(target.node, target.port, time, message)
            else:
                assert self.transport is not None  # _route refuses other workers' messages without one
                self.transport.send(dest, target.node, target.port, time, message)

    def deliver(self, stage: int, port: int, time: Timestamp, message: Any) -> None:
        """Queue a message for this worker's vertex of ``stage`` (local or from the transport)."""
        self.queue.append((stage, port, time, message))
        self.buffered[stage][time] += 1
        self._event.set()

    def _submit(self, updates: list[Update]) -> None:
        if self.link is None:
            raise ProgressError("this worker has no progress link")
        self.link.submit(updates)
        self._event.set()

    def _recv_one(self) -> None:
        stage, port, time, message = self.queue.popleft()
        counts = self.buffered[stage]
        counts[time] -= 1
        if not counts[time]:
            del counts[time]
        self._updates = [(self._targets[stage][port], time, -1)]
        self._active = (stage, "recv", port, time)
        if self.trace is not None:
            self.trace.append(("recv", stage, self.index, port, time))
        self._callback(stage, lambda vertex: vertex.on_recv(port, message, time))

    def _callback(self, stage: int, call: Callable[[Vertex], None]) -> None:
        try:
            call(self.vertices[stage])
        except BaseException:
            self._outbox, self._requests, self._updates = [], [], []
            raise
        finally:
            self._active = None
        self.requested[stage].update(self._requests)
        self._requests = []
        self._release()
        self._submit(self._updates)

    def deliverable(self, stage: int, time: Timestamp) -> bool:
        """True iff ``on_notify(time)`` is safe now for this worker's vertex of ``stage``."""
        if not self.passed(stage, time):
            return False
        return not any(less_equal(t, time) for t in self.buffered.get(stage, ()))

    def _notify_ready(self) -> bool:
        """Deliver every safe notification, earliest first; True if any ran."""
        ran = False
        for stage in list(self.requested):
            for time in sorted(self.requested[stage]):
                if time in self.requested[stage] and self.deliverable(stage, time):
                    self.requested[stage].discard(time)
                    self._updates = [(source, time, -1) for source in self._sources[stage]]
                    self._active = (stage, "notify", -1, time)
                    if self.trace is not None:
                        self.trace.append(("notify", stage, self.index, time))
                    self._callback(stage, methodcaller("on_notify", time))
                    ran = True
            if not self.requested[stage]:
                del self.requested[stage]
        return ran

    def holding(self) -> str:
        """What keeps this worker from finishing, in words: its open inputs' capabilities (the
        usual culprit: a driver that never called ``close()``), its pending notification
        requests and queued messages, else the locations whose frontier is not empty yet.

        >>> from tracker.worker.vertex import Dataflow
        >>> flow = Dataflow("one")
        >>> lines = flow.input("lines")
        >>> worker = Worker(flow, 0, 1, link=None)
        >>> worker.input(lines).epoch = 3
        >>> worker.holding()
        "input 'lines' still holds a capability at (3,); did you forget close()?"
        """
        stages = self.dataflow.stages
        held = [f"input '{stages[s].name}' still holds a capability at {h.time()}; did you forget close()?"
                for s, h in self.inputs.items() if not h.closed]
        held += [f"stage '{stages[s].name}' waits to be notified at {', '.join(map(str, sorted(times)))}"
                 for s, times in sorted(self.requested.items()) if times]
        if self.queue:
            held.append(f"{len(self.queue)} received messages not delivered yet")
        if held:
            return "; ".join(held)
        view = self.link.view if self.link is not None else None
        if view is None or not view.known:
            return "no frontier received from the service yet"
        ports = {location: f"'{stage.name}' {side} {port}" for stage in self.dataflow.stages
                 for side, locations in (("in", self._targets[stage.id]), ("out", self._sources[stage.id]))
                 for port, location in enumerate(locations)}
        waiting = sorted(f"{ports.get(location, location)}@{min(times)}" for location, times in view.times.items()
                         if times)
        if not waiting:
            return "batches not acknowledged by the service yet" if self.link is not None and not self.link.idle() \
                else "nothing held here"
        return (f"nothing held here, but the frontier is not empty at {', '.join(waiting[:5])}"
                f"{' and more' if len(waiting) > 5 else ''} (another worker still holds a capability)")

    def finished(self) -> bool:
        """Nothing left here and the frontier is empty everywhere: the dataflow is done."""
        return (not self.queue and not self.requested and self.link is not None and self.link.idle()
                and self.link.view.empty())

    # -- the loop ----------------------------------------------------------------------------------

    async def run(self, driver: Driver | None = None, timeout: float = 120.0) -> dict[str, float]:
        """Run callbacks until the dataflow is finished: nothing queued or requested here, every
        batch acknowledged, and every frontier empty.

        Args:
            driver: feeds this worker's inputs (runs concurrently; the worker keeps running
                after it returns, until the dataflow is finished).
            timeout: seconds before giving up.

        Returns:
            Statistics: ``busy_s`` in callbacks, ``wait_progress_s`` idle while notifications or
            the end of the dataflow waited for the frontier, ``wait_other_s`` idle otherwise,
            ``wall_s``, ``callbacks``, ``started_at`` and ``finished_at`` (epoch seconds), and the
            link's counters as ``link_*``.

        Raises:
            TimeoutError: not finished after ``timeout`` seconds.
            tracker.worker.link.LinkFailure: the tracker refused a batch for good.
            ProgressError: a vertex broke the protocol (and whatever else a callback or the driver
                raised).
            RuntimeError: the link stopped.
        """
        assert self.link is not None, "a worker needs a progress link to run"
        self.link.wake = self._wake
        if self.transport is not None:
            self.transport.attach(self.deliver)
        started = clock.perf_counter()
        self.stats["started_at"] = clock.time()
        deadline = started + timeout
        link_task = asyncio.create_task(self.link.run())
        driver_task = asyncio.create_task(driver(self)) if driver is not None else None
        try:
            while True:
                for task in (link_task, driver_task):
                    if task is not None and task.done() and (task is link_task or task.exception()):
                        task.result()
                        raise RuntimeError("the progress link stopped")
                if self.transport is not None and self.transport.failure is not None:
                    raise self.transport.failure
                busy = clock.perf_counter()
                ran = 0
                while self.queue and ran < _SLICE:
                    self._recv_one()
                    ran += 1
                ran += self._notify_ready()
                self.stats["callbacks"] += ran
                if ran:
                    self.stats["busy_s"] += clock.perf_counter() - busy
                    await asyncio.sleep(0)
                    continue
                if self.finished() and (driver_task is None or driver_task.done()):
                    break
                remaining = deadline - clock.perf_counter()
                if remaining <= 0:
                    raise TimeoutError(f"worker {self.index}: not finished after {timeout}s: {self.holding()}")
                waiting_on_progress = bool(self.requested) or driver_task is None or driver_task.done()
                self._event.clear()
                idle = clock.perf_counter()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._event.wait(), min(remaining, 1.0))
                key = "wait_progress_s" if waiting_on_progress else "wait_other_s"
                self.stats[key] += clock.perf_counter() - idle
        finally:
            for task in (driver_task, link_task):
                if task is not None and not task.done():
                    task.cancel()
            await self.link.close()
            await asyncio.gather(*(t for t in (link_task, driver_task) if t is not None), return_exceptions=True)
            if self.transport is not None:
                await self.transport.close()
        self.stats["wall_s"] = clock.perf_counter() - started
        self.stats["finished_at"] = clock.time()
        for key, value in self.link.stats.items():
            self.stats[f"link_{key}"] = value
        return dict(self.stats)
