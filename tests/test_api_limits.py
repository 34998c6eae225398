"""The service's limits and protections against the real service: 429 for registrations and
subscribers, 431 for oversized heads, the head timeout, 413 bodies, tokens kept out of the log,
security headers, deeply nested JSON and non-positive initial counts."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from contextlib import ExitStack
from typing import Any

import httpx
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect as ws_connect

from api.config import Settings
from tests.helpers import (
    ADMIN_TOKEN,
    ServiceProcess,
    assert_oversized_progress_refused,
    loop_graph,
    register,
    update,
)

HEAD_TIMEOUT = 1.0
MAX_HEADER = 16 * 1024
MAX_DATAFLOWS = 20  # the module's other tests register about 8
pytestmark = pytest.mark.service(
    TRACKER_MAX_SUBSCRIBERS_PER_DATAFLOW="2", TRACKER_MAX_SUBSCRIBERS="3", TRACKER_MAX_HEADER_BYTES=str(MAX_HEADER),
    TRACKER_HEADER_TIMEOUT=str(HEAD_TIMEOUT), TRACKER_MAX_BODY="1000000", TRACKER_REGISTER_BURST="30",
    TRACKER_REGISTER_RATE="2", TRACKER_MAX_DATAFLOWS=str(MAX_DATAFLOWS))


def _raw(service: ServiceProcess, data: bytes, wait: float = 5.0) -> tuple[bytes, float]:
    """Send ``data`` on a fresh connection; everything the server sends until it closes, and
    how long that took."""
    with socket.create_connection(("127.0.0.1", service.port)) as sock:
        sock.settimeout(wait)
        started = time.monotonic()
        if data:
            sock.sendall(data)
        return _until_closed(sock), time.monotonic() - started


def _until_closed(sock: socket.socket) -> bytes:
    """Everything ``sock`` receives until the server closes or resets it, or it times out."""
    received = b""
    try:
        while chunk := sock.recv(65536):
            received += chunk
    except (ConnectionResetError, TimeoutError):
        pass
    return received


def _response(sock: socket.socket) -> bytes:
    """One whole HTTP answer (head and ``Content-Length`` bytes of body) read from ``sock``."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length"))
    while len(body) < length:
        body += sock.recv(65536)
    return data


def _status(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else 0


def _body(answer: bytes) -> dict[str, Any]:
    return json.loads(answer.partition(b"\r\n\r\n")[2])


# -- subscribers -------------------------------------------------------------------------------


def _sse(stack: ExitStack, service: ServiceProcess, dataflow_id: str, token: str) -> httpx.Response:
    client = stack.enter_context(service.client(token))
    return stack.enter_context(client.stream("GET", f"/v1/dataflows/{dataflow_id}/frontier/stream"))


def _admitted_sse(service: ServiceProcess, dataflow_id: str, token: str, timeout: float = 15.0) -> None:
    """Until a new SSE subscription of ``dataflow_id`` is admitted (a released slot is freed when
    the server notices the client went away)."""
    deadline = time.monotonic() + timeout
    while True:
        with service.client(token) as client:
            url = f"/v1/dataflows/{dataflow_id}/frontier/stream"
            with client.stream("GET", url) as sse:
                if sse.status_code == 200:
                    return
        assert time.monotonic() < deadline, "the released subscriber slot was never freed"
        time.sleep(0.05)


def test_subscribers_are_limited_per_dataflow_and_in_total(service: ServiceProcess) -> None:
    (a, token_a), (b, token_b) = register(service, loop_graph()), register(service, loop_graph())
    with ExitStack() as stack:
        opened = time.monotonic()
        first, second = _sse(stack, service, a, token_a), _sse(stack, service, a, token_a)
        assert first.status_code == second.status_code == 200
        with service.client(token_a) as client, client.stream("GET", f"/v1/dataflows/{a}/frontier/stream") as third:
            third.read()
            assert third.status_code == 429 and third.json()["error"] == "too_many_subscribers"
            assert "TRACKER_MAX_SUBSCRIBERS_PER_DATAFLOW" in third.json()["detail"]
            assert int(third.headers["Retry-After"]) >= 1
        # A WebSocket subscriber counts too; it learns why from the close code and reason.
        with ws_connect(f"{service.ws_url}/v1/dataflows/{a}/ws?token={token_a}") as ws, \
                pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=5)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1013
        assert closed.value.rcvd.reason.startswith("too_many_subscribers")
        # A worker that only sends is no subscriber.
        with ws_connect(f"{service.ws_url}/v1/dataflows/{a}/ws?subscribe=false&token={token_a}") as ws:
            ws.send(json.dumps({"worker": "w", "seq": 0, "updates": []}))
            assert json.loads(ws.recv(timeout=5))["type"] == "ack"
        # The third subscriber in all (of b), then none beyond, whichever the dataflow.
        ws_b = stack.enter_context(ws_connect(f"{service.ws_url}/v1/dataflows/{b}/ws?token={token_b}"))
        assert json.loads(ws_b.recv(timeout=5))["type"] == "snapshot"
        with service.client(token_b) as client, client.stream("GET", f"/v1/dataflows/{b}/frontier/stream") as over:
            over.read()
            assert over.status_code == 429 and "TRACKER_MAX_SUBSCRIBERS)" in over.json()["detail"]
        # Streams are not cut by the head timeout: the first one still gets changes.
        time.sleep(max(0.0, HEAD_TIMEOUT + 0.2 - (time.monotonic() - opened)))
        with service.client(token_a) as client:
            batch = {"worker": "w", "seq": 1, "updates": [update(0, 0, "source", [0], -1),
                                                           update(0, 0, "source", [1], 1)]}
            assert client.post(f"/v1/dataflows/{a}/progress", json=batch).status_code == 200
        events = first.iter_lines()
        assert any(line == "event: changes" for line in events)
        ws_b.close()
        _admitted_sse(service, b, token_b)  # b's WebSocket slot came back
    _admitted_sse(service, a, token_a)  # and so did a's when its streams ended


# -- heads: size and time ----------------------------------------------------------------------


def _peak_reset(pid: int) -> int:
    """Reset the process's peak resident size (``VmHWM``) to its current size; that size, kB."""
    with open(f"/proc/{pid}/clear_refs", "w") as handle:
        handle.write("5")
    return _memory(pid)["VmHWM"]


def _memory(pid: int) -> dict[str, int]:
    with open(f"/proc/{pid}/status") as handle:
        rows = [line.split() for line in handle if line.startswith("Vm")]
    return {row[0].rstrip(":"): int(row[1]) for row in rows}


def test_oversized_heads_get_431_without_buffering_them(service: ServiceProcess) -> None:
    under = httpx.get(service.url + "/healthz", headers={"X-Padding": "a" * (MAX_HEADER - 2048)})
    assert under.status_code == 200
    answer, _ = _raw(service, b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Padding: " + b"a" * 2 * MAX_HEADER + b"\r\n\r\n")
    assert _status(answer) == 431 and _body(answer)["error"] == "headers_too_large", answer[:200]
    assert b"\r\nx-frame-options: DENY\r\n" in answer  # the protocol's own answers carry the headers too
    many, _ = _raw(service, b"GET /healthz HTTP/1.1\r\n" + b"".join(b"X-%d: %s\r\n" % (i, b"b" * 100)
                                                                  for i in range(400)) + b"\r\n")
    assert _status(many) == 431  # many headers add up
    # 16 MiB of one header, sent while the server answers: the peak memory stays flat.
    pid = service.pid_of("hot")  # the process serving requests, under tracker serve
    before = _peak_reset(pid)
    with socket.create_connection(("127.0.0.1", service.port)) as sock:
        sock.settimeout(10)
        started = time.monotonic()

        def flood() -> None:
            with contextlib.suppress(OSError):  # the server closed: expected
                sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Huge: " + b"h" * (16 << 20))

        sender = threading.Thread(target=flood)
        sender.start()
        received = _until_closed(sock)
        elapsed = time.monotonic() - started
        sender.join(10)
    assert _status(received) in (431, 0) and elapsed < 5, (received[:100], elapsed)
    growth_kb = _memory(pid)["VmHWM"] - before
    assert growth_kb < 8 * 1024, f"peak memory grew by {growth_kb} kB for a 16 MiB header"
    assert httpx.get(service.url + "/healthz", timeout=2).status_code == 200


def _upgrade(path: bytes, extra: bytes = b"") -> bytes:
    return (b"GET " + path + b" HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n" + extra + b"\r\n")


def test_websocket_handshakes_refused_by_their_size_are_answered_and_closed(service: ServiceProcess) -> None:
    """A WebSocket upgrade whose request line is over 8 KiB (under the head limit) was never
    answered nor closed, without any token: the client got 0 bytes and the server kept the
    descriptor. Now: 414 with the JSON error, then the connection ends; a header line over
    8 KiB gets 431 the same way."""
    long_path = b"/v1/dataflows/x/ws?subscribe=false&pad=" + b"a" * 9000
    answer, waited = _raw(service, _upgrade(long_path))
    assert _status(answer) == 414 and _body(answer)["error"] == "uri_too_long", answer[:300]
    assert b"\r\nx-frame-options: DENY\r\n" in answer and waited < 5
    answer, waited = _raw(service, _upgrade(b"/v1/dataflows/x/ws", b"X-Padding: " + b"p" * 9000 + b"\r\n"))
    assert _status(answer) == 431 and _body(answer)["error"] == "headers_too_large", answer[:300]
    assert waited < 5
    with ExitStack() as stack:  # many at once: each one ends (before, each held its descriptor)
        socks = [stack.enter_context(socket.create_connection(("127.0.0.1", service.port))) for _ in range(50)]
        for sock in socks:
            sock.settimeout(10)
            sock.sendall(_upgrade(long_path))
        assert all(_status(_until_closed(sock)) == 414 for sock in socks)
    assert httpx.get(service.url + "/healthz", timeout=5).status_code == 200


def test_incomplete_heads_are_timed_out_and_kept_alive_connections_are_not(service: ServiceProcess) -> None:
    partial, waited = _raw(service, b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # never finished
    assert _status(partial) == 408 and _body(partial)["error"] == "request_timeout", partial
    assert HEAD_TIMEOUT * 0.8 <= waited < HEAD_TIMEOUT + 5, waited
    silent, waited = _raw(service, b"")  # connected, never sent a byte
    assert silent == b"" and HEAD_TIMEOUT * 0.8 <= waited < HEAD_TIMEOUT + 5, waited
    # A kept-alive connection idle for longer than the head timeout serves its next request.
    with socket.create_connection(("127.0.0.1", service.port)) as sock:
        sock.settimeout(5)
        for pause in (0.0, HEAD_TIMEOUT + 0.3):
            time.sleep(pause)
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert _status(_response(sock)) == 200


def test_a_body_that_stops_arriving_is_timed_out_and_a_client_leaving_mid_body_is_no_error(
        service: ServiceProcess) -> None:
    """Content-Length 1000, one byte sent: the connection was held 40 s and more (with a
    dataflow token); now 408 once no byte came for the head timeout, and closed. A client that
    leaves mid-body was logged as an ERROR with a stack trace; now one info line."""
    dataflow_id, token = register(service, loop_graph())
    head = (f"POST /v1/dataflows/{dataflow_id}/progress HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
            "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n").encode()
    answer, waited = _raw(service, head + b"{", wait=HEAD_TIMEOUT + 10)
    assert _status(answer) == 408 and _body(answer)["error"] == "request_timeout", answer[:300]
    assert HEAD_TIMEOUT * 0.8 <= waited < HEAD_TIMEOUT + 5, waited
    with socket.create_connection(("127.0.0.1", service.port)) as sock:  # a slow body is not idle
        sock.settimeout(10)
        body = json.dumps({"worker": "slow", "seq": 0, "updates": []}).encode()
        sock.sendall(head.replace(b"1000", str(len(body)).encode()))
        for i in range(0, len(body), 8):
            time.sleep(HEAD_TIMEOUT / 4)
            sock.sendall(body[i:i + 8])
        assert _status(_response(sock)) == 200
    mark = len(service.log_path.read_text())
    with socket.create_connection(("127.0.0.1", service.port)) as sock:
        sock.sendall(head + b'{"worker"')
        time.sleep(0.2)
    time.sleep(0.5)
    lines = [json.loads(line) for line in service.log_path.read_text()[mark:].splitlines() if line.startswith("{")]
    assert not [line for line in lines if line["level"] in ("error", "critical")], lines
    assert any("went away before its request body arrived" in line["msg"] for line in lines), lines


def test_oversized_bodies_and_messages_are_refused(service: ServiceProcess) -> None:
    dataflow_id, token = register(service, loop_graph())
    with service.client(token) as client:
        big = {"worker": "w", "seq": 0, "updates": [update(1, 0, "target", [1], 1)] * 20_000}
        answer = assert_oversized_progress_refused(client, dataflow_id, big, [b"[" + b" " * 1_100_000, b"]"])
        assert answer.headers["X-Content-Type-Options"] == "nosniff"
    with ws_connect(f"{service.ws_url}/v1/dataflows/{dataflow_id}/ws?subscribe=false&token={token}",
                    max_size=None) as ws:
        ws.send(json.dumps(big))
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=5)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009
    with service.client(token) as client:
        assert client.get(f"/v1/dataflows/{dataflow_id}").json()["version"] == 0


# -- tokens, headers, bodies -------------------------------------------------------------------


def test_tokens_in_websocket_urls_never_reach_the_log(service: ServiceProcess) -> None:
    dataflow_id, token = register(service, loop_graph())
    for secret in (token, ADMIN_TOKEN):
        with ws_connect(f"{service.ws_url}/v1/dataflows/{dataflow_id}/ws?token={secret}") as ws:
            assert json.loads(ws.recv(timeout=5))["type"] == "snapshot"
    with pytest.raises(InvalidStatus):  # a refused handshake is logged too
        ws_connect(f"{service.ws_url}/v1/dataflows/{dataflow_id}/ws?token=wrong-{token}").close()
    deadline = time.monotonic() + 5
    while "token=[redacted]" not in (log := service.log_path.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    handshakes = [line for line in log.splitlines() if f"/v1/dataflows/{dataflow_id}/ws" in line]
    assert any("token=[redacted]" in line for line in handshakes), handshakes  # the lines exist, redacted
    assert token not in log and ADMIN_TOKEN not in log


def test_every_log_line_is_json_without_secrets_or_colours(service: ServiceProcess) -> None:
    """``?access_token=`` was logged in clear; a redacted ``?token=`` at the end of a quoted path
    took the backslash escaping the quote with it (an invalid JSON line); uvicorn's colour codes
    were copied into the lines."""
    dataflow_id, token = register(service, loop_graph())
    for query in (f"access_token={token}", f"token=wrong-{token}"):  # refused (401), and logged
        with pytest.raises(InvalidStatus), ws_connect(f"{service.ws_url}/v1/dataflows/{dataflow_id}/ws?{query}"):
            pass
    time.sleep(0.5)
    log = service.log_path.read_text()
    assert token not in log and "access_token=[redacted]" in log
    lines = [line for line in log.splitlines() if line.strip()]
    # The start-up line meant for people ("[tracker] ready at ...") is the one line not JSON.
    assert [line for line in lines if line.startswith("[tracker] ready at ")]
    for line in lines:
        if not line.startswith("[tracker] "):
            json.loads(line)  # every other line is one JSON object
    assert not [line for line in lines if "\\u001b" in line or "\x1b" in line]


def test_security_headers_on_the_dashboard_and_the_api(service: ServiceProcess) -> None:
    dataflow_id, token = register(service, loop_graph())
    with service.client(token) as client:
        for path in ("/dashboard", "/healthz", f"/v1/dataflows/{dataflow_id}", "/static/dashboard.js", "/docs"):
            headers = client.get(path).headers
            policy = headers["Content-Security-Policy"]
            assert "frame-ancestors 'none'" in policy and "default-src 'self'" in policy, path
            assert "unsafe-inline" not in policy and "unsafe-eval" not in policy, path
            assert headers["X-Content-Type-Options"] == "nosniff", path
            assert headers["Referrer-Policy"] == "no-referrer" and headers["X-Frame-Options"] == "DENY", path
        for page in ("/docs", "/dashboard"):  # the policy allows no inline script: pages have none
            assert "<script>" not in client.get(page).text.replace(" ", "")


def test_deeply_nested_json_is_a_client_error_on_every_route(service: ServiceProcess) -> None:
    dataflow_id, token = register(service, loop_graph())
    with service.client() as client:
        for body in (b"[" * 200_000, b'{"a":' * 100_000, b'{"name": "x", "nodes": ' + b"[" * 5000):
            answer = client.post("/v1/dataflows", content=body, headers={"Content-Type": "application/json"})
            assert answer.status_code in (400, 422), (answer.status_code, answer.text[:200])
            assert answer.json()["error"] in ("invalid_request", "malformed_json")
        deep = client.post("/v1/dataflows", content=b"[" * 200_000 + b"]" * 200_000)
        assert deep.status_code == 422 and "nested too deeply" in deep.json()["detail"][0]["msg"]
        progress = client.post(f"/v1/dataflows/{dataflow_id}/progress", content=b"[" * 200_000)
        assert progress.status_code in (400, 422)
        locations = "[" * 5_000  # past the recursion limit of json.loads
        stream = client.get(f"/v1/dataflows/{dataflow_id}/frontier/stream", params={"locations": locations})
        assert stream.status_code == 422 and stream.json()["error"] == "invalid_request"
        assert len(client.get("/v1/dataflows").json()) >= 1 and client.get("/healthz").status_code == 200
    with pytest.raises(InvalidStatus) as refused:
        ws_connect(f"{service.ws_url}/v1/dataflows/{dataflow_id}/ws?token={token}&locations={locations}").close()
    assert refused.value.response.status_code == 422


def test_initial_counts_must_be_positive(service: ServiceProcess) -> None:
    with service.client() as client:
        before = len(client.get("/v1/dataflows").json())
        for delta in (0, -1):
            body = {**loop_graph(), "initial": [update(0, 0, "source", [0], delta)]}
            answer = client.post("/v1/dataflows", json=body)
            assert answer.status_code == 422 and answer.json()["error"] == "invalid_graph", answer.text
            assert f"delta {delta}" in answer.json()["detail"] and "must be positive" in answer.json()["detail"]
        nested = {"name": "n", "nodes": [{"id": 1, "inputs": 0, "outputs": 1}, {"id": 2, "inputs": 1, "outputs": 0,
                  "scope": {"kind": "region", "nodes": [{"id": 1, "inputs": 1, "outputs": 0}],
                            "edges": [{"source": {"node": 0, "port": 0}, "target": {"node": 1, "port": 0}}]}}],
                  "edges": [{"source": {"node": 1, "port": 0}, "target": {"node": 2, "port": 0}}],
                  "initial": [update(1, 0, "source", [0], 0)]}
        answer = client.post("/v1/dataflows", json=nested)
        assert answer.status_code == 422 and "must be positive" in answer.json()["detail"], answer.text
        assert len(client.get("/v1/dataflows").json()) == before


def test_limit_settings_are_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACKER_MAX_SUBSCRIBERS", "many")
    with pytest.raises(ValueError, match="TRACKER_MAX_SUBSCRIBERS"):
        Settings.from_env()
    monkeypatch.delenv("TRACKER_MAX_SUBSCRIBERS")
    monkeypatch.setenv("TRACKER_MAX_HEADER_BYTES", "100")
    with pytest.raises(ValueError, match="at least 1024"):
        Settings.from_env()
    monkeypatch.setenv("TRACKER_MAX_HEADER_BYTES", "0")
    assert Settings.from_env().max_header_bytes == 0


# -- registrations (last: it uses up the module's registrations) ------------------------------


def test_registrations_are_rate_limited_per_token_and_live_dataflows_capped(service: ServiceProcess) -> None:
    with service.client() as client:
        # Every attempt costs a token, refused ones too: the validation is what a flood costs.
        answered, began = 0, time.monotonic()
        while (refused := client.post("/v1/dataflows", json={"name": "not a graph"})).status_code == 422:
            answered += 1
            # The burst of 30, plus what the bucket refilled meanwhile (2 per second): on a slow
            # machine each attempt takes long enough to earn a few more.
            assert answered <= 30 + 2 * (time.monotonic() - began) + 1, "never rate limited"
        assert refused.status_code == 429 and answered >= 10, (answered, refused.text)
        assert refused.json()["error"] == "rate_limited" and "TRACKER_REGISTER_RATE" in refused.json()["detail"]
        wait = int(refused.headers["Retry-After"])
        assert wait == refused.json()["retry_after"] == 1  # 2 per second: the next token within a second
        live = len(client.get("/v1/dataflows").json())
        time.sleep(wait)
        assert client.post("/v1/dataflows", json={"name": "not a graph"}).status_code == 422  # refilled
        # The cap on live dataflows: registrations succeed (waiting out the rate) until it is reached.
        for _ in range(MAX_DATAFLOWS * 2):
            answer = client.post("/v1/dataflows", json=loop_graph())
            if answer.status_code == 429 and answer.json()["error"] == "rate_limited":
                time.sleep(int(answer.headers["Retry-After"]))
                continue
            if answer.status_code != 201:
                break
            live += 1
        assert answer.status_code == 429 and answer.json()["error"] == "too_many_dataflows", answer.text
        assert "TRACKER_MAX_DATAFLOWS" in answer.json()["detail"] and int(answer.headers["Retry-After"]) >= 1
        assert live == MAX_DATAFLOWS == len(client.get("/v1/dataflows").json())
