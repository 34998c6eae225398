"""The write-ahead log's on-disk form: record framing, the reading of a segment that tells a torn
write from corruption, segment file names, and the reading of the whole log at recovery, in
one place.

Guarantees: every reader and writer of segments (the log, its sync process, recovery) names and
frames them through this module. A segment is a file ``wal-<number, six digits>.log`` holding
frames back to back. A frame is a header written twice, then the payload::

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
the zeros being blocks the write never filled; such a record was never acknowledged, because
acknowledgement follows the ``fdatasync`` covering it); and *unreadable* bytes (neither header
copy intact and not a torn tail: nothing says whose they are, so reading of the segment stops
there). A payload never ends in a zero byte (it ends in JSON), so a final frame whose payload
ends in zeros, followed by zeros only, two or more in all, is torn; any one damaged byte leaves
a complete final record damaged, never torn.

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
from dataclasses import dataclass, field
from pathlib import Path

from api.durability.records import ATTRIBUTION, Record, attribution, decode

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
    torn: int | None = None
    """Where a torn tail starts (the data ends inside it), if there is one."""

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


def scan(data: bytes) -> Scan:
    """Read a segment's bytes frame by frame (see the module docstring for the verdicts)."""
    found = Scan()
    offset, size = 0, len(data)
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


def segments(directory: Path) -> list[tuple[int, Path]]:
    """Every segment in ``directory``, oldest first."""
    found = []
    for path in directory.glob("wal-*.log"):
        number = segment_number(path)
        if number is not None:
            found.append((number, path))
    return sorted(found)


def read_segment(path: Path) -> tuple[list[Record], Scan]:
    """Every intact record of a segment, and what :func:`~api.durability.segments.scan` found. A payload
    that passes its CRC but is not a record (written by a newer version?) counts as damaged."""
    found = scan(path.read_bytes())
    records: list[Record] = []
    for offset, payload in found.payloads:
        try:
            records.append(decode(payload))
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
            f"({damage.reason}): the records there cannot be attributed to a dataflow, so the service does not "
            "start. The bytes are left in place; move the segment aside to start without it (recovery then checks "
            "every dataflow against the Delta tables)")
        self.path, self.damage = path, damage


@dataclass(frozen=True)
class LogContents:
    """What :meth:`WriteAheadLog.recover` read: every intact record with its segment, oldest
    first, and every damaged record ``(segment, damage)`` (each with an attribution)."""

    records: list[tuple[int, Record]]
    damaged: list[tuple[int, Damage]]


def read_log(directory: Path) -> LogContents:
    """Read every segment of ``directory``, oldest first; cut a torn tail off the newest one
    only, so that new records follow intact ones; keep (never cut) damaged records.

    Raises:
        UnreadableLog: a segment holds bytes that cannot be attributed (left in place).
    """
    records: list[tuple[int, Record]] = []
    damaged: list[tuple[int, Damage]] = []
    found = segments(directory)
    for index, (number, path) in enumerate(found):
        intact, read = read_segment(path)
        unowned = next((d for d in read.damaged if d.attribution is None), None)
        if unowned is not None:
            raise UnreadableLog(path, unowned)
        if read.torn is not None and index == len(found) - 1:
            log.warning("wal: cutting a torn tail (an incomplete final record, never acknowledged)",
                        extra={"segment": number, "at": read.torn, "size": path.stat().st_size})
            with open(path, "r+b") as handle:
                handle.truncate(read.torn)
                os.fsync(handle.fileno())
        elif read.torn is not None:  # the records cut off are missing: recovery checks every version
            log.error("wal: an older segment ends inside a record", extra={"segment": number, "at": read.torn})
        for damage in read.damaged:
            log.error("wal: damaged record kept in place", extra={
                "segment": number, "at": damage.start, "end": damage.end, "reason": damage.reason,
                "attribution": damage.attribution})
            damaged.append((number, damage))
        records.extend((number, record) for record in intact)
    return LogContents(records, damaged)
