"""Least privilege against the real service: the program token, the credential a program's
workers hold instead of the admin token.

It may register dataflows (the answer's token is the dataflow's own) and then report their
progress and read them, over REST and the WebSocket; nothing else: every other dataflow, every
deletion and every admin route answers 403 (not 401: the token is valid), and the listing shows
only its own dataflows. A dataflow's token may not register. Ownership needs no record: it
survives a restart, and a program token changed at a restart owns none of the old dataflows.
(Through the front of several shards: ``tests/test_shards.py``.)
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect as ws_connect

from tests.helpers import ServiceProcess, ServiceStarter, loop_graph, program_token, register, update

pytestmark = pytest.mark.service(TRACKER_DELTA="0")


def _as(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _post(service: ServiceProcess, token: str, dataflow: str, seq: int) -> httpx.Response:
    return httpx.post(f"{service.url}/v1/dataflows/{dataflow}/progress", headers=_as(token), json={
        "worker": "w", "seq": seq, "updates": [update(0, 0, "source", [seq + 1], 1)]})


def _forbidden(answer: httpx.Response) -> bool:
    return answer.status_code == 403 and answer.json()["error"] == "forbidden"


def _registered(service: ServiceProcess, token: str, name: str) -> dict[str, Any]:
    answer = httpx.post(f"{service.url}/v1/dataflows", headers=_as(token), json=loop_graph(3, name=name))
    assert answer.status_code == 201, answer.text
    body: dict[str, Any] = answer.json()
    return body


def test_the_program_token_registers_and_reports_its_own_dataflows_and_nothing_else(service: ServiceProcess) -> None:
    program = program_token(service)
    mine = _registered(service, program, "program-own")
    others, other_token = register(service, loop_graph(3, name="admins"))  # the admin token's
    url = f"{service.url}/v1/dataflows"
    # Its own: progress with the program token and with the dataflow's token, reads, the socket.
    assert _post(service, program, mine["id"], 0).json()["version"] == 1
    assert _post(service, mine["token"], mine["id"], 1).json()["version"] == 2
    for path in ("", "/frontier", "/pointstamps", "/lag", "/progress-estimate"):
        assert httpx.get(f"{url}/{mine['id']}{path}", headers=_as(program)).status_code == 200, path
    with ws_connect(f"{service.ws_url}/v1/dataflows/{mine['id']}/ws?subscribe=false&token={program}") as ws:
        ws.send(json.dumps({"worker": "w", "seq": 2, "updates": [update(0, 0, "source", [3], 1)]}))
        assert json.loads(ws.recv(timeout=10))["version"] == 3
    listed = httpx.get(url, headers=_as(program)).json()
    assert [d["id"] for d in listed] == [mine["id"]]
    # Nothing else: another dataflow (read, progress, socket), a made-up id, deletion, admin routes.
    for path in ("", "/frontier", "/pointstamps", "/lag"):
        assert _forbidden(httpx.get(f"{url}/{others}{path}", headers=_as(program))), path
    assert _forbidden(_post(service, program, others, 0))
    assert _forbidden(httpx.get(f"{url}/no-such-dataflow", headers=_as(program)))  # ids are not revealed
    with pytest.raises(InvalidStatus, match="403"):
        ws_connect(f"{service.ws_url}/v1/dataflows/{others}/ws?token={program}")
    assert _forbidden(httpx.delete(f"{url}/{mine['id']}", headers=_as(program)))
    assert _forbidden(httpx.post(f"{url}/{mine['id']}/audit", headers=_as(program)))
    assert _forbidden(httpx.get(f"{service.url}/v1/processes", headers=_as(program)))
    assert "damaged" not in httpx.get(f"{service.url}/healthz", headers=_as(program)).json()
    # A dataflow's token may not register; the admin token still may do everything.
    refused = httpx.post(url, headers=_as(other_token), json=loop_graph(3, name="not-allowed"))
    assert _forbidden(refused) and "program token" in refused.json()["detail"], refused.text
    assert httpx.get(f"{url}/{mine['id']}", headers=service.admin_headers).json()["version"] == 3
    assert httpx.get(f"{url}/{others}", headers=service.admin_headers).json()["version"] == 0
    assert httpx.get(url, headers=_as("wrong")).status_code == 401


def test_ownership_survives_a_restart_and_a_new_program_token_owns_nothing_old(start_service: ServiceStarter
                                                                              ) -> None:
    service = start_service(TRACKER_DELTA="0")
    program = program_token(service)
    mine = _registered(service, program, "kept")
    assert _post(service, program, mine["id"], 0).status_code == 200
    service.kill9()
    service.restart()
    assert program_token(service) == program  # read back from the warehouse, not generated again
    assert _post(service, program, mine["id"], 1).json()["version"] == 2
    assert [d["id"] for d in httpx.get(f"{service.url}/v1/dataflows", headers=_as(program)).json()] == [mine["id"]]
    service.stop()
    service.extra_env["TRACKER_PROGRAM_TOKEN"] = "chosen-program-token"
    service.restart()
    assert httpx.get(f"{service.url}/v1/dataflows", headers=_as(program)).status_code == 401
    assert _forbidden(_post(service, "chosen-program-token", mine["id"], 2))
    assert httpx.get(f"{service.url}/v1/dataflows", headers=_as("chosen-program-token")).json() == []
    assert _post(service, mine["token"], mine["id"], 2).json()["version"] == 3  # its own token still works
    fresh = _registered(service, "chosen-program-token", "fresh")
    assert _post(service, "chosen-program-token", fresh["id"], 0).status_code == 200
