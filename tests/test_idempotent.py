"""Idempotent registration (``api.host.keys``): the same ``Idempotency-Key`` and graph is
answered as the first time (the same id and token), also after ``kill -9`` and a restart and
when two such requests race; another graph under the key is 409; a registration whose
``X-Tracker-Deadline`` passed before it was logged is refused with nothing registered, and one
that became durable only after it is withdrawn (logged, never served, gone after a restart)."""

from __future__ import annotations

import asyncio
import itertools
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from api.config import Settings
from api.durability.records import Delete
from api.durability.wal import WriteAheadLog
from api.host.ingest import Refused
from api.host.service import Service
from api.schema.models import RegisterRequest
from api.shards.layout import wal_directory
from tests.helpers import ServiceProcess, ServiceStarter, loop_graph

pytestmark = pytest.mark.service


def _register(service: ServiceProcess, body: dict[str, object], key: str | None = None,
              deadline: float | None = None) -> httpx.Response:
    headers = {**({"Idempotency-Key": key} if key else {}), **({"X-Tracker-Deadline": str(deadline)} if deadline
                                                              else {})}
    with service.client() as client:
        return client.post("/v1/dataflows", json=body, headers=headers)


def test_a_retry_with_its_key_gets_the_first_answer_also_after_kill_9(start_service: ServiceStarter) -> None:
    service = start_service()
    body = loop_graph(3, name="once")
    first = _register(service, body, "key-1")
    assert first.status_code == 201 and "idempotent-replayed" not in first.headers
    again = _register(service, body, "key-1")
    assert again.status_code == 201 and again.json() == first.json() and again.headers["idempotent-replayed"] == "true"
    other = _register(service, loop_graph(4, name="once"), "key-1")
    assert other.status_code == 409 and other.json()["error"] == "idempotency_key_reused", other.text
    with ThreadPoolExecutor(4) as pool:  # four at once with a new key: one dataflow
        racing = list(pool.map(lambda _: _register(service, body, "key-2"), range(4)))
    assert {r.status_code for r in racing} == {201} and len({r.json()["id"] for r in racing}) == 1
    service.kill9()
    service.restart()
    after = _register(service, body, "key-1")
    assert after.json() == first.json() and after.headers["idempotent-replayed"] == "true"
    with service.client(first.json()["token"]) as own:  # the token given again is the dataflow's
        assert own.get(f"/v1/dataflows/{first.json()['id']}").status_code == 200
    with service.client() as client:
        names = [d["name"] for d in client.get("/v1/dataflows").json()]
    assert names == ["once", "once"]  # key-1's and key-2's, nothing more
    assert _register(service, body, "x" * 201).status_code == 400


def test_a_registration_past_its_deadline_is_refused_and_nothing_is_registered(start_service: ServiceStarter) -> None:
    service = start_service()
    late = _register(service, loop_graph(3, name="late"), "key-late", deadline=time.time() - 1)
    assert late.status_code == 503 and late.json()["error"] == "deadline_passed", late.text
    with service.client() as client:
        assert client.get("/v1/dataflows").json() == []
    assert _register(service, loop_graph(3, name="late"), "key-late", deadline=time.time() + 5).status_code == 201


def test_a_registration_durable_after_its_deadline_is_withdrawn_for_good() -> None:
    warehouse = Path(tempfile.mkdtemp()) / "warehouse"
    warehouse.mkdir()
    settings = Settings(warehouse=warehouse, delta=False, spark=False)
    clock = itertools.count(1000.0, 0.5)  # the deadline passes between the check and the log's answer

    async def register() -> Service:
        service = Service(settings, "admin")
        service.recover()
        service.clock = clock.__next__  # checked twice: before logging (1000.0), once durable (1000.5)
        with pytest.raises(Refused) as refused:
            await service.register(RegisterRequest.model_validate(loop_graph(3, name="withdrawn")), key="k",
                                   deadline=1000.2)
        assert refused.value.status == 503 and "withdrawn" in refused.value.body["detail"]
        assert service.dataflows == {}
        await asyncio.sleep(0.2)
        service.wal.close()
        return service

    asyncio.run(register())
    records = WriteAheadLog(wal_directory(warehouse, 0)).recover().records
    assert [r.withdrawn for _, r in records if isinstance(r, Delete)] == [True]
    restarted = Service(settings, "admin")
    restarted.recover()
    try:
        assert restarted.dataflows == {} and restarted.damaged == {} and restarted.keys.get("k") is None
    finally:
        restarted.wal.close()
