"""The write-ahead log's records, typed: what is logged, and its one encoding.

Guarantees: :func:`decode` inverts :func:`encode` for every record; anything else raises
``ValueError``. Every payload starts with its :data:`ATTRIBUTION` (kind, version, dataflow id),
which framing copies into the record's header (:mod:`api.durability.segments`), so that a damaged record
is still known to be, say, dataflow ``d1``'s batch at version 3.

Five kinds, told apart by their ``"t"`` field: a :class:`Register` (a dataflow's registration,
also the first records of every new segment), a :class:`Checkpoint` (a dataflow's worker
positions as of a durable version, after its registration in every new segment), a
:class:`Batch` (an acknowledged progress batch), a :class:`Check` (the concluded Spark check
of a registration) and a :class:`Delete` (a dataflow's deletion, also repeated at the start of
every new segment). After the attribution, a record's payload is its compact JSON; a batch's is
followed by a newline and the request body exactly as received (compact JSON never contains a
raw newline, so the first one separates the two), which spares the hot path re-encoding every
update.

>>> record = Batch(df="d1", v=3, at=1.5, body=b'{"worker":"w","seq":0,"updates":[]}')
>>> encode(record)[ATTRIBUTION.size:]
b'{"t":"batch","df":"d1","v":3,"at":1.5}\\n{"worker":"w","seq":0,"updates":[]}'
>>> attribution(encode(record)[:ATTRIBUTION.size]), decode(encode(record)) == record
((2, 3, 'd1'), True)
>>> decode(encode(Check(df="d1", result="agreed", detail=None)))
Check(df='d1', result='agreed', detail=None)
>>> decode(encode(Delete(df="d1", at=2.5)))
Delete(df='d1', at=2.5, withdrawn=False)
"""

from __future__ import annotations

import struct

import msgspec

from api.schema.spec import Spec, spec_fields


class Register(Spec, frozen=True, tag="register", tag_field="t", omit_defaults=True):
    """A registered dataflow: its :class:`~api.schema.registration.Spec`, id, token hash and creation
    time (ISO 8601)."""

    df: str
    token: str
    created_at: str
    key: str | None = None
    """Its idempotency key, if the request gave one (:mod:`api.host.keys`)."""

    @classmethod
    def of(cls, spec: Spec, *, df: str, token: str, created_at: str, key: str | None = None) -> Register:
        """The record of registration ``spec``: every one of its fields, and these.

        >>> spec = Spec(name="n", arity=1, nodes=[], edges=[], initial=None, last_epoch=3)
        >>> Register.of(spec, df="d", token="t", created_at="c").last_epoch
        3
        """
        return cls(**spec_fields(spec), df=df, token=token, created_at=created_at, key=key)


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


class Checkpoint(msgspec.Struct, frozen=True, tag="checkpoint", tag_field="t"):
    """Dataflow ``df``'s worker positions (worker -> ``(last seq, its version)``) as of its
    durable version ``v``; every batch of ``df`` above ``v`` follows it in the log."""

    df: str
    v: int
    workers: dict[str, tuple[int, int]]


class Delete(msgspec.Struct, frozen=True, tag="delete", tag_field="t", omit_defaults=True):
    """Dataflow ``df`` was deleted at ``at`` (POSIX seconds): it stays deleted after a restart.
    ``withdrawn``: its registration became durable only after its sender's deadline, so it was
    never served, and a restart does not host it at all (:mod:`api.host.keys`)."""

    df: str
    at: float
    withdrawn: bool = False


Record = Register | Batch | Check | Checkpoint | Delete
REGISTER, BATCH, CHECK, CHECKPOINT, DELETE = 1, 2, 3, 4, 5
"""The kinds an attribution names."""
ATTRIBUTION = struct.Struct("<BQ32s")
"""kind, version (a batch's or a checkpoint's, else 0), dataflow id (ASCII, at most 32 bytes)."""
KIND_NAMES = {REGISTER: "registration", BATCH: "batch", CHECK: "Spark check", CHECKPOINT: "checkpoint",
              DELETE: "deletion"}
_KINDS: dict[type, int] = {Register: REGISTER, Batch: BATCH, Check: CHECK, Checkpoint: CHECKPOINT, Delete: DELETE}
_ENCODER = msgspec.json.Encoder()
_DECODER = msgspec.json.Decoder(Register | _BatchHead | Check | Checkpoint | Delete)


def attribution(data: bytes) -> tuple[int, int, str]:
    """``(kind, version, dataflow id)`` of an attribution's bytes."""
    kind, version, dataflow = ATTRIBUTION.unpack(data)
    return kind, version, dataflow.rstrip(b"\0").decode("ascii", "replace")


def owner(record: Record) -> tuple[int, int, str]:
    """``(kind, version, dataflow id)``: the attribution :func:`encode` gives ``record``.

    >>> owner(Checkpoint(df="d1", v=4, workers={}))
    (4, 4, 'd1')
    """
    return _KINDS[type(record)], record.v if isinstance(record, Batch | Checkpoint) else 0, record.df


def encode(record: Record) -> bytes:
    """The payload of ``record`` (see the module docstring).

    Raises:
        ValueError: the dataflow id is longer than 32 ASCII bytes.
    """
    kind, version, dataflow = owner(record)
    head = ATTRIBUTION.pack(kind, version, _dataflow_bytes(dataflow))
    if isinstance(record, Batch):
        return head + _ENCODER.encode(_BatchHead(record.df, record.v, record.at)) + b"\n" + record.body
    if isinstance(record, Register) and len(record.nodes) + len(record.edges) > _SLICE:
        return head + _sliced(record)
    return head + _ENCODER.encode(record)


_SLICE = 2_000
"""Nodes or edges encoded per call: a registration's lists in one call held the GIL (and so
the event loop) ~25 ms for 50,000 nodes."""


def _sliced(record: Register) -> bytes:
    """``_ENCODER.encode(record)``, its node and edge lists a slice at a time. The JSON text
    ``"nodes":[],"edges":[]`` (unescaped quotes) cannot occur inside a string value, so the
    shell's first one is the fields'.

    >>> nodes = [{"id": i, "inputs": 1, "outputs": 1} for i in range(5_000)]
    >>> record = Register(name='"nodes":[]', arity=1, nodes=nodes, edges=[], initial=None, df="d",
    ...                   token="t", created_at="c")
    >>> _sliced(record) == _ENCODER.encode(record)
    True
    """
    shell = _ENCODER.encode(msgspec.structs.replace(record, nodes=[], edges=[]))
    lists = [b",".join(_ENCODER.encode(items[i:i + _SLICE])[1:-1] for i in range(0, len(items), _SLICE))
             for items in (record.nodes, record.edges)]
    return shell.replace(b'"nodes":[],"edges":[]', b'"nodes":[%s],"edges":[%s]' % (lists[0], lists[1]), 1)


def _dataflow_bytes(dataflow: str) -> bytes:
    data = dataflow.encode("ascii")
    if len(data) > 32:
        raise ValueError(f"a dataflow id of {len(data)} bytes: the log attributes at most 32")
    return data


def decode(payload: bytes) -> Record:
    """Inverse of :func:`encode`.

    Raises:
        ValueError: the payload is not a record (``msgspec.DecodeError`` is one).
    """
    if len(payload) < ATTRIBUTION.size:
        raise ValueError("a payload shorter than its attribution")
    head, _, body = payload[ATTRIBUTION.size:].partition(b"\n")
    record = _DECODER.decode(head)
    if isinstance(record, _BatchHead):
        return Batch(record.df, record.v, record.at, body)
    return record
