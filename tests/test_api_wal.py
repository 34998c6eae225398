"""The write-ahead log in process: framing, typed records, segment names, torn tails, group commit."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings

import api.durability.wal as wal_module
from api.durability.marks import Marks
from api.durability.records import ATTRIBUTION, Batch, Check, Register, decode, encode
from api.durability.segments import (
    HEADER_SIZE,
    create_segment,
    frame,
    read_segment,
    scan,
    segment_name,
    segment_number,
    segments,
)
from api.durability.wal import INLINE_BYTES_MAX, LogFailed, WriteAheadLog, framed
from api.schema.models import RegisterRequest
from api.schema.spec import registration_record
from tests.strategies import nested_bodies

REGISTER = Register(name="r", arity=2, nodes=[{"id": 0, "inputs": 0, "outputs": 1, "name": "in"}], edges=[],
                    initial=[(0, 0, "source", (1, 2), 3)], df="d1", token="ab" * 32,
                    created_at="2026-01-01T00:00:00+00:00")


def test_every_record_kind_round_trips_through_its_payload() -> None:
    body = b'{"worker": "w",\n "seq": 4, "updates": []}'  # a body may hold newlines (whitespace)
    for record in (REGISTER, Batch(df="d1", v=7, at=1.25, body=body), Batch(df="d1", v=8, at=2.0, body=b""),
                   Check(df="d1", result="disagreed", detail="Psi differs")):
        assert decode(encode(record)) == record
    assert encode(Check(df="d", result="agreed", detail=None))[ATTRIBUTION.size:].startswith(b'{"t":"check"')


@settings(max_examples=40, deadline=None)
@given(nested_bodies())
def test_a_large_registration_is_encoded_in_slices_exactly_as_whole(drawn: tuple[int, dict[str, Any]]) -> None:
    arity, body = drawn
    spec = registration_record(RegisterRequest.model_validate({"name": 'a "nodes":[],"edges":[] name', **body,
                                                                "timestamp_arity": arity}))
    many = 2_000 // len(spec.nodes) + 1  # over one slice
    record = Register(name=spec.name, arity=arity, nodes=spec.nodes * many, edges=spec.edges * many,
                      initial=spec.initial, df="d1", token="t", created_at="c")
    encoded = encode(record)
    assert encoded[ATTRIBUTION.size:] == msgspec.json.encode(record) and decode(encoded) == record


def test_a_registration_logged_as_json_by_hand_still_decodes() -> None:
    # The log's format is the JSON, not the Python classes: key order and spacing do not matter.
    payload = (b'{"name": "r", "arity": 2, "nodes": [{"id": 0, "inputs": 0, "outputs": 1, "name": "in"}], '
               b'"edges": [], "initial": [[0, 0, "source", [1, 2], 3]], "t": "register", "df": "d1", '
               b'"token": "' + b"ab" * 32 + b'", "created_at": "2026-01-01T00:00:00+00:00"}')
    assert decode(ATTRIBUTION.pack(1, 0, b"d1") + payload) == REGISTER


def test_an_unknown_record_is_refused() -> None:
    with pytest.raises(ValueError):
        decode(ATTRIBUTION.pack(9, 0, b"d1") + b'{"t":"mystery","df":"d1"}')


def test_framing_tells_a_torn_tail_from_a_damaged_record() -> None:
    a, b, c = (encode(Check(df=f"d{i}", result="agreed", detail=None)) for i in range(3))
    data = frame(a) + frame(b)
    assert scan(data).payloads == [(0, a), (len(frame(a)), b)] and scan(data).torn is None
    torn = scan(data + frame(c)[:-1])  # the file ends inside the last record: a torn write
    assert [p for _, p in torn.payloads] == [a, b] and torn.torn == len(data) and torn.damaged == []
    assert scan(data + b"\0" * 300).torn == len(data)  # a zero-filled tail is torn too
    corrupt = bytearray(data + frame(c))
    corrupt[-1] ^= 0xFF  # a complete last record with a bad checksum is damaged, not torn
    found = scan(bytes(corrupt))
    assert found.torn is None and [d.attribution for d in found.damaged] == [(3, 0, "d2")]
    assert scan(b"\x01\x00").torn == 0
    both = bytearray(data)
    both[3] ^= 1
    both[HEADER_SIZE // 2 + 3] ^= 1  # both header copies of the first record: nobody's bytes
    assert scan(bytes(both)).unreadable is not None and scan(bytes(both)).payloads == []


def test_segment_names_sort_and_parse(tmp_path: Path) -> None:
    for number in (10, 2, 1):
        (tmp_path / segment_name(number)).write_bytes(b"")
    (tmp_path / "wal-x.log").write_bytes(b"")
    (tmp_path / "notes.txt").write_bytes(b"")
    assert segment_name(2) == "wal-000002.log"
    assert [n for n, _ in segments(tmp_path)] == [1, 2, 10]
    assert all(segment_number(path) == n for n, path in segments(tmp_path))
    assert segment_number(tmp_path / "wal-x.log") is None


def _write_and_close(directory: Path, records: list[Batch | Check | Register]) -> list[int]:
    order: list[int] = []

    async def main() -> None:
        wal = WriteAheadLog(directory)
        wal.open()
        futures = [wal.enqueue(r, lambda i=i: order.append(i)) for i, r in enumerate(records)]
        await asyncio.gather(*futures)
        wal.close()

    asyncio.run(main())
    return order


def test_records_are_durable_in_order_and_recovered(tmp_path: Path) -> None:
    records = [REGISTER, *(Batch(df="d1", v=v, at=float(v), body=b'{"seq":%d}' % v) for v in range(1, 40))]
    order = _write_and_close(tmp_path, records)
    assert order == list(range(len(records)))  # on_durable callbacks run in log order
    assert [r for _, r in WriteAheadLog(tmp_path).recover().records] == records


def test_a_torn_tail_is_cut_off_and_the_log_continues_after_it(tmp_path: Path) -> None:
    first = [REGISTER, Batch(df="d1", v=1, at=1.0, body=b"{}")]
    _write_and_close(tmp_path, first)
    [(_, path)] = segments(tmp_path)
    intact = path.stat().st_size
    with open(path, "ab") as handle:  # a record the crash interrupted
        handle.write(frame(encode(Batch(df="d1", v=2, at=2.0, body=b"{}")))[:-3])
    records, found = read_segment(path)
    assert records == first and found.torn == intact and found.damaged == []
    assert [r for _, r in WriteAheadLog(tmp_path).recover().records] == first
    assert path.stat().st_size == intact
    later = [Batch(df="d1", v=2, at=3.0, body=b"{}")]
    _write_and_close(tmp_path, later)
    assert [r for _, r in WriteAheadLog(tmp_path).recover().records] == first + later


def test_rotation_starts_a_segment_with_the_header_and_old_ones_can_go(tmp_path: Path) -> None:
    async def main() -> int:
        wal = WriteAheadLog(tmp_path)
        wal.open()
        await wal.enqueue(Batch(df="d1", v=1, at=1.0, body=b"{}"))
        number = await wal.rotate(lambda: [REGISTER])
        await wal.enqueue(Batch(df="d1", v=2, at=2.0, body=b"{}"))
        assert wal.segment == number == 2
        removed = wal.delete_segments_before(number)
        wal.close()
        return removed

    assert asyncio.run(main()) == 1
    assert [n for n, _ in segments(tmp_path)] == [2]
    contents = WriteAheadLog(tmp_path).recover()
    assert [r for _, r in contents.records] == [REGISTER, Batch(df="d1", v=2, at=2.0, body=b"{}")]
    # The registration as logged, for the next rotation's header (not encoded again).
    assert contents.registrations == {REGISTER.df: framed(REGISTER)}


def test_a_header_given_as_logged_bytes_makes_the_same_segment(tmp_path: Path) -> None:
    """A rotation's header may give a registration as the bytes it was logged as (the service
    keeps them, so that a rotation does not encode every registration again): the segment is
    byte for byte the one its records make, and recovers to them."""
    records = [REGISTER, Batch(df="d1", v=3, at=1.5, body=b"{}")]
    made = []
    for number, header in ((1, records), (2, [framed(REGISTER), records[1]])):
        (tmp_path / str(number)).mkdir()
        made.append(create_segment(tmp_path / str(number), number, Marks.fresh({}), header))
    first, second = (tmp_path / "1" / segment_name(1)).read_bytes(), (tmp_path / "2" / segment_name(2)).read_bytes()
    assert made[0] == made[1] and first == second
    assert read_segment(tmp_path / "2" / segment_name(2))[0] == records


def test_a_dead_syncer_fails_the_log_and_nothing_more_is_acknowledged(tmp_path: Path) -> None:
    async def main() -> None:
        wal = WriteAheadLog(tmp_path)
        wal.open()
        assert wal._syncer is not None
        wal._syncer.kill()
        wal._syncer.wait()
        with pytest.raises(LogFailed):
            await wal.enqueue(Check(df="d1", result="agreed", detail=None))
        assert wal.failed is not None
        with pytest.raises(LogFailed):
            wal.enqueue(Check(df="d1", result="agreed", detail=None))
        wal.close()

    asyncio.run(main())


def test_a_quiet_log_syncs_on_the_event_loop_and_back_to_back_commits_use_the_sync_process(tmp_path: Path) -> None:
    """A lone record is synced by the event loop itself (no process round trip); records that
    follow a commit at once go to the sync process, so the loop keeps working during their sync.
    Every record is durable, in order, either way."""
    records = [Batch(df="d1", v=v, at=float(v), body=b'{"seq":%d}' % v) for v in range(1, 52)]
    order: list[int] = []

    async def main() -> tuple[int, int]:
        wal = WriteAheadLog(tmp_path)
        wal.open()
        await wal.enqueue(records[0], lambda: order.append(0))
        quiet = wal.inline_commits
        for i, record in enumerate(records[1:], 1):
            await wal.enqueue(record, lambda i=i: order.append(i))
        wal.close()
        return quiet, wal.inline_commits

    quiet, inline = asyncio.run(main())
    assert quiet == 1
    assert inline < len(records)  # some back-to-back commits went to the sync process
    assert order == list(range(len(records)))
    assert [r for _, r in WriteAheadLog(tmp_path).recover().records] == records


def test_a_large_record_is_synced_by_the_sync_process_even_on_a_quiet_log(tmp_path: Path) -> None:
    # A 6 MB registration's fdatasync took the event loop ~20 ms; the caller may frame it in a thread.
    big = Batch(df="d1", v=1, at=1.0, body=b"x" * (INLINE_BYTES_MAX + 1))
    small = Batch(df="d1", v=2, at=2.0, body=b"{}")

    async def main() -> int:
        wal = WriteAheadLog(tmp_path)
        wal.open()  # a fresh log is quiet: a small first record would be synced on the loop
        await wal.enqueue(big, as_framed=await asyncio.to_thread(framed, big))
        after_big = wal.inline_commits
        await wal.enqueue(small)
        wal.close()
        return after_big

    assert asyncio.run(main()) == 0  # the large one went to the sync process
    assert [r for _, r in WriteAheadLog(tmp_path).recover().records] == [big, small]


def test_a_group_with_long_callbacks_is_synced_by_the_sync_process_even_on_a_quiet_log(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A version of 32,000 frontier changes to publish: the loop would hold other dataflows for
    # the sync and the publish in one turn. The slow-disk rule (a quiet log syncs in the sync
    # process while recent syncs took over 10 ms) is another test's: a loaded machine's fsyncs
    # would trigger it here.
    monkeypatch.setattr(wal_module, "INLINE_SYNC_MAX", 1.0)
    records = [Batch(df="d1", v=v, at=float(v), body=b"{}") for v in range(1, 5)]
    durable: list[int] = []

    async def main() -> list[int]:
        wal = WriteAheadLog(tmp_path)
        wal.open()
        inline = [wal.inline_commits]
        for record in records:
            await asyncio.sleep(0.2)  # quiet before each: a small record alone is synced on the loop
            done = wal.enqueue(record, lambda v=record.v: durable.append(v))  # type: ignore[misc]
            if record.v % 2 == 0:
                wal.prefer_sync_process()
            await done
            inline.append(wal.inline_commits)
        wal.prefer_sync_process()  # nothing waiting to be committed: no effect on what follows
        await asyncio.sleep(0.2)
        await wal.enqueue(Batch(df="d1", v=5, at=5.0, body=b"{}"))
        inline.append(wal.inline_commits)
        wal.close()
        return inline

    assert asyncio.run(main()) == [0, 1, 1, 2, 2, 3]  # the even ones went to the sync process
    assert durable == [1, 2, 3, 4]
    assert [r.v for _, r in WriteAheadLog(tmp_path).recover().records] == [1, 2, 3, 4, 5]


def test_a_rotation_header_is_taken_after_the_last_groups_callbacks(tmp_path: Path) -> None:
    # The header describes what the older segments hold, so it must see what the callbacks of
    # their last group did (durable versions, worker positions).
    ran: list[str] = []

    async def main() -> None:
        wal = WriteAheadLog(tmp_path)
        wal.open()
        done = wal.enqueue(Batch(df="d1", v=1, at=1.0, body=b"{}"), lambda: ran.append("callback"))
        wal.prefer_sync_process()
        await asyncio.sleep(0)  # the group is with the sync process now
        rotated = wal.rotate(lambda: ran.append("header") or [])  # type: ignore[func-returns-value]
        await asyncio.gather(done, rotated)
        wal.close()

    asyncio.run(main())
    assert ran == ["callback", "header"]


def test_the_sync_process_answers_with_the_errno_and_the_disk_time(tmp_path: Path) -> None:
    # "Quiet" is judged by the disk's time: the round trip also holds two process wake-ups,
    # which on busy cores made a 0.7 ms sync look like 4 ms.
    import os
    import subprocess
    import sys

    from api.durability.syncer import ANSWER, REQUEST

    (tmp_path / segment_name(3)).write_bytes(b"x")
    syncer = subprocess.Popen([sys.executable, "-m", "api.durability.syncer", str(tmp_path)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE)
    assert syncer.stdin is not None and syncer.stdout is not None
    try:
        answers = []
        for segment in (3, 4):  # 4 does not exist: ENOENT, and the syncer goes on
            syncer.stdin.write(REQUEST.pack(segment))
            syncer.stdin.flush()
            answers.append(ANSWER.unpack(syncer.stdout.read(ANSWER.size)))
    finally:
        syncer.stdin.close()
        assert syncer.wait(10) == 0
    (ok, micros), (missing, _) = answers
    assert ok == 0 and 0 <= micros < 10_000_000 and missing == 2  # errno.ENOENT
    assert os.strerror(missing) == "No such file or directory"


def test_large_groups_written_off_the_loop_stay_in_log_order(tmp_path: Path) -> None:
    # A group over INLINE_BYTES_MAX is written by a worker thread; what is enqueued meanwhile
    # forms the next group and lands after it, and on_durable callbacks run in log order.
    records = [Batch(df="d1", v=v, at=float(v), body=(b"x" * (INLINE_BYTES_MAX + 1) if v % 3 == 1 else b"{}"))
               for v in range(1, 10)]
    durable: list[int] = []

    async def main() -> None:
        wal = WriteAheadLog(tmp_path)
        wal.open()
        futures = [wal.enqueue(r, lambda v=r.v: durable.append(v)) for r in records]  # type: ignore[misc]
        await asyncio.gather(*futures)
        wal.close()

    asyncio.run(main())
    assert durable == [r.v for r in records]
    assert [r for _, r in WriteAheadLog(tmp_path).recover().records] == records
