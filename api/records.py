"""The write-ahead log's records, typed: what is logged, and its one encoding.

Guarantees: :func:`decode` inverts :func:`encode` for every record; anything else raises
``ValueError`` (recovery then treats it as the end of the log).

Four kinds, told apart by their ``"t"`` field: a :class:`Register` (a dataflow's registration,
also the first records of every new segment), a :class:`Batch` (an acknowledged progress batch),
a :class:`Check` (the concluded Spark check of a registration) and a :class:`Delete` (a
dataflow's deletion, also repeated at the start of every new segment). A record's payload is its
compact JSON; a batch's is followed by a newline and the request body exactly as received
(compact JSON never contains a raw newline, so the first one separates the two), which spares
the hot path re-encoding every update. Framing and file names are :mod:`api.segments`' job.

>>> record = Batch(df="d1", v=3, at=1.5, body=b'{"worker":"w","seq":0,"updates":[]}')
>>> encode(record)
b'{"t":"batch","df":"d1","v":3,"at":1.5}\\n{"worker":"w","seq":0,"updates":[]}'
>>> decode(encode(record)) == record
True
>>> decode(encode(Check(df="d1", result="agreed", detail=None)))
Check(df='d1', result='agreed', detail=None)
>>> decode(encode(Delete(df="d1", at=2.5)))
Delete(df='d1', at=2.5)
"""

from __future__ import annotations

import msgspec

from api.registration import Spec


class Register(Spec, frozen=True, tag="register", tag_field="t"):
    """A registered dataflow: its :class:`~api.registration.Spec`, id, token hash and creation
    time (ISO 8601)."""

    df: str
    token: str
    created_at: str


class _BatchHead(msgspec.Struct, frozen=True, tag="batch", tag_field="t"):
    df: str
    v: int
    at: float


class Batch(msgspec.Struct, frozen=True):
    """An acknowledged batch: dataflow ``df``, version ``v``, arrival ``at`` (POSIX seconds)
    and the request ``body`` as received (validated before it was logged)."""

    df: str
    v: int
    at: float
    body: bytes


class Check(msgspec.Struct, frozen=True, tag="check", tag_field="t"):
    """The concluded Spark check of dataflow ``df`` (``result`` as in the status)."""

    df: str
    result: str
    detail: str | None


class Delete(msgspec.Struct, frozen=True, tag="delete", tag_field="t"):
    """Dataflow ``df`` was deleted at ``at`` (POSIX seconds): it stays deleted after a restart."""

    df: str
    at: float


Record = Register | Batch | Check | Delete
_ENCODER = msgspec.json.Encoder()
_DECODER = msgspec.json.Decoder(Register | _BatchHead | Check | Delete)


def encode(record: Record) -> bytes:
    """The payload of ``record`` (see the module docstring)."""
    if isinstance(record, Batch):
        return _ENCODER.encode(_BatchHead(record.df, record.v, record.at)) + b"\n" + record.body
    return _ENCODER.encode(record)


def decode(payload: bytes) -> Record:
    """Inverse of :func:`encode`.

    Raises:
        ValueError: the payload is not a record (``msgspec.DecodeError`` is one).
    """
    head, _, body = payload.partition(b"\n")
    record = _DECODER.decode(head)
    if isinstance(record, _BatchHead):
        return Batch(record.df, record.v, record.at, body)
    return record
