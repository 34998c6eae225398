"""A worker's link to the progress tracker: batches out, acknowledgements and frontiers in.

:class:`ServiceLink` talks to the service over one WebSocket (``WS /v1/dataflows/{id}/ws``):
it sends atomic batches ``{"worker", "seq", "updates"}`` in FIFO order, keeps every batch until
it is acknowledged, and on any disconnection reconnects (with backoff) and resends the
unacknowledged batches *with the same seq*, so the service applies each exactly once (it
acknowledges a duplicate without applying it). A 5xx answer to a batch (the service's own
trouble, such as 503 ``log_failed``) is taken the same way; a refusal of the batch itself is
fatal (:class:`LinkFailure`). Every (re)connection starts with a ``snapshot``
that replaces the local :class:`FrontierView`; ``changes`` events then keep it current.

:class:`LocalHub` is an in-process stand-in (the core's :class:`~tracker.reachability.Tracker`
behind the same interface, with random delays on both directions) for fast randomized tests.

Updates waiting to be sent are merged into one batch when the link is free to send: the
concatenation of consecutive atomic batches of one worker is itself atomic and keeps FIFO
order, so merging never exposes a state the protocol would not allow.

What a link guarantees its :class:`~tracker.worker.Worker`: every submitted batch is applied
exactly once, in submission order, never split; :attr:`Link.view` only ever holds a frontier the
tracker published (possibly an old one, which is safe). Against an in-process tracker:

Long because: the two links (to the service, in-process) and the frontier view they both
feed share one contract, best read side by side.

>>> import asyncio
>>> from tracker.graph import Edge, Graph, Location, Node
>>> graph = Graph.build(1, [Node(0, 0, 1), Node(1, 1, 0)], [Edge(Location.source(0, 0), Location.target(1, 0))])
>>> tracker = Tracker(graph)
>>> _ = tracker.apply(graph.default_initial())
>>> async def advance() -> FrontierView:
...     link = LocalHub(tracker).link("w0")
...     task = asyncio.create_task(link.run())
...     link.submit([(Location.source(0, 0), (1,), 1), (Location.source(0, 0), (0,), -1)])
...     while not (link.idle() and link.view.version == 1):  # acknowledged, and its change received
...         await asyncio.sleep(0)
...     await link.close()
...     await task
...     return link.view
>>> view = asyncio.run(advance())
>>> view.version, view.blocks(Location.target(1, 0), (0,)), view.blocks(Location.target(1, 0), (1,))
(1, False, True)
"""

from __future__ import annotations

import asyncio
import json
import random
from collections import defaultdict, deque
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from tracker.reachability import Tracker
from tracker.scope import NestedGraph, Scope
from tracker.scoped import ScopedTracker
from tracker.timestamp import Timestamp, less_equal
from tracker.worker.vertex import AnyLocation, Dataflow, as_scoped, location_json, location_update, parse_location

if TYPE_CHECKING:  # websockets is imported when a link runs, not when the SDK is imported
    from websockets.asyncio.client import ClientConnection

MERGE_LIMIT = 5000  # updates per merged batch (~400 KB of JSON)
Update = tuple[AnyLocation, Timestamp, int]
"""An occurrence-count change as a worker reports it: ``(location, time, delta)``, the location
a :class:`~tracker.graph.Location` in the root scope or a :class:`~tracker.scope.ScopedLocation`."""


class LinkFailure(RuntimeError):
    """The progress tracker refused a batch for good (invalid update, lost acknowledged state)."""


class FrontierView:
    """The worker's copy of the published frontier of every location.

    It may lag behind the service, which is safe: with atomic batches applied in per-worker
    FIFO order, an older frontier is never ahead of a newer one (the safety invariant of
    ``docs/core.md``).

    >>> from tracker.graph import Location
    >>> view = FrontierView()
    >>> view.snapshot(3, [{"location": {"node": 1, "port": 0, "kind": "target"}, "frontier": [[2]]}])
    >>> view.blocks(Location.target(1, 0), (2,)), view.blocks(Location.target(1, 0), (1,))
    (True, False)
    >>> view.snapshot(-1, [{"location": {"node": 1, "port": 0, "kind": "target"}, "frontier": []}])
    >>> view.blocks(Location.target(1, 0), (0,)), view.empty()
    (True, False)
    """

    def __init__(self) -> None:
        self.known = False
        self.version: int | None = None  # of the state held; None before the first snapshot
        self.times: dict[AnyLocation, set[Timestamp]] = {}

    def snapshot(self, version: int, locations: list[dict[str, Any]]) -> None:
        """Replace everything by a ``snapshot`` event's ``locations``.

        A negative version means the service has computed no frontier yet (``--engine spark``
        before its first micro-batch): its empty lists must not read as "nothing can arrive",
        so the view stays unknown until the first ``changes`` event builds on it."""
        self.times = {}
        for row in locations:
            self.times[parse_location(row["location"])] = {tuple(t) for t in row["frontier"]}
        self.version = version
        self.known = version >= 0

    def apply(self, version: int, changes: list[dict[str, Any]]) -> None:
        """Fold a ``changes`` event in; events at or below the current version are ignored."""
        if self.version is None or version <= self.version:
            return
        for change in changes:
            times = self.times.setdefault(parse_location(change["location"]), set())
            if change["diff"] > 0:
                times.add(tuple(change["time"]))
            else:
                times.discard(tuple(change["time"]))
        self.version = version
        self.known = True

    def blocks(self, location: AnyLocation, time: Timestamp) -> bool:
        """True while some frontier element at ``location`` is ``<= time`` (or nothing is known
        yet): a notification at ``time`` must wait. ``location`` and ``time`` are in the
        location's scope (a :class:`~tracker.graph.Location` for the root, a
        :class:`~tracker.scope.ScopedLocation` inside a nested scope)."""
        if not self.known:
            return True
        return any(less_equal(f, time) for f in self.times.get(location, ()))

    def empty(self) -> bool:
        """True iff known and every location's frontier is empty: the dataflow is finished."""
        return self.known and not any(self.times.values())


def consolidate(updates: Iterable[Update]) -> list[Update]:
    """Sum the deltas per ``(location, time)``, drop zeros, keep first-seen order.

    >>> from tracker.graph import Location
    >>> a = Location.target(1, 0)
    >>> consolidate([(a, (1,), 1), (a, (2,), 1), (a, (1,), -1)])
    [(Location(node=1, port=0, kind='target'), (2,), 1)]
    """
    sums: dict[tuple[AnyLocation, Timestamp], int] = {}
    for loc, time, delta in updates:
        sums[(loc, time)] = sums.get((loc, time), 0) + delta
    return [(loc, time, d) for (loc, time), d in sums.items() if d != 0]


class Link:
    """What a :class:`~tracker.worker.Worker` needs from the progress tracker: ``submit`` atomic
    batches (sent in order, merged but never split, each exactly once), a :class:`FrontierView`
    kept current, ``wake`` called on every ack or frontier change, and ``run``/``close``."""

    def __init__(self, worker: str) -> None:
        self.worker = worker
        self.view = FrontierView()
        self.wake: Callable[[], None] = lambda: None
        self.pending: deque[list[Update]] = deque()  # whole callback batches, oldest first
        self.unacked: deque[tuple[int, str]] = deque()
        self.next_seq = 0
        self.stats: dict[str, int] = defaultdict(int)
        self._more = asyncio.Event()
        self._closing = False

    def submit(self, updates: list[Update]) -> None:
        """Queue one atomic batch (it may be merged with neighbours, never split)."""
        if updates:
            self.pending.append(list(updates))
            self._more.set()

    def idle(self) -> bool:
        """Nothing waiting to be sent and every sent batch acknowledged."""
        return not self.pending and not self.unacked

    def _next_batch(self) -> tuple[int, str] | None:
        # Merge whole batches, oldest first, up to MERGE_LIMIT updates (the service caps a
        # message at 1 MiB); a single larger batch still goes alone, never split.
        merged = self.pending.popleft()
        while self.pending and len(merged) + len(self.pending[0]) <= MERGE_LIMIT:
            merged.extend(self.pending.popleft())
        updates = consolidate(merged)
        if not updates:
            return None  # the merged updates cancel out: nothing to tell anyone
        seq = self.next_seq
        self.next_seq += 1
        text = json.dumps({"worker": self.worker, "seq": seq,
                           "updates": [location_update(loc, t, d) for loc, t, d in updates]})
        self.unacked.append((seq, text))
        self.stats["batches"] += 1
        self.stats["updates"] += len(updates)
        return seq, text

    async def _to_send(self, window: int | None = None) -> tuple[int, str] | None:
        """The next batch to send (as :meth:`_next_batch` makes it), waiting while nothing is
        pending or ``window`` sent batches are unacknowledged; ``None`` once :meth:`close` is called."""
        while not self._closing:
            if not self.pending or (window is not None and len(self.unacked) >= window):
                self._more.clear()
                await self._more.wait()
                continue
            batch = self._next_batch()
            if batch is not None:
                return batch
        return None

    def _acked(self, seq: int) -> None:
        while self.unacked and self.unacked[0][0] <= seq:
            self.unacked.popleft()

    async def run(self) -> None:
        """Keep the link up until :meth:`close`; raise :class:`LinkFailure` on a fatal refusal."""
        raise NotImplementedError

    async def close(self) -> None:
        """Stop :meth:`run`."""
        self._closing = True
        self._more.set()


class ServiceLink(Link):
    """One WebSocket to the service; see the module docstring for the guarantees.

    ``max_inflight`` bounds unacknowledged batches (while it is reached, new updates keep merging
    into the next batch); ``delay`` adds a random pause before each send (tests; FIFO is kept).
    Example (inside a running event loop; a :class:`~tracker.worker.Worker` does this)::

        link = ServiceLink("http://127.0.0.1:8000", dataflow_id, dataflow_token, "w0")
        task = asyncio.create_task(link.run())
        link.submit([(Location.source(0, 0), (1,), 1), (Location.source(0, 0), (0,), -1)])
        ...  # link.view follows the frontier; link.idle() once everything is acknowledged
        await link.close()
    """

    def __init__(self, url: str, dataflow: str, token: str, worker: str, *, max_inflight: int = 4,
                 delay: float = 0.0, seed: int | None = None) -> None:
        super().__init__(worker)
        base = url.rstrip("/").replace("http://", "ws://", 1).replace("https://", "wss://", 1)
        self.ws_url = f"{base}/v1/dataflows/{dataflow}/ws"
        self.token = token
        self.max_inflight = max_inflight
        self.delay = delay
        self.rng = random.Random(seed)
        self.connected = False
        self.refusal_window = 30.0  # seconds of 401/403/404 answers before giving up
        self._ws: ClientConnection | None = None

    async def run(self) -> None:
        import websockets

        backoff = 0.05
        refused_since: float | None = None
        while not self._closing:
            try:
                async with websockets.connect(
                    self.ws_url, additional_headers={"Authorization": f"Bearer {self.token}"},
                    max_size=None, open_timeout=5, ping_interval=2, ping_timeout=5, close_timeout=1,
                ) as ws:
                    self._ws, self.connected, backoff, refused_since = ws, True, 0.05, None
                    self.stats["connections"] += 1
                    # Resend what the service may not have: same seqs, so at most one applies.
                    for _seq, text in list(self.unacked):
                        await ws.send(text)
                        self.stats["resent"] += 1
                    await self._session(ws)
            except LinkFailure:
                raise
            except (TimeoutError, OSError, websockets.exceptions.WebSocketException) as error:
                if isinstance(error, websockets.exceptions.InvalidStatus) and error.response.status_code in (
                        401, 403, 404):
                    # A restarting service may not know the dataflow yet: refusals are final
                    # only once they persist.
                    now = asyncio.get_running_loop().time()
                    refused_since = now if refused_since is None else refused_since
                    if now - refused_since > self.refusal_window:
                        raise LinkFailure(f"service refused the connection: {error}") from None
            finally:
                self._ws, self.connected = None, False
            if not self._closing:
                self.stats["reconnects"] += 1
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 1.0)

    async def _session(self, ws: ClientConnection) -> None:
        reader = asyncio.create_task(self._read(ws))
        writer = asyncio.create_task(self._write(ws))
        try:
            done, _ = await asyncio.wait({reader, writer}, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                task.result()  # re-raise a failure or a lost connection
        finally:
            for task in (reader, writer):
                task.cancel()
            await asyncio.gather(reader, writer, return_exceptions=True)

    async def _write(self, ws: ClientConnection) -> None:
        while (batch := await self._to_send(self.max_inflight)) is not None:
            if self.delay:
                await asyncio.sleep(self.rng.random() * self.delay)
            await ws.send(batch[1])
        await ws.close()

    async def _read(self, ws: ClientConnection) -> None:
        async for raw in ws:
            message = json.loads(raw)
            kind = message.get("type")
            if kind == "snapshot":
                self.view.snapshot(message["version"], message["locations"])
            elif kind == "changes":
                self.view.apply(message["version"], message["changes"])
            elif kind == "ack":
                self._acked(message["seq"])
                self.stats["duplicates"] += bool(message.get("duplicate"))
                self._more.set()
            elif kind == "error":
                self._refused(message)
                return  # reconnect: the service's view of our sequence is ahead, or it had trouble
            self.wake()

    def _refused(self, message: dict[str, Any]) -> None:
        expected = message.get("expected")
        if message.get("error") == "sequence_gap" and self.unacked and isinstance(expected, int) \
                and self.unacked[0][0] <= expected <= self.unacked[-1][0]:
            self._acked(expected - 1)  # the service has everything before `expected`
            self.stats["gaps"] += 1
            return
        if int(message.get("status") or 0) >= 500:  # its trouble, not the batch's: resend, as the POST link does
            self.stats["server_errors"] += 1
            return
        raise LinkFailure(f"service refused batch {message.get('seq')} of {self.worker}: {message}")

    async def close(self) -> None:
        await super().close()
        if self._ws is not None:
            await self._ws.close()


class LocalHub:
    """An in-process progress tracker with the service's semantics, for tests.

    Batches of each worker are applied in FIFO order after a random delay, and each link sees
    the resulting frontier changes after its own random delay (in version order). The tracker
    is a :class:`~tracker.scoped.ScopedTracker` (any dataflow, scopes or not); a flat
    :class:`~tracker.reachability.Tracker` is accepted too, for a dataflow without scopes.
    Frontier changes reach links in the service's JSON shape. Example::

        hub = LocalHub.for_dataflow(flow, workers=2, delay=0.002, seed=1)
        workers = [Worker(flow, i, 2, hub.link(f"w{i}"), transports[i]) for i in range(2)]
    """

    def __init__(self, tracker: ScopedTracker | Tracker, *, delay: float = 0.0, seed: int = 0) -> None:
        if isinstance(tracker, Tracker):
            flat = tracker
            root = Scope((), "root", flat.graph.arity, flat.graph, frozenset())
            tracker = ScopedTracker(NestedGraph({(): root}, {}), lambda graph: flat)
        self.tracker = tracker
        self.delay = delay
        self.rng = random.Random(seed)
        self.version = 0
        self.links: list[LocalLink] = []

    @classmethod
    def for_dataflow(cls, flow: Dataflow, workers: int, *, delay: float = 0.0, seed: int = 0) -> LocalHub:
        """A hub tracking ``flow`` (scopes or not), started with the capabilities of ``workers``
        workers' inputs, as the service is when the dataflow is registered."""
        tracker = ScopedTracker(flow.nested())
        tracker.apply([(as_scoped(loc), t, d) for loc, t, d in flow.initial(workers)])
        return cls(tracker, delay=delay, seed=seed)

    def link(self, worker: str) -> LocalLink:
        """A new link for ``worker``."""
        link = LocalLink(self, worker)
        self.links.append(link)
        return link

    def _apply(self, updates: list[Update]) -> None:
        changes = self.tracker.apply([(as_scoped(loc), t, d) for loc, t, d in updates])
        self.version += 1
        encoded = [{"location": location_json(c.location), "time": list(c.time), "diff": c.diff} for c in changes]
        for link in self.links:
            link.inbox.put_nowait((self.version, encoded))

    def _snapshot(self) -> list[dict[str, Any]]:
        return [{"location": location_json(loc), "frontier": [list(t) for t in ts]}
                for loc, ts in self.tracker.frontiers().items()]


class LocalLink(Link):
    """A :class:`Link` to a :class:`LocalHub`."""

    def __init__(self, hub: LocalHub, worker: str) -> None:
        super().__init__(worker)
        self.hub = hub
        self.inbox: asyncio.Queue[tuple[int, list[dict[str, Any]]]] = asyncio.Queue()

    async def run(self) -> None:
        self.view.snapshot(self.hub.version, self.hub._snapshot())
        receiver = asyncio.create_task(self._receive())
        try:
            while (batch := await self._to_send()) is not None:
                await self._pause()
                updates = json.loads(batch[1])["updates"]
                self.hub._apply([(parse_location(u["location"]), tuple(u["time"]), u["delta"]) for u in updates])
                self._acked(batch[0])
                self.wake()
        finally:
            receiver.cancel()

    async def _receive(self) -> None:
        while True:
            version, changes = await self.inbox.get()
            await self._pause()
            self.view.apply(version, changes)
            self.wake()

    async def _pause(self) -> None:
        await asyncio.sleep(self.hub.rng.random() * self.hub.delay if self.hub.delay else 0)
