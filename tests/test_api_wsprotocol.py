"""The WebSocket protocol ``tracker serve`` runs (:mod:`api.web.wsprotocol`): its direct text frames
are byte for byte websockets' own, and a real uvicorn server with it delivers every message,
compressed or not, whatever its size."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect
from websockets.frames import Frame, Opcode
from websockets.sync.client import connect

from api.web.wsprotocol import FramedWebSockets, text_frame_header

SIZES = [0, 1, 125, 126, 127, 65_535, 65_536, 70_000, 1_600_000]


@pytest.mark.parametrize("size", SIZES)
def test_a_text_frame_is_the_one_websockets_builds(size: int) -> None:
    payload = ("é" * (size // 2) + "x" * (size % 2)).encode()
    assert text_frame_header(len(payload)) + payload == Frame(Opcode.TEXT, payload).serialize(mask=False,
                                                                                               extensions=[])


async def _echo(websocket: WebSocket) -> None:
    await websocket.accept()
    try:
        while True:
            text = await websocket.receive_text()
            await websocket.send_text(text)
            await websocket.send_bytes(text.encode())  # binary frames: uvicorn's own path
    except WebSocketDisconnect:
        return


@pytest.fixture(params=[False, True], ids=["plain", "deflate"])
def server(request: pytest.FixtureRequest) -> Iterator[tuple[str, bool]]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = uvicorn.Config(Starlette(routes=[WebSocketRoute("/echo", _echo)]), host="127.0.0.1", port=port,
                            ws=FramedWebSockets, ws_per_message_deflate=request.param, log_level="warning",
                            ws_max_size=4 << 20)
    served = uvicorn.Server(config)
    thread = threading.Thread(target=served.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not served.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.01)
    yield f"ws://127.0.0.1:{port}/echo", request.param
    served.should_exit = True
    thread.join(10)


def test_a_real_server_delivers_every_message(server: tuple[str, bool]) -> None:
    url, deflate = server
    with connect(url, max_size=None, compression="deflate" if deflate else None) as client:
        assert bool(client.protocol.extensions) == deflate  # compressed frames: uvicorn's own path
        for size in SIZES:
            text = "é" * (size // 2) + "x" * (size % 2)
            client.send(text)
            assert client.recv() == text
            assert client.recv() == text.encode()
