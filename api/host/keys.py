"""Idempotent registration: a registration sent again with its ``Idempotency-Key`` gets the
first answer, and one whose sender gave up (its ``X-Tracker-Deadline`` passed) is not kept.

A key is kept with the registration (in its log record), so a retry after an unknown outcome
(a timeout, a lost answer, a restart in between) returns the same id and the same token: a
dataflow's token is derived from a secret of the warehouse (:func:`dataflow_token`), so the
service can give it again without keeping it. A retry with a different graph is refused
(409 ``idempotency_key_reused``). Two requests with one key at once: the second waits for the
first's outcome.

The front of several shards (:mod:`api.web.front`) sends every registration with a key and a
deadline (POSIX seconds): the shard refuses it if the deadline passed before it was logged, and
withdraws it (a logged deletion, never served, never listed) if it became durable only after
the deadline, when the front may have sent it to another shard; so each registration is kept by
one shard. Deadlines compare clocks: the hosts' clocks must agree within the front's grace
(:data:`api.web.front.GRACE_SECONDS`).

>>> secret = b"s" * 32
>>> dataflow_token(secret, "d1") == dataflow_token(secret, "d1") != dataflow_token(secret, "d2")
True
>>> keys = Keys(); keys.add("k", "d1"); keys.get("k"), keys.get("other")
('d1', None)
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import secrets
from collections.abc import AsyncIterator
from pathlib import Path

from api.host.tokens import shared_secret

KEY_HEADER = "idempotency-key"
"""The request header naming a registration's idempotency key (at most :data:`MAX_KEY` characters)."""
DEADLINE_HEADER = "x-tracker-deadline"
"""The request header of the front's deadline for a registration (POSIX seconds)."""
MAX_KEY = 200


def load_secret(warehouse: Path) -> bytes:
    """The warehouse's token secret (``<warehouse>/token-secret``, 0600), made on first use;
    shards sharing the warehouse share it (:func:`api.host.tokens.shared_secret`)."""
    return bytes.fromhex(shared_secret(warehouse / "token-secret", lambda: secrets.token_hex(32))[0])


def dataflow_token(secret: bytes, dataflow_id: str) -> str:
    """Dataflow ``dataflow_id``'s token: an HMAC of its id under the warehouse's secret (only
    its hash is kept, as before; the service can derive it again for a retried registration)."""
    digest = hmac.new(secret, b"dataflow-token\0" + dataflow_id.encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


class Keys:
    """Idempotency keys -> the dataflow registered with each, and the registrations in flight."""

    def __init__(self) -> None:
        self._done: dict[str, str] = {}
        self._flying: dict[str, asyncio.Event] = {}

    def get(self, key: str) -> str | None:
        """The dataflow registered with ``key``, if any."""
        return self._done.get(key)

    def add(self, key: str, dataflow_id: str) -> None:
        """``key`` registered ``dataflow_id`` (a durable registration, or one recovered)."""
        self._done[key] = dataflow_id

    @contextlib.asynccontextmanager
    async def claim(self, key: str) -> AsyncIterator[str | None]:
        """Within the block, no other request registers with ``key``: yields the dataflow a
        request with ``key`` registered before (then answer that), else ``None`` (then register,
        and :meth:`add` it once durable)."""
        while (flying := self._flying.get(key)) is not None:
            await flying.wait()
        if (known := self._done.get(key)) is not None:
            yield known
            return
        self._flying[key] = event = asyncio.Event()
        try:
            yield None
        finally:
            del self._flying[key]
            event.set()
