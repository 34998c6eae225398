"""limits: what oversized request heads and half-open connections cost the service, guarded vs. not.

The same three attacks against the service with its head limits (the defaults: 64 KiB of request
line and headers, 10 s to send them; ``--quick``: 2 s) and without them
(``TRACKER_MAX_HEADER_BYTES=0 TRACKER_HEADER_TIMEOUT=0``: what uvicorn's httptools protocol does
alone):

* ``half_open``: 2,000 connections (500 with ``--quick``) each send an unfinished head and wait;
  the figures are ``/healthz`` latency while they are held and how long until the service has
  closed them all (given up after the timeout plus 10 s);
* ``one_16mib``: one 16 MiB header: seconds until the service answered or closed, the answer's
  status and the growth of the service's peak resident memory (``VmHWM``, reset before);
* ``many``: ten 64 MiB headers at once (four of 16 MiB with ``--quick``): peak memory growth and
  the slowest ``/healthz`` answer during the attack (30 s: it did not answer within 30 s).

>>> _status(b"HTTP/1.1 431 Request Header Fields Too Large\\r\\n")
431
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from api.run.process import ServiceProcess


def _status(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else 0


def _peak_reset(pid: int) -> int:
    Path(f"/proc/{pid}/clear_refs").write_text("5")
    return _peak(pid)


def _peak(pid: int) -> int:
    """The process's peak resident memory since the last reset, kB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise RuntimeError("no VmHWM")


HEALTHZ_TIMEOUT = 30.0


def _healthz(url: str) -> float:
    """Seconds ``/healthz`` took to answer (:data:`HEALTHZ_TIMEOUT` if it did not answer in time)."""
    started = time.perf_counter()
    try:
        httpx.get(url + "/healthz", timeout=HEALTHZ_TIMEOUT)
    except httpx.HTTPError:
        return HEALTHZ_TIMEOUT
    return time.perf_counter() - started


def _half_open(service: ServiceProcess, count: int, give_up: float) -> dict[str, Any]:
    socks = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", service.port))
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        socks.append(sock)
    opened = time.monotonic()
    latencies: list[float] = []
    sampler = threading.Thread(target=lambda: latencies.extend(_healthz(service.url) for _ in range(20)))
    sampler.start()  # while the connections are held and being closed
    selector = selectors.DefaultSelector()
    for sock in socks:
        sock.setblocking(False)
        selector.register(sock, selectors.EVENT_READ, sock)
    open_ = set(socks)
    while open_ and time.monotonic() - opened < give_up:
        for key, _ in selector.select(timeout=0.2):
            sock = key.data
            try:
                data = sock.recv(65536)
            except OSError:
                data = b""
            if not data:  # closed by the service (after its 408, if any)
                selector.unregister(sock)
                open_.discard(sock)
    closed_after = time.monotonic() - opened
    for sock in socks:
        sock.close()
    sampler.join()
    return {"connections": count, "healthz_p50_ms": round(statistics.median(latencies) * 1e3, 1),
            "healthz_max_ms": round(max(latencies) * 1e3, 1),
            "still_open": len(open_), "all_closed_after_s": None if open_ else round(closed_after, 1),
            "watched_s": round(closed_after, 1)}


def _flood(service: ServiceProcess, size: int, result: dict[str, Any]) -> None:
    """One connection sending a ``size``-byte header; what came back and when."""
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", service.port)) as sock:
        sock.settimeout(60)
        huge = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Huge: " + b"h" * size + b"\r\n\r\n"
        sender = threading.Thread(target=lambda: _send_quietly(sock, huge))
        sender.start()
        received = b""
        with contextlib.suppress(OSError):
            while chunk := sock.recv(65536):
                received += chunk
                if b"\r\n\r\n" in received and len(received) > 200:
                    break
        result["seconds"] = round(time.monotonic() - started, 2)
        result["status"] = _status(received) or "closed"
        sock.shutdown(socket.SHUT_RDWR)
        sender.join(60)


def _send_quietly(sock: socket.socket, data: bytes) -> None:
    with contextlib.suppress(OSError):
        sock.sendall(data)


def _huge_headers(service: ServiceProcess, count: int, size: int) -> dict[str, Any]:
    pid = service.pid_of("hot")  # the process serving requests, under tracker serve
    before = _peak_reset(pid)
    results: list[dict[str, Any]] = [{} for _ in range(count)]
    threads = [threading.Thread(target=_flood, args=(service, size, results[i])) for i in range(count)]
    for thread in threads:
        thread.start()
    latencies = []
    while any(thread.is_alive() for thread in threads):
        latencies.append(_healthz(service.url))
        time.sleep(0.05)
    for thread in threads:
        thread.join()
    return {"headers": count, "mib_each": size >> 20, "peak_growth_mib": round((_peak(pid) - before) / 1024, 1),
            "seconds_max": max(r.get("seconds", 0.0) for r in results),
            "statuses": sorted({str(r.get("status")) for r in results}),
            "healthz_max_ms": round(max(latencies, default=0.0) * 1e3, 1),
            "healthz_timeouts": sum(latency >= HEALTHZ_TIMEOUT for latency in latencies)}


def _attack(label: str, env: dict[str, str], quick: bool, timeout: float, root: Path) -> dict[str, Any]:
    service = ServiceProcess(root / label, env=env).start()
    try:
        half_open = _half_open(service, 500 if quick else 2000, give_up=(timeout or 10.0) + 10.0)
        one = _huge_headers(service, 1, 16 << 20)
        many = _huge_headers(service, 4, 16 << 20) if quick else _huge_headers(service, 10, 64 << 20)
        return {"half_open": half_open, "one_16mib": one, "many": many}
    finally:
        service.stop()


def run(quick: bool = False) -> dict[str, Any]:
    """Both configurations, one after the other; prints a table, returns the figures."""
    timeout = 2.0 if quick else 10.0
    figures: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-limits-") as tmp:
        configs = {"guarded": {"TRACKER_HEADER_TIMEOUT": str(timeout)},
                   "unguarded": {"TRACKER_MAX_HEADER_BYTES": "0", "TRACKER_HEADER_TIMEOUT": "0"}}
        for label, env in configs.items():
            figures[label] = _attack(label, {"TRACKER_DELTA": "0", **env}, quick, float(env["TRACKER_HEADER_TIMEOUT"]),
                                     Path(tmp))
    print(f"{'':10} {'half-open: healthz p50/max ms':>30} {'all closed after':>17} "
          f"{'16 MiB: s / status / peak MiB':>30} {'many: peak MiB / healthz max ms':>32}")
    for label, row in figures.items():
        h, one, many = row["half_open"], row["one_16mib"], row["many"]
        closed = f"{h['all_closed_after_s']} s" if h["all_closed_after_s"] is not None else \
            f"{h['still_open']} open at {h['watched_s']} s"
        print(f"{label:10} {h['healthz_p50_ms']:>17} / {h['healthz_max_ms']:<10} {closed:>17} "
              f"{one['seconds_max']:>12} / {one['statuses'][0]} / {one['peak_growth_mib']:<6} "
              f"{many['peak_growth_mib']:>17} / {many['healthz_max_ms']}")
    return {"name": "limits", "figures": figures, "targets": {
        "half_open_closed_within_timeout": figures["guarded"]["half_open"]["all_closed_after_s"] is not None,
        "one_16mib_peak_growth_under_8mib": figures["guarded"]["one_16mib"]["peak_growth_mib"] < 8}}
