"""Dataflow ids and the shard each names.

Shard 0 gives out 32 lowercase hex digits (as every id did before shards, so a service with one
shard is unchanged and an older id is shard 0's); shard ``k >= 1`` gives out ``s<k>-`` followed
by hex digits, 32 characters in all (the write-ahead log attributes a record to at most 32
bytes). The proxy reads the shard from the path with ``field`` converters (:mod:`api.shards.haproxy`),
so no map of ids has to be kept in step with the registrations.

>>> shard_of("0123456789abcdef0123456789abcdef"), shard_of("s12-0123456789abcdef0123456789a")
(0, 12)
>>> shard_of("s012-abc"), shard_of("other"), shard_of("s1-XYZ")
(None, None, None)
>>> [shard_of(new_id(k)) for k in (0, 1, 999)], len(new_id(999))
([0, 1, 999], 32)
"""

from __future__ import annotations

import re
import uuid

MAX_SHARD = 999
"""The highest shard index (``s999-`` leaves 27 random hex digits, 108 bits)."""
PLAIN = re.compile(r"[0-9a-f]{32}")
"""Shard 0's ids (and every id from before shards)."""
SHARDED = re.compile(r"s(0|[1-9][0-9]{0,2})-[0-9a-f]+")
"""Shard k's ids: ``s<k>-`` (k without leading zeros) and hex digits."""


def new_id(shard: int) -> str:
    """A fresh random id of a dataflow on ``shard`` (0 to :data:`MAX_SHARD`)."""
    if not 0 <= shard <= MAX_SHARD:
        raise ValueError(f"a shard index is from 0 to {MAX_SHARD}, got {shard}")
    random = uuid.uuid4().hex
    if shard == 0:
        return random
    prefix = f"s{shard}-"
    return prefix + random[: 32 - len(prefix)]


def shard_of(dataflow_id: str) -> int | None:
    """The shard ``dataflow_id`` belongs to, or ``None`` if it is no id this service gives out."""
    if PLAIN.fullmatch(dataflow_id):
        return 0
    found = SHARDED.fullmatch(dataflow_id)
    return int(found.group(1)) if found else None
