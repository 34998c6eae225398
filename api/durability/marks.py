"""The log's high-water marks: for every dataflow, the highest version acknowledged (and whether
its registration and deletion were), kept in a block at the start of every segment, where a
cut of the segment's tail cannot reach.

Guarantees: a mark names only what an ``fdatasync`` already made durable (the log writes it
after the sync returns), so after any crash the log holds everything a mark claims unless the
log was damaged or cut since; recovery compares the newest segment's marks with what the log
and the Delta ``progress`` table still hold (:mod:`api.durability.recovery`).

Where a mark becomes durable: it is written into the page cache as soon as its group's sync
returned, before anything is acknowledged, so a process crash (``kill -9``) never loses it; the
next group's ``fdatasync`` of the same file makes it durable with no sync of its own, and once
no group followed for :data:`IDLE_SYNC_SECONDS`, the log syncs the segment once. Only a power
loss within that window, and then a cut of exactly the records the lost marks covered, goes
unnoticed (the records themselves were synced before they were acknowledged).

Layout (little endian), before the first frame of a segment::

    head = <8s MAGIC><u32 slots><u64 header end><u32 crc32(the 20 bytes before)>  zero padding to 64
    slot = <32s dataflow id><u64 version><u8 state>  zero padding  <u32 crc32(the 60 bytes before)>

``header end`` is where the segment's header records (the registrations and checkpoints it
starts with) end. A slot of zeros is free. A slot is 64 bytes, so eight share a 512-byte sector
and a slot is written whole or not at all. The magic's first four bytes, read as a frame's
length, exceed any record, so a segment is never mistaken for frames or the reverse.

>>> marks = Marks.fresh({"d1": Mark(3, REGISTERED)})
>>> marks.take("d2") and marks.acknowledge("d2", 0, REGISTERED); marks.acknowledge("d1", 5, REGISTERED)
>>> [(offset, len(data)) for offset, data in marks.dirty_runs()], marks.dirty_runs()
([(64, 128)], [])
>>> block = read_block(marks.block(header_end=marks.size))
>>> block.marks, block.size, block.damaged
({'d1': Mark(version=5, state=1), 'd2': Mark(version=0, state=1)}, 1088, [])
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

MAGIC = b"\xff\xff\xff\xffTPM1"
SLOT = 64
_HEAD = struct.Struct("<8sIQ")
_SLOT = struct.Struct("<32sQB")
_CHECK = struct.Struct("<I")
REGISTERED, DELETED = 1, 2
"""A mark's states: the registration was acknowledged; so was the deletion."""
MIN_SLOTS = 16
"""A new segment's block holds at least this many slots, and twice the dataflows it names."""
IDLE_SYNC_SECONDS = 1.0
"""When no group followed the marks a group wrote for this long, the log syncs them."""


@dataclass(frozen=True)
class Mark:
    """What was acknowledged of one dataflow: batches up to ``version``, and its ``state``."""

    version: int
    state: int


class DamagedBlock(ValueError):
    """A segment's mark block is cut or fails its checksum, at byte ``offset``."""

    def __init__(self, offset: int, reason: str) -> None:
        super().__init__(reason)
        self.offset = offset


class Marks:
    """The current segment's block in memory: one slot per dataflow, and the slots changed
    since they were last written."""

    def __init__(self, slots: int, marks: dict[str, Mark], positions: dict[str, int]) -> None:
        self.slots = slots
        self.marks = marks
        self._index = positions
        self._free = [i for i in range(slots - 1, -1, -1) if i not in set(positions.values())]
        self._dirty: set[int] = set()

    @classmethod
    def fresh(cls, marks: dict[str, Mark], pending: tuple[str, ...] = ()) -> Marks:
        """A new segment's block: every mark, a slot for each dataflow in ``pending`` (its
        first record is not acknowledged yet), and room to grow."""
        order = sorted(marks) + sorted(set(pending) - set(marks))
        return cls(max(MIN_SLOTS, 2 * len(order)), dict(marks), {d: i for i, d in enumerate(order)})

    def copy(self) -> Marks:
        """A copy to render in another thread while this one keeps taking slots."""
        return Marks(self.slots, dict(self.marks), dict(self._index))

    def names(self) -> list[str]:
        """The dataflows with a slot (acknowledged or not yet)."""
        return list(self._index)

    @property
    def size(self) -> int:
        """Bytes of the block: where the segment's first frame starts."""
        return SLOT * (self.slots + 1)

    def take(self, dataflow: str) -> bool:
        """Give ``dataflow`` a slot if it has none and one is free; ``False`` if the block is full."""
        if dataflow in self._index:
            return True
        if not self._free:
            return False
        self._index[dataflow] = self._free.pop()
        return True

    def acknowledge(self, dataflow: str, version: int, state: int) -> None:
        """Raise ``dataflow``'s mark (it must have a slot): a mark never goes down."""
        old = self.marks.get(dataflow)
        mark = Mark(max(version, old.version if old else 0), max(state, old.state if old else 0))
        if mark != old:
            self.marks[dataflow] = mark
            self._dirty.add(self._index[dataflow])

    def block(self, header_end: int) -> bytes:
        """The whole block, its header ending at ``header_end``."""
        head = _HEAD.pack(MAGIC, self.slots, header_end)
        data = bytearray(head + _CHECK.pack(zlib.crc32(head)) + bytes(SLOT * (self.slots + 1) - _HEAD.size
                                                                      - _CHECK.size))
        for dataflow, index in self._index.items():
            data[SLOT * (index + 1):SLOT * (index + 2)] = self._slot(dataflow)
        self._dirty.clear()
        return bytes(data)

    def _slot(self, dataflow: str) -> bytes:
        mark = self.marks.get(dataflow)
        if mark is None:  # taken, not acknowledged yet: free as far as a reader knows
            return bytes(SLOT)
        fields = _SLOT.pack(dataflow.encode("ascii"), mark.version, mark.state).ljust(SLOT - _CHECK.size, b"\0")
        return fields + _CHECK.pack(zlib.crc32(fields))

    def dirty_runs(self) -> list[tuple[int, bytes]]:
        """``(offset, bytes)`` of the changed slots, neighbours written together; then clean."""
        owners = {index: dataflow for dataflow, index in self._index.items() if index in self._dirty}
        runs: list[tuple[int, bytes]] = []
        for index in sorted(owners):
            data = self._slot(owners[index])
            offset = SLOT * (index + 1)
            if runs and runs[-1][0] + len(runs[-1][1]) == offset:
                runs[-1] = (runs[-1][0], runs[-1][1] + data)
            else:
                runs.append((offset, data))
        self._dirty.clear()
        return runs


def has_block(data: bytes) -> bool:
    """Whether ``data`` (a segment's first bytes) starts with a mark block."""
    return data[:len(MAGIC)] == MAGIC


@dataclass(frozen=True)
class Block:
    """A segment's mark block as read: ``marks`` by dataflow, its ``size`` (where the first
    frame starts), where the header records end, the slots that fail their checksum (whose
    marks they held cannot be known), and the block to go on appending with."""

    marks: dict[str, Mark]
    size: int
    header_end: int
    damaged: list[int]
    live: Marks


def read_block(data: bytes) -> Block:
    """The mark block at the start of a segment's bytes.

    Raises:
        DamagedBlock: the block's head is damaged or the data ends inside the block (where the
            frames start, and the marks, cannot be known).
    """
    if len(data) < SLOT or not has_block(data):
        raise DamagedBlock(0, "the segment does not start with its mark block")
    head = data[:_HEAD.size]
    if _CHECK.unpack_from(data, _HEAD.size)[0] != zlib.crc32(head):
        raise DamagedBlock(0, "the mark block's head fails its checksum")
    _, slots, header_end = _HEAD.unpack(head)
    size = SLOT * (slots + 1)
    if len(data) < size:
        raise DamagedBlock(len(data), f"the segment ends inside its mark block ({size} bytes)")
    marks: dict[str, Mark] = {}
    positions: dict[str, int] = {}
    damaged: list[int] = []
    for offset in range(SLOT, size, SLOT):
        slot = data[offset:offset + SLOT]
        if not any(slot):
            continue
        fields = slot[:SLOT - _CHECK.size]
        if _CHECK.unpack_from(slot, SLOT - _CHECK.size)[0] != zlib.crc32(fields):
            damaged.append(offset)  # whose it is cannot be known (the log does not go on with this block)
            continue
        dataflow, version, state = _SLOT.unpack_from(fields)
        name = dataflow.rstrip(b"\0").decode("ascii", "replace")
        marks[name] = Mark(version, state)
        positions[name] = offset // SLOT - 1
    return Block(marks, size, header_end, damaged, Marks(slots, dict(marks), positions))
