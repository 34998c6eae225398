"""The write-ahead log's on-disk form: record framing and segment file names, in one place.

Guarantees: every reader and writer of segments (the log, its sync process) names and frames
them through this module. A segment is a file ``wal-<number, six digits>.log`` holding framed records back to back:
``<u32 length><u32 crc32><payload>``, little endian. A frame that is cut short, longer than
:data:`MAX_RECORD` or whose CRC does not match ends the intact prefix: nothing after it was
ever acknowledged, because a record is acknowledged only after the ``fdatasync`` covering it.

>>> data = frame(b"one") + frame(b"two")
>>> unframe(data + frame(b"three")[:-1])  # a torn tail: the intact prefix and where it ends
([b'one', b'two'], 22)
>>> segment_name(7), segment_number(Path("wal-000007.log")), segment_number(Path("notes.txt"))
('wal-000007.log', 7, None)
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

_HEADER = struct.Struct("<II")
HEADER_SIZE = _HEADER.size
"""Bytes in front of every payload."""
MAX_RECORD = 256 * 1024 * 1024
"""A frame claiming more is corrupt (a record is a request body plus a small header)."""


def frame(payload: bytes) -> bytes:
    """``payload`` with its length and CRC32 in front."""
    return _HEADER.pack(len(payload), zlib.crc32(payload)) + payload


def unframe(data: bytes) -> tuple[list[bytes], int]:
    """The payloads of the intact frames at the start of ``data``, and the offset where the
    intact prefix ends (``len(data)`` unless the tail is torn or corrupt)."""
    payloads: list[bytes] = []
    offset = 0
    while offset + _HEADER.size <= len(data):
        length, crc = _HEADER.unpack_from(data, offset)
        start = offset + _HEADER.size
        end = start + length
        if length > MAX_RECORD or end > len(data):
            break
        payload = data[start:end]
        if zlib.crc32(payload) != crc:
            break
        payloads.append(payload)
        offset = end
    return payloads, offset


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
