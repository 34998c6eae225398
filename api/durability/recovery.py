"""What recovery knows about each dataflow, and which of its batches it must find where.

Guarantees: :func:`gather` sorts the log's records and damaged records by dataflow, and
:func:`span` names every version whose batch recovery must hold to rebuild a dataflow exactly:
its counts (from the compacted snapshot at version ``S``, or the registration's initial
pointstamps) and its workers' positions (from its latest intact :class:`~api.durability.records.Checkpoint`
at version ``C``, or none at version 0) both need every batch in ``(min(C, S), end]``, where
``end`` is the highest version anything (the log, a damaged record's attribution, the log's
high-water mark, the snapshot, the Delta ``progress`` table) knows of: the mark, kept where a
cut of the log cannot reach (:mod:`api.durability.marks`), is what reveals batches that a cut
took with nothing else knowing of them. A version the log does not hold intact must come from
``progress``; one that is in neither makes the dataflow :class:`Damaged`: refused alone, with the
reason, never served with a batch missing or a worker's seq forgotten (a forgotten seq would
apply a resent batch twice).

:func:`settle_tail` decides what becomes of the newest segment's torn tail: cut, when the marks
show it was never acknowledged; else kept, as damage.

>>> from api.durability.records import Batch
>>> evidence = Evidence(batches={v: Batch("d", v, 0.0, b"") for v in (1, 2, 4)})
>>> span(evidence, snapshot=0, in_delta=-1)
(0, 4, [3])
>>> evidence.acknowledged = Mark(version=6, state=1)  # acknowledged up to 6: the log was cut after 4
>>> span(evidence, snapshot=0, in_delta=-1)
(0, 6, [3, 5, 6])
>>> describe([3, 5, 6, 7])
'3, 5-7'
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from api.durability.marks import DELETED, Mark
from api.durability.records import BATCH, DELETE, KIND_NAMES, REGISTER, Batch, Check, Checkpoint, Delete, Register
from api.durability.segments import Damage, LogContents, cut_tail, segment_name

log = logging.getLogger("tracker.wal")


@dataclass
class Evidence:
    """What the log holds of one dataflow."""

    registration: Register | None = None
    checkpoint: Checkpoint | None = None
    """The intact checkpoint with the highest version."""
    batches: dict[int, Batch] = field(default_factory=dict)
    """Intact batches by version."""
    damaged: list[tuple[int, Damage]] = field(default_factory=list)
    """Damaged records attributed to it, ``(segment, damage)``."""
    acknowledged: Mark | None = None
    """Its high-water mark: what was acknowledged of it, whatever the log still holds."""

    def log_reaches(self) -> int:
        """The highest version the log still knows of (intact or damaged batches, checkpoint)."""
        checkpoint = self.checkpoint.v if self.checkpoint is not None else 0
        return max([checkpoint, *self.batches, *self.damaged_batches()])

    def claims_more(self, deleted: bool) -> bool:
        """Whether its mark claims what the log does not hold (intact or damaged): its
        registration, batches above what the log reaches, or its deletion (``deleted``: an
        intact deletion record was found)."""
        mark = self.acknowledged
        if mark is None:
            return False
        registered = self.registration is not None or any(
            d.attribution is not None and d.attribution[0] == REGISTER for _, d in self.damaged)
        return (not registered or mark.version > self.log_reaches()
                or (mark.state == DELETED and not deleted and not self.damaged_deletion()))

    def lost_deletion(self, deleted: bool) -> str | None:
        """Why its deletion, acknowledged, cannot be honoured (``deleted``: an intact deletion
        record was found), or ``None``: serving it would undo an acknowledged deletion."""
        if deleted:
            return None
        if self.damaged_deletion():
            return f"its deletion record is damaged ({self.where_damaged()}); it is not served"
        if self.acknowledged is not None and self.acknowledged.state == DELETED:
            return ("its deletion was acknowledged (the write-ahead log's high-water mark says so) but the log no "
                    "longer holds the deletion record: the log was cut; it is not served")
        return None

    def damaged_batches(self) -> list[int]:
        """Versions of its batches whose records are damaged."""
        return [d.attribution[1] for _, d in self.damaged if d.attribution is not None and d.attribution[0] == BATCH]

    def damaged_deletion(self) -> bool:
        """Whether a damaged record of it is its deletion."""
        return any(d.attribution is not None and d.attribution[0] == DELETE for _, d in self.damaged)

    def where_damaged(self) -> str:
        """Where its damaged records are, for an error message."""
        return "; ".join(f"{segment_name(s)} byte {d.start}: {_kind(d)} ({d.reason})" for s, d in self.damaged)


def _kind(damage: Damage) -> str:
    assert damage.attribution is not None
    kind, version, _ = damage.attribution
    name = KIND_NAMES.get(kind, f"record of kind {kind}")
    return f"{name} at version {version}" if kind == BATCH else name


@dataclass(frozen=True)
class Damaged:
    """A dataflow recovery refused: its routes answer 503 ``dataflow_damaged`` with ``detail``,
    and the listings show it with state ``damaged``. ``token_hash``, ``name``, ``arity`` and
    ``created_at`` are known when its registration is."""

    id: str
    detail: str
    token_hash: str | None = None
    name: str | None = None
    arity: int | None = None
    created_at: str | None = None

    def summary(self) -> dict[str, object]:
        """Its entry in ``GET /v1/dataflows``.

        >>> Damaged("d1", "a batch is missing", name="n").summary()["state"]
        'damaged'
        """
        return {"id": self.id, "name": self.name, "timestamp_arity": self.arity, "version": None,
                "created_at": self.created_at, "state": "damaged", "detail": self.detail}


def gather(contents: LogContents) -> tuple[dict[str, Evidence], dict[str, Check], dict[str, Delete]]:
    """The log's evidence by dataflow, and the Spark check results and deletions it logged."""
    evidence: dict[str, Evidence] = {}
    checks: dict[str, Check] = {}
    deletions: dict[str, Delete] = {}
    for _segment, record in contents.records:
        if isinstance(record, Check):
            checks[record.df] = record
            continue
        if isinstance(record, Delete):
            deletions.setdefault(record.df, record)
            continue
        found = evidence.setdefault(record.df, Evidence())
        if isinstance(record, Register):
            if found.registration is None:
                found.registration = record
        elif isinstance(record, Batch):
            found.batches[record.v] = record
        elif found.checkpoint is None or record.v >= found.checkpoint.v:
            found.checkpoint = record
    for segment, damage in contents.damaged:
        if damage.attribution is not None:
            evidence.setdefault(damage.attribution[2], Evidence()).damaged.append((segment, damage))
    for dataflow, mark in contents.marks.items():
        evidence.setdefault(dataflow, Evidence()).acknowledged = mark
    return evidence, checks, deletions


def span(evidence: Evidence, snapshot: int, in_delta: int) -> tuple[int, int, list[int]]:
    """``(start, end, missing)``: recovery needs every batch in ``(start, end]``; ``missing``
    are those the log does not hold intact (see the module docstring). ``snapshot`` is the
    snapshot's version (0 without one), ``in_delta`` the highest version in ``progress`` (-1)."""
    checkpoint = evidence.checkpoint.v if evidence.checkpoint is not None else 0
    start = min(checkpoint, snapshot)
    acknowledged = evidence.acknowledged.version if evidence.acknowledged is not None else 0
    end = max([start, snapshot, in_delta, acknowledged, evidence.log_reaches()])
    return start, end, [v for v in range(start + 1, end + 1) if v not in evidence.batches]


def settle_tail(contents: LogContents) -> None:
    """Cut the newest segment's torn tail if the marks show it was never acknowledged (its
    dataflow's mark, or, whose it is unknown, every mark, is met by the rest of the log); else
    keep its bytes as damage and have the log go on in a new segment: the log was cut."""
    torn = contents.torn
    if torn is None:
        return
    evidence, _, deletions = gather(contents)
    if torn.owner is None:
        acknowledged = any(found.claims_more(d in deletions) for d, found in evidence.items())
        what = "an incomplete final record"
    else:
        kind, version, dataflow = torn.owner
        found = evidence.get(dataflow)
        mark = found.acknowledged if found is not None else None
        if kind == BATCH:
            acknowledged = mark is not None and version <= mark.version
        else:  # a registration or deletion the mark names and the rest of the log lacks (checks never count)
            acknowledged = kind in (REGISTER, DELETE) and found is not None and found.claims_more(dataflow in deletions)
        what = f"an incomplete final {KIND_NAMES.get(kind, 'record')} of dataflow {dataflow}" + (
            f" at version {version}" if kind == BATCH else "")
    extra = {"segment": torn.segment, "at": torn.at, "size": torn.path.stat().st_size}
    if not acknowledged:
        log.warning(f"wal: cutting a torn tail ({what}, which the high-water marks show was never acknowledged)",
                    extra=extra)
        cut_tail(torn.path, torn.at)
        return
    log.error(f"wal: the newest segment ends inside {what}, and what it held may have been acknowledged: the log "
              "was cut; its bytes are kept and the log goes on in a new segment", extra=extra)
    contents.damaged.append((torn.segment, Damage(torn.at, extra["size"], torn.owner,
                                                  "the segment ends inside this record")))
    contents.fresh_segment = True


def unregistered(dataflow_id: str, evidence: Evidence) -> Damaged | None:
    """A refusal for a dataflow the log names but whose registration it does not hold intact."""
    if evidence.registration is not None:
        return None
    if any(d.attribution is not None and d.attribution[0] == REGISTER for _, d in evidence.damaged):
        reason = "its registration record is damaged"
    elif evidence.acknowledged is not None:
        reason = ("its registration was acknowledged (the write-ahead log's high-water mark says so) but the log "
                  "no longer holds it: the log was cut")
    else:
        reason = "the write-ahead log holds records of it but not its registration"
    detail = f"{reason} ({evidence.where_damaged() or 'no damaged record'}); it is not served"
    return Damaged(dataflow_id, detail)


def missing_detail(missing: list[int], evidence: Evidence) -> str:
    """Why a dataflow with batches ``missing`` everywhere is refused."""
    where = evidence.where_damaged()
    mark = evidence.acknowledged
    if mark is not None and missing[-1] > evidence.log_reaches():
        cut = (f"acknowledged up to version {mark.version} (its high-water mark), but the log ends at version "
               f"{evidence.log_reaches()}: it was cut")
        log = f"{cut}; damaged there: {where}" if where else cut
    else:
        log = f"damaged there: {where}" if where else "not retained there"
    return (f"the batches at versions {describe(missing)} are in neither the write-ahead log ({log}) nor the Delta "
            "progress table, so its counts or its workers' sequence numbers cannot be rebuilt exactly; it is not "
            "served (the bytes are kept for an operator)")


def describe(versions: list[int]) -> str:
    """Sorted versions as ranges."""
    parts: list[str] = []
    run: list[int] = []
    for version in versions:
        if run and version != run[-1] + 1:
            parts.append(_run(run))
            run = []
        run.append(version)
    if run:
        parts.append(_run(run))
    return ", ".join(parts)


def _run(run: list[int]) -> str:
    return str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}"
