"""The write-ahead log's on-disk form: record framing, the reading of a segment that tells a torn
write from corruption, segment file names, and the reading of the whole log at recovery, in
one place.

Guarantees: every reader and writer of segments (the log, its sync process, recovery) names and
frames them through this module. A segment is a file ``wal-<number, six digits>.log``: its
high-water marks' block (:mod:`api.durability.marks`), then frames back to back; it is created
whole under another name and renamed (:func:`create_segment`). A frame is a header written
twice, then the payload::

    header = <u32 length><u32 crc32(payload)><attribution, 41 bytes><u32 crc32(the 49 bytes before)>
    frame  = header header payload                        (little endian)

The attribution (:data:`ATTRIBUTION`: kind, version, dataflow id) is the payload's own first 41
bytes (:mod:`api.durability.records` puts them there), copied into the header so that a record whose payload
is damaged can still be attributed to its dataflow. Two header copies, each with its own CRC:
one damaged byte anywhere leaves one copy intact, so the frame's length and attribution stay
known and reading goes on after it.

:func:`scan` classifies what it reads: intact payloads; *damaged* frames (an intact header but a
payload that fails its CRC, whether or not valid frames follow); a *torn* tail (the file ends
inside a frame, or only zero bytes follow from inside it: what a crash during a write leaves,
the zeros being blocks the write never filled); and *unreadable* bytes (neither header
copy intact and not a torn tail: nothing says whose they are, so reading of the segment stops
there). A payload never ends in a zero byte (it ends in JSON), so a final frame whose payload
ends in zeros, followed by zeros only, two or more in all, is torn; any one damaged byte leaves
a complete final record damaged, never torn. A torn record may have been acknowledged (the
segment was cut after the fact): it is cut off only when the marks show it was not
(:func:`api.durability.recovery.settle_tail`).

Long because: the segment's format and its reading at recovery (framing, the scan's verdicts,
the marks compared with what was read) are one format and must be read together.

>>> from api.durability.records import ATTRIBUTION
>>> a, b = (ATTRIBUTION.pack(1, v, b"d1") + b"x" * v for v in (1, 2))
>>> scan(frame(a) + frame(b)[:-1]).payloads == [(0, a)], scan(frame(a) + frame(b)[:-1]).torn
(True, 148)
>>> bad = bytearray(frame(a) + frame(b)); bad[148 + HEADER_SIZE + 3] ^= 1   # a flipped byte in b's payload
>>> found = scan(bytes(bad)); [p for _, p in found.payloads] == [a], found.damaged[0].attribution
(True, (1, 2, 'd1'))
>>> segment_name(7), segment_number(Path("wal-000007.log")), segment_number(Path("notes.txt"))
('wal-000007.log', 7, None)
"""

from __future__ import annotations

import logging
import os
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from api.durability.marks import Block, DamagedBlock, Mark, Marks, read_block
from api.durability.records import (
    ATTRIBUTION,
    REGISTER,
    Record,
    Register,
    attribution,
    decode,
    encode,
)

log = logging.getLogger("tracker.wal")

_FIELDS = struct.Struct(f"<II{ATTRIBUTION.size}s")
_CHECK = struct.Struct("<I")
HEADER_SIZE = 2 * (_FIELDS.size + _CHECK.size)
"""Bytes in front of every payload (the two header copies)."""
MAX_RECORD = 256 * 1024 * 1024
"""A header claiming more is corrupt (a record is a request body plus a small header)."""


def frame(payload: bytes) -> bytes:
    """``payload`` (which starts with its attribution) behind its two header copies."""
    fields = _FIELDS.pack(len(payload), zlib.crc32(payload), payload[:ATTRIBUTION.size])
    header = fields + _CHECK.pack(zlib.crc32(fields))
    return header + header + payload


@dataclass(frozen=True)
class Damage:
    """Bytes ``[start, end)`` of a segment that are not an intact record. ``attribution`` is
    ``(kind, version, dataflow id)`` when a header copy survived (the record's extent is then
    known), ``None`` for unreadable bytes (``end`` is then the end of the data)."""

    start: int
    end: int
    attribution: tuple[int, int, str] | None
    reason: str


@dataclass
class Scan:
    """What :func:`scan` found in a segment's bytes."""

    payloads: list[tuple[int, bytes]] = field(default_factory=list)
    """``(offset, payload)`` of every intact frame, in order."""
    damaged: list[Damage] = field(default_factory=list)
    """Damaged frames, and at most one unreadable stretch (last)."""
    block: Block | None = None
    """The segment's mark block (:func:`read_segment` reads it; :func:`scan` reads frames only)."""
    torn: int | None = None
    """Where a torn tail starts (the data ends inside it), if there is one."""
    torn_owner: tuple[int, int, str] | None = None
    """The torn record's attribution, when a copy of its header is intact."""

    @property
    def unreadable(self) -> Damage | None:
        """The unreadable stretch, if any (whose it is cannot be known)."""
        last = self.damaged[-1] if self.damaged else None
        return last if last is not None and last.attribution is None else None


def _header(data: bytes, offset: int) -> tuple[int, int, bytes] | None:
    """The fields of the first intact header copy at ``offset``, if one is."""
    for copy in (offset, offset + _FIELDS.size + _CHECK.size):
        fields = data[copy:copy + _FIELDS.size]
        (check,) = _CHECK.unpack_from(data, copy + _FIELDS.size)
        if zlib.crc32(fields) == check:
            length, crc, attributed = _FIELDS.unpack(fields)
            if length <= MAX_RECORD:
                return length, crc, attributed
    return None


def _zero_tail(payload: bytes, data: bytes, end: int) -> bool:
    """The payload ends in zeros, only zeros follow it, and they are two or more in all."""
    zeros = len(payload) - len(payload.rstrip(b"\0"))
    return zeros > 0 and zeros + len(data) - end >= 2 and not data[end:].strip(b"\0")


def _owner(data: bytes, offset: int) -> tuple[int, int, str] | None:
    """The attribution in the first header copy at ``offset``, if that copy is whole and intact."""
    copy = data[offset:offset + _FIELDS.size + _CHECK.size]
    if len(copy) == _FIELDS.size + _CHECK.size and zlib.crc32(copy[:_FIELDS.size]) == _CHECK.unpack_from(copy,
                                                                                                         _FIELDS.size)[0]:
        return attribution(_FIELDS.unpack_from(copy)[2])
    return None


def scan(data: bytes, start: int = 0) -> Scan:
    """Read a segment's bytes frame by frame from ``start`` (see the module docstring for the verdicts)."""
    found = Scan()
    offset, size = start, len(data)
    while offset < size:
        if size - offset < HEADER_SIZE:
            found.torn = offset
            break
        header = _header(data, offset)
        # Neither copy intact and zeros from the second copy on: a write that landed in part.
        if header is None and not data[offset + HEADER_SIZE // 2:].strip(b"\0"):
            found.torn = offset
            break
        if header is None:
            found.damaged.append(Damage(offset, size, None, "neither copy of a record header is intact"))
            break
        length, crc, attributed = header
        start = offset + HEADER_SIZE
        end = start + length
        if end > size:
            found.torn = offset
            break
        payload = data[start:end]
        if zlib.crc32(payload) == crc:
            found.payloads.append((offset, payload))
        elif _zero_tail(payload, data, end):
            found.torn = offset  # its end never landed: zeros where a record never ends (see above)
            break
        else:
            found.damaged.append(Damage(offset, end, attribution(attributed), "the record fails its checksum"))
        offset = end
    if found.torn is not None:
        found.torn_owner = _owner(data, found.torn)
    return found


def segment_name(number: int) -> str:
    """The file name of segment ``number``."""
    return f"wal-{number:06d}.log"


def segment_number(path: Path) -> int | None:
    """The number of the segment file at ``path``, or ``None`` if it is not one."""
    name = path.name
    if not (name.startswith("wal-") and name.endswith(".log")):
        return None
    digits = name[4:-4]
    return int(digits) if digits.isascii() and digits.isdigit() else None


def create_segment(directory: Path, number: int, block: Marks, header: Sequence[Record | bytes]) -> tuple[int, int]:
    """Write segment ``number`` whole (``block``, then the ``header`` records: each a record, or
    its :func:`frame` bytes made earlier) under a temporary name, make it durable, then give it
    its name: a segment exists only complete, so a missing or cut mark block is damage, never a
    crash during a rotation. Blocking: a big header takes a while (run it off the event loop).
    Every append waits for a rotation, so the pieces are written as they are, not joined: an
    80 MB header of big registrations took ~0.5 s to encode, frame, join and write.

    Returns:
        Its size (where the header ends) and the mark block's size.
    """
    pieces = [item if isinstance(item, bytes) else frame(encode(item)) for item in header]
    size = block.size + sum(len(piece) for piece in pieces)
    path = directory / segment_name(number)
    temporary = path.with_suffix(".new")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for piece in (block.block(size), *pieces):
            view = memoryview(piece)
            while view:
                view = view[os.write(fd, view):]
        os.fdatasync(fd)
    finally:
        os.close(fd)
    os.rename(temporary, path)
    sync_directory(directory)
    return size, block.size


def sync_directory(directory: Path) -> None:
    """Make ``directory``'s entries durable (a new or renamed file's name, a deleted one's absence)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def segments(directory: Path) -> list[tuple[int, Path]]:
    """Every segment in ``directory``, oldest first."""
    found = []
    for path in directory.glob("wal-*.log"):
        number = segment_number(path)
        if number is not None:
            found.append((number, path))
    return sorted(found)


def read_segment(path: Path, registered: set[str] | None = None) -> tuple[list[Record], Scan]:
    """Every intact record of a segment, and what :func:`~api.durability.segments.scan` found
    (its :attr:`Scan.block` too). A payload that passes its CRC but is not a record (written
    by a newer version?) counts as damaged. ``registered``: dataflows whose registration an
    older segment held intact; their copies here (every segment's header repeats every
    registration) are left undecoded, and the dataflows this segment registers are added.

    Raises:
        UnreadableLog: the segment's mark block is damaged or cut, so where its frames start
            is unknown.
    """
    data = path.read_bytes()
    try:
        block = read_block(data)
    except DamagedBlock as error:
        raise UnreadableLog(path, Damage(error.offset, len(data), None, str(error))) from None
    found = scan(data, block.size)
    found.block = block
    records: list[Record] = []
    seen = set() if registered is None else registered
    for offset, payload in found.payloads:
        if len(payload) >= ATTRIBUTION.size and payload[0] == REGISTER:
            _, _, dataflow = attribution(payload[:ATTRIBUTION.size])
            if dataflow in seen:  # decoding copies was half of a 2,500-dataflow shard's recovery
                continue
        try:
            record = decode(payload)
            records.append(record)
            if isinstance(record, Register):
                seen.add(record.df)
        except ValueError:
            owner = attribution(payload[:ATTRIBUTION.size]) if len(payload) >= ATTRIBUTION.size else None
            found.damaged.append(Damage(offset, offset + len(payload), owner, "a record that does not decode"))
    found.damaged.sort(key=lambda d: d.start)
    return records, found


class UnreadableLog(RuntimeError):
    """Bytes of a segment whose owner cannot be known: the service must not start on a log
    that may hide acknowledged batches of any dataflow."""

    def __init__(self, path: Path, damage: Damage) -> None:
        super().__init__(
            f"write-ahead log segment {path} is unreadable from byte {damage.start} of {damage.end} "
            f"({damage.reason}): nothing says which dataflow's records or acknowledgements those bytes held, so "
            "the service does not start. The bytes are left in place; move the segment aside to start without it "
            "(recovery then checks every dataflow against the Delta tables)")
        self.path, self.damage = path, damage


@dataclass(frozen=True)
class Torn:
    """The newest segment's incomplete final record: where it starts and, when a copy of its
    header is intact, whose it is (``(kind, version, dataflow id)``)."""

    segment: int
    path: Path
    at: int
    owner: tuple[int, int, str] | None


@dataclass
class LogContents:
    """What :meth:`WriteAheadLog.recover` read: every intact record with its segment, oldest
    first; every damaged record ``(segment, damage)`` (each with an attribution); the newest
    segment's high-water marks and its block; each dataflow's registration as framed in the log;
    the newest segment's torn tail, if any; and whether the log must go on in a new segment (the
    newest one ends inside a record that may have been acknowledged, whose bytes are kept)."""

    records: list[tuple[int, Record]]
    damaged: list[tuple[int, Damage]]
    marks: dict[str, Mark] = field(default_factory=dict)
    block: Marks | None = None
    header_end: int = 0
    registrations: dict[str, bytes] = field(default_factory=dict)
    """Each dataflow's registration as :func:`frame` made it: what every new segment's header
    repeats, so a rotation after a restart need not encode them again."""
    torn: Torn | None = None
    fresh_segment: bool = False


def read_log(directory: Path) -> LogContents:
    """Read every segment of ``directory``, oldest first, changing nothing: damaged records are
    reported, and so is the newest segment's torn tail (:attr:`LogContents.torn`; whether it is
    cut is :func:`api.durability.recovery.settle_tail`'s call).

    Raises:
        UnreadableLog: a segment holds bytes that cannot be attributed, or the newest segment's
            marks cannot be read (left in place).
    """
    contents = LogContents([], [])
    found = segments(directory)
    registered: set[str] = set()
    for index, (number, path) in enumerate(found):
        intact, read = read_segment(path, registered)
        assert read.block is not None
        unowned = next((d for d in read.damaged if d.attribution is None), None)
        if unowned is not None:
            raise UnreadableLog(path, unowned)
        if index == len(found) - 1:
            if read.block.damaged:
                raise UnreadableLog(path, Damage(read.block.damaged[0], read.block.size, None,
                                                 "a high-water mark fails its checksum"))
            contents.marks, contents.block = read.block.marks, read.block.live
            contents.header_end = read.block.header_end
            if read.torn is not None:
                contents.torn = Torn(number, path, read.torn, read.torn_owner)
        else:  # the newest segment's marks supersede an older one's; its records cut off are checked by version
            if read.torn is not None:
                log.error("wal: an older segment ends inside a record", extra={"segment": number, "at": read.torn})
            if read.block.damaged:
                log.error("wal: an older segment's high-water marks are damaged (the newest segment's count)",
                          extra={"segment": number, "at": read.block.damaged})
        for damage in read.damaged:
            log.error("wal: damaged record kept in place", extra={
                "segment": number, "at": damage.start, "end": damage.end, "reason": damage.reason,
                "attribution": damage.attribution})
            contents.damaged.append((number, damage))
        for _, payload in read.payloads:
            kind, _, dataflow = attribution(payload[:ATTRIBUTION.size].ljust(ATTRIBUTION.size, b"\0"))
            if kind == REGISTER and dataflow not in contents.registrations:  # each segment repeats it
                contents.registrations[dataflow] = frame(payload)
        contents.records.extend((number, record) for record in intact)
    return contents


def cut_tail(path: Path, at: int) -> None:
    """Cut a segment at byte ``at`` (its torn tail), durably."""
    with open(path, "r+b") as handle:
        handle.truncate(at)
        os.fsync(handle.fileno())
