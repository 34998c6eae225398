"""The log reader against damage, without the service: random single-byte corruptions and
truncations of framed records (hypothesis), the segment-level policy of ``WriteAheadLog.recover``
on real files, and the versions recovery then needs (``api.durability.recovery.span``).

What must hold: a torn tail (the data ends inside a record) is told from damage; one flipped byte
never loses an intact record, never hides whose the damaged record is, and never stops reading;
nothing is cut but an incomplete final record of the newest segment.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
from pathlib import Path

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from api.durability.marks import read_block
from api.durability.records import BATCH, Batch, Check, Checkpoint, Delete, Record, Register, decode, encode
from api.durability.recovery import Evidence, gather, span, unregistered
from api.durability.segments import HEADER_SIZE, UnreadableLog, frame, scan, segment_name, segments
from api.durability.wal import WriteAheadLog

REGISTER = Register(name="r", arity=1, nodes=[{"id": 0, "inputs": 0, "outputs": 1, "name": "in"}], edges=[],
                    initial=[], df="a" * 32, token="ab" * 32, created_at="2026-01-01T00:00:00+00:00")

_records = st.lists(st.one_of(
    st.builds(Batch, df=st.sampled_from(["d1", "d2", "f" * 32]), v=st.integers(1, 2**40),
              at=st.floats(0, 1e9), body=st.text(max_size=40).map(lambda t: json.dumps({"w": t}).encode())),
    st.builds(Check, df=st.sampled_from(["d1", "d2"]), result=st.sampled_from(["agreed", "pending"]),
              detail=st.none() | st.text(max_size=20)),
    st.builds(Checkpoint, df=st.sampled_from(["d1", "d2"]), v=st.integers(0, 2**40),
              workers=st.dictionaries(st.text(max_size=5), st.tuples(st.integers(0, 99), st.integers(0, 99)),
                                      max_size=3)),
    st.just(REGISTER)), min_size=1, max_size=12)


def _frames(records: list[Record]) -> tuple[bytes, list[int]]:
    """The framed records and each frame's start offset (plus the end)."""
    data, starts = b"", [0]
    for record in records:
        data += frame(encode(record))
        starts.append(len(data))
    return data, starts


@settings(max_examples=150, deadline=None)
@given(records=_records, where=st.floats(0, 1, exclude_max=True), flip=st.integers(1, 255))
def test_one_damaged_byte_damages_at_most_its_own_record_and_says_whose(
        records: list[Record], where: float, flip: int) -> None:
    data, starts = _frames(records)
    at = int(where * len(data))
    damaged = bytearray(data)
    damaged[at] ^= flip
    found = scan(bytes(damaged))
    hit = max(i for i, start in enumerate(starts[:-1]) if start <= at)
    assert found.torn is None and found.unreadable is None
    intact = {offset: decode(payload) for offset, payload in found.payloads}
    for index, record in enumerate(records):
        if index != hit:
            assert intact[starts[index]] == record
    if at - starts[hit] < HEADER_SIZE:  # in a header copy: the other copy still frames the record
        assert intact[starts[hit]] == records[hit] and found.damaged == []
    else:  # in the payload: the record is damaged, kept, and attributed to its dataflow
        [damage] = found.damaged
        assert (damage.start, damage.end) == (starts[hit], starts[hit + 1])
        assert damage.attribution is not None and damage.attribution[2] == records[hit].df
        record = records[hit]
        if isinstance(record, Batch):
            assert damage.attribution[:2] == (BATCH, record.v)


@settings(max_examples=100, deadline=None)
@given(records=_records, where=st.floats(0, 1, exclude_max=True), zeros=st.integers(0, 300))
def test_a_truncation_is_a_torn_tail_at_the_record_it_cuts(records: list[Record], where: float,
                                                           zeros: int) -> None:
    data, starts = _frames(records)
    cut = int(where * len(data))
    found = scan(data[:cut] + b"\0" * zeros)  # a crash may leave zeros where the write did not land
    if zeros == 1 and cut not in starts:  # a lone zero could be one damaged byte: no verdict "torn" on it
        zeros = 0
        found = scan(data[:cut])
    whole = [i for i in range(len(records)) if starts[i + 1] <= cut]
    assert [decode(p) for _, p in found.payloads] == [records[i] for i in whole]
    assert found.damaged == []
    assert found.torn == (None if cut in starts and zeros == 0 else starts[len(whole)])


def _write(directory: Path, batches: list[list[Record]]) -> None:
    """Each list of records into its own segment (a rotation between lists)."""

    async def main() -> None:
        wal = WriteAheadLog(directory)
        wal.open()
        for index, records in enumerate(batches):
            if index:
                await wal.rotate(lambda records=records: records)
                records = []
            await asyncio.gather(*(wal.enqueue(r) for r in records))
        wal.close()

    asyncio.run(main())


def _batch(v: int, df: str = "d1") -> Batch:
    return Batch(df=df, v=v, at=float(v), body=b'{"worker":"w","seq":%d,"updates":[]}' % (v - 1))


def test_recover_cuts_only_the_newest_segments_torn_tail_and_keeps_damaged_bytes(tmp_path: Path) -> None:
    first = [REGISTER, _batch(1), _batch(2), _batch(1, "d2")]
    second = [Checkpoint(df="d1", v=2, workers={"w": (1, 2)}), _batch(3), _batch(4)]
    _write(tmp_path, [first, second])
    old, new = tmp_path / segment_name(1), tmp_path / segment_name(2)
    old_bytes, new_bytes = bytearray(old.read_bytes()), new.read_bytes()
    _, starts = _frames(first)
    frames_start = read_block(bytes(old_bytes)).size  # the frames follow the segment's mark block
    old_bytes[frames_start + starts[1] + HEADER_SIZE + 5] ^= 0x40  # inside the payload of d1's batch at version 1
    old.write_bytes(bytes(old_bytes))
    new.write_bytes(new_bytes + frame(encode(_batch(5)))[:-2])  # a torn tail: never acknowledged
    contents = WriteAheadLog(tmp_path).recover()
    assert old.read_bytes() == bytes(old_bytes)  # damaged bytes stay
    assert new.read_bytes() == new_bytes  # the torn tail is cut
    assert [(s, d.attribution) for s, d in contents.damaged] == [(1, (BATCH, 1, "d1"))]
    evidence, _, _ = gather(contents)
    assert sorted(evidence["d1"].batches) == [2, 3, 4] and evidence["d1"].damaged_batches() == [1]
    # With its checkpoint at version 2, d1 needs versions 3-4 only, which the log holds: the
    # damaged batch 1 is covered by the checkpoint and a snapshot at 2 or above.
    assert span(evidence["d1"], snapshot=2, in_delta=-1) == (2, 4, [])
    # Without a snapshot its counts need batch 1, which only the Delta table could supply.
    assert span(evidence["d1"], snapshot=0, in_delta=-1) == (0, 4, [1])
    wal = WriteAheadLog(tmp_path)
    wal.recover()
    assert wal.kept == {1} and wal.delete_segments_before(3) == 1  # a damaged segment is never deleted
    assert old.read_bytes() == bytes(old_bytes) and not new.exists()


def test_bytes_nobody_can_own_stop_the_start_and_stay(tmp_path: Path) -> None:
    _write(tmp_path, [[REGISTER, _batch(1), _batch(2)]])
    path = tmp_path / segment_name(1)
    data = bytearray(path.read_bytes())
    start = read_block(bytes(data)).size + len(frame(encode(REGISTER)))
    for copy in (0, HEADER_SIZE // 2):  # both header copies of batch 1
        data[start + copy + 1] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(UnreadableLog, match=rf"{segment_name(1)} is unreadable from byte {start} "):
        WriteAheadLog(tmp_path).recover()
    assert path.read_bytes() == bytes(data)


def test_span_names_the_versions_the_log_lacks() -> None:
    batches = {v: _batch(v) for v in (5, 6, 8)}
    checkpoint = Checkpoint(df="d1", v=4, workers={"w": (3, 4)})
    evidence = Evidence(registration=REGISTER, checkpoint=checkpoint, batches=batches)
    assert span(evidence, snapshot=4, in_delta=-1) == (4, 8, [7])
    assert span(evidence, snapshot=6, in_delta=9) == (4, 9, [7, 9])  # progress knows of a later one
    assert span(evidence, snapshot=2, in_delta=-1) == (2, 8, [3, 4, 7])  # counts need 3-4 too


_STEPS = st.lists(st.tuples(st.sampled_from(["d1", "d2", "d3"]), st.sampled_from(["batch"] * 4 + ["rotate", "delete"])),
                  min_size=1, max_size=20)


def _acknowledge(directory: Path, steps: list[tuple[str, str]]) -> list[Record]:
    """Register d1-d3, then each step through the real log (each awaited: acknowledged);
    returns every acknowledged record a client was told about (registrations, batches, deletions)."""
    acked: list[Record] = []
    versions = {"d1": 0, "d2": 0, "d3": 0}
    deleted: dict[str, Delete] = {}
    registers = {d: msgspec.structs.replace(REGISTER, df=d) for d in versions}

    def header() -> list[Record]:
        return [*registers.values(), *(Checkpoint(df=d, v=v, workers={}) for d, v in versions.items()),
                *deleted.values()]

    async def main() -> None:
        wal = WriteAheadLog(directory, header=header)
        wal.open()
        for registration in registers.values():
            await wal.enqueue(registration)
            acked.append(registration)
        for dataflow, step in steps:
            if step == "rotate":
                await wal.rotate(header)
                continue
            if dataflow in deleted:
                continue
            record: Record
            if step == "delete":
                record = deleted.setdefault(dataflow, Delete(df=dataflow, at=1.0))
            else:
                versions[dataflow] += 1
                record = _batch(versions[dataflow], dataflow)
            await wal.enqueue(record)
            acked.append(record)
        wal.close()

    asyncio.run(main())
    return acked


@settings(max_examples=25, deadline=None)
@given(steps=_STEPS, unacknowledged=st.integers(0, 3), where=st.floats(0, 1))
def test_a_cut_anywhere_refuses_exactly_the_dataflows_that_lost_an_acknowledged_record(
        steps: list[tuple[str, str]], unacknowledged: int, where: float) -> None:
    """Each segment in turn cut after its mark block, inside a record and at the record
    boundaries around that point: a dataflow that lost an acknowledged record (a batch, its
    registration, its deletion) from the whole log is refused, and no other; a torn tail that
    was never acknowledged is cut in silence."""
    with tempfile.TemporaryDirectory() as name:
        written = Path(name) / "written"
        acked = [encode(r) for r in _acknowledge(written, steps)]
        found = segments(written)
        # The next batches of a live dataflow, written when the process died: never acknowledged.
        records = [decode(a) for a in acked]
        live = next((d for d in ("d1", "d2", "d3") if not any(isinstance(r, Delete) and r.df == d for r in records)),
                    None)
        if live is not None:
            last = max([r.v for r in records if isinstance(r, Batch) and r.df == live], default=0)
            with open(found[-1][1], "ab") as handle:
                for v in range(last + 1, last + 1 + unacknowledged):
                    handle.write(frame(encode(_batch(v, live))))
        for number, path in found:
            data = path.read_bytes()
            start = read_block(data).size
            inside = start + int(where * (len(data) - start))
            boundaries = [offset for offset, _ in scan(data, start).payloads] + [len(data)]
            before = max(b for b in boundaries if b <= inside)
            for cut in sorted({inside, before, min(before + 50, len(data)), min(b for b in boundaries if b >= inside)}):
                directory = Path(name) / f"cut-{number}-{cut}"
                shutil.copytree(written, directory)
                (directory / path.name).write_bytes(data[:cut])
                _check_cut(directory, acked, cut, newest=number == found[-1][0])


def _check_cut(directory: Path, acked: list[bytes], cut: int, newest: bool) -> None:
    contents = WriteAheadLog(directory).recover()
    evidence, _, deletions = gather(contents)
    survivors = {encode(record) for _, record in contents.records}
    for dataflow in ("d1", "d2", "d3"):
        lost = [a for a in acked if decode(a).df == dataflow and a not in survivors]
        found = evidence[dataflow]
        refused = (unregistered(dataflow, found) is not None or found.lost_deletion(dataflow in deletions) is not None
                   or bool(span(found, snapshot=0, in_delta=-1)[2]))
        assert refused == bool(lost), (dataflow, [decode(a) for a in lost], cut)
    if newest and all(a in survivors for a in acked):  # the torn rest, never acknowledged: cut in silence
        assert not contents.fresh_segment


def test_a_damaged_mark_stops_the_start_in_the_newest_segment_only(tmp_path: Path) -> None:
    """The newest segment's marks say what was acknowledged: one that fails its checksum could
    hide a cut, so the start stops, naming the segment and byte (the bytes stay). An older
    segment's marks are superseded by the newest's: damage there is only reported."""
    _write(tmp_path, [[REGISTER, _batch(1)], [REGISTER, Checkpoint(df="d1", v=1, workers={}), _batch(2)]])
    old, new = tmp_path / segment_name(1), tmp_path / segment_name(2)
    for path in (old, new):
        data = bytearray(path.read_bytes())
        data[64 + 40] ^= 0x01  # in the first slot's version
        path.write_bytes(bytes(data))
        if path == old:
            assert [r for _, r in WriteAheadLog(tmp_path).recover().records][-1] == _batch(2)
    with pytest.raises(UnreadableLog, match=rf"{segment_name(2)} is unreadable from byte 64 .*high-water mark"):
        WriteAheadLog(tmp_path).recover()
    assert new.read_bytes() == bytes(data)
