"""Admission limits: how fast dataflows may be registered, how many may live, and how many
stream subscribers a dataflow and the whole service may have.

Guarantees: a refused admission raises :class:`LimitExceeded` (the 429 body and its
``Retry-After``) and changes nothing, in particular it consumes no slot; an admitted one holds a
:class:`Slot` until it is released, and releasing it twice frees it once, so that a client that
goes away by whatever path never leaks capacity. A limit of 0 means no limit.

>>> clock = [0.0]
>>> limits = Registrations(rate=1.0, burst=2, max_dataflows=0, clock=lambda: clock[0])
>>> [limits.admit("admin", live=0).release() for _ in range(2)]
[None, None]
>>> try:
...     limits.admit("admin", live=0)
... except LimitExceeded as refused:
...     print(refused.body["error"], refused.retry_after)
rate_limited 1
>>> clock[0] = 1.0  # one second refills one registration
>>> limits.admit("admin", live=0).release()
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


class LimitExceeded(Exception):
    """An admission refused: ``body`` is the 429 answer ``{"error", "detail", "retry_after"}``
    and ``retry_after`` the whole seconds a client should wait (the ``Retry-After`` header)."""

    def __init__(self, error: str, detail: str, retry_after: int) -> None:
        super().__init__(detail)
        self.retry_after = max(1, retry_after)
        self.body: dict[str, Any] = {"error": error, "detail": detail, "retry_after": self.retry_after}

    @property
    def reason(self) -> str:
        """A WebSocket close reason (at most 123 bytes of UTF-8): the error and its detail, cut."""
        return f"{self.body['error']}: {self.body['detail']}".encode()[:123].decode(errors="ignore")


@dataclass
class Slot:
    """One admitted registration or subscription; :meth:`release` gives it back (once).

    >>> freed = []
    >>> slot = Slot(lambda: freed.append(1))
    >>> slot.release(); slot.release(); freed
    [1]
    """

    _free: Callable[[], None] | None

    def release(self) -> None:
        """Give the slot back; later calls do nothing."""
        free, self._free = self._free, None
        if free is not None:
            free()


@dataclass
class TokenBucket:
    """``rate`` tokens per second, at most ``burst`` saved up; starts full.

    >>> bucket = TokenBucket(rate=2.0, burst=1, clock=lambda: 0.0)
    >>> bucket.take(), bucket.take(), bucket.wait()
    (True, False, 0.5)
    """

    rate: float
    burst: int
    clock: Callable[[], float] = time.monotonic
    tokens: float = field(init=False)
    stamp: float = field(init=False)

    def __post_init__(self) -> None:
        self.tokens = float(self.burst)
        self.stamp = self.clock()

    def _refill(self) -> None:
        now = self.clock()
        self.tokens = min(float(self.burst), self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now

    def take(self) -> bool:
        """Take one token if there is one."""
        self._refill()
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False

    def wait(self) -> float:
        """Seconds until the next token."""
        self._refill()
        return max(0.0, (1.0 - self.tokens) / self.rate)


class Registrations:
    """Registrations per caller (a token bucket each: ``rate`` per second, ``burst`` at once)
    and the number of live dataflows (``max_dataflows``, registrations in flight included, so
    that concurrent ones cannot overshoot it)."""

    def __init__(self, rate: float, burst: int, max_dataflows: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate
        self.burst = max(1, burst)
        self.max_dataflows = max_dataflows
        self.pending = 0
        self._clock = clock
        self._buckets: dict[str, TokenBucket] = {}

    def admit(self, caller: str, live: int) -> Slot:
        """A slot for one registration by ``caller`` while ``live`` dataflows exist; release it
        once the registration is answered (accepted or not). Raises :class:`LimitExceeded`."""
        if self.max_dataflows and live + self.pending >= self.max_dataflows:
            raise LimitExceeded("too_many_dataflows", (
                f"the service holds at most {self.max_dataflows} dataflows (TRACKER_MAX_DATAFLOWS)"), 60)
        if self.rate > 0:
            bucket = self._buckets.get(caller)
            if bucket is None:
                bucket = self._buckets[caller] = TokenBucket(self.rate, self.burst, self._clock)
            if not bucket.take():
                raise LimitExceeded("rate_limited", (
                    f"at most {self.burst} registrations at once and {self.rate:g} per second per token "
                    "(TRACKER_REGISTER_BURST, TRACKER_REGISTER_RATE)"), math.ceil(bucket.wait()))
        self.pending += 1
        return Slot(self._done)

    def _done(self) -> None:
        self.pending -= 1


class Subscriptions:
    """Live stream subscriptions (SSE and WebSocket together), at most ``per_dataflow`` on one
    dataflow and ``total`` over all.

    >>> subs = Subscriptions(per_dataflow=1, total=0)
    >>> slot = subs.admit("d1")
    >>> try:
    ...     subs.admit("d1")
    ... except LimitExceeded as refused:
    ...     print(refused.body["error"])
    too_many_subscribers
    >>> slot.release(); subs.admit("d1").release(); subs.count("d1")
    0
    """

    def __init__(self, per_dataflow: int, total: int) -> None:
        self.per_dataflow = per_dataflow
        self.total = total
        self.live = 0
        self._by_dataflow: dict[str, int] = {}

    def count(self, dataflow_id: str) -> int:
        """Subscriptions held on ``dataflow_id`` now."""
        return self._by_dataflow.get(dataflow_id, 0)

    def admit(self, dataflow_id: str) -> Slot:
        """A slot for one subscriber of ``dataflow_id``. Raises :class:`LimitExceeded`."""
        if self.per_dataflow and self.count(dataflow_id) >= self.per_dataflow:
            raise LimitExceeded("too_many_subscribers", (
                f"a dataflow has at most {self.per_dataflow} stream subscribers "
                "(TRACKER_MAX_SUBSCRIBERS_PER_DATAFLOW)"), 5)
        if self.total and self.live >= self.total:
            raise LimitExceeded("too_many_subscribers", (
                f"the service has at most {self.total} stream subscribers (TRACKER_MAX_SUBSCRIBERS)"), 5)
        self.live += 1
        self._by_dataflow[dataflow_id] = self.count(dataflow_id) + 1
        return Slot(lambda: self._done(dataflow_id))

    def _done(self, dataflow_id: str) -> None:
        self.live -= 1
        left = self._by_dataflow[dataflow_id] - 1
        if left:
            self._by_dataflow[dataflow_id] = left
        else:
            del self._by_dataflow[dataflow_id]


@dataclass
class Limits:
    """Every admission limit of one service (see ``docs/running.md``, "Limits and protections")."""

    registrations: Registrations
    subscriptions: Subscriptions
