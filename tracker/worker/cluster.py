"""Running an example on several worker processes against a running service.

:func:`launch` registers the example's dataflow (with the program token, or the admin token),
starts ``workers`` processes (``tracker worker NAME ...``, i.e. :func:`worker_main`), each
hosting one vertex per stage and listening on its own loopback port for data from the others,
and merges the rows they print.
Every worker talks to the service over its own WebSocket (:class:`~tracker.worker.link.ServiceLink`).

An example is a module of the ``examples`` package; see ``examples/__init__.py`` for the
functions it provides. The guarantee :func:`launch` checks for ``tracker example --check``:
the rows the worker processes produce equal the example's sequential ``reference``.

>>> load_example("wordcount").build({}).name
'wordcount'
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from tracker.worker.client import Admin
from tracker.worker.link import Link, ServiceLink
from tracker.worker.runtime import Worker
from tracker.worker.transport import Transport

ROOT = Path(__file__).resolve().parents[2]  # the repository root, which holds `examples`
EXAMPLES = ("wordcount", "components", "digitroot")


def load_example(name: str) -> ModuleType:
    """The example module ``examples.<name>``.

    Raises:
        ValueError: ``name`` is not one of :data:`EXAMPLES`.
    """
    if name not in EXAMPLES:
        raise ValueError(f"unknown example {name!r}; choose from {', '.join(EXAMPLES)}")
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    return importlib.import_module(f"examples.{name}")


def free_ports(count: int) -> list[int]:
    """``count`` loopback TCP ports nobody listens on right now (for the workers' transports)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def launch(name: str, config: dict[str, Any], url: str, token: str, workers: int = 2, *,
           delay: float = 0.0, progress_delay: float = 0.0, seed: int = 0, trace_dir: Path | None = None,
           timeout: float = 120.0, service_url: str | list[str] | None = None, link: str = "ws",
           on_registered: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run example ``name`` on ``workers`` processes and wait until every one has finished.

    Args:
        config: overrides of the example's ``DEFAULTS``.
        url: the service, used to register (with ``token``: the program token, or the admin
            token; the workers get only the dataflow's own token).
        service_url: where workers reach the service, if not the dataflow's ``endpoint`` (its
            shard's base URL, from the registration's answer): one for all or one per worker (a
            proxy in tests).
        link: ``ws`` (one WebSocket per worker) or ``sse`` (POST + the SSE stream).
        delay, progress_delay, seed, trace_dir, timeout: passed to each ``tracker worker``.
        on_registered: told the dataflow's id once it is registered.

    Returns:
        ``{"rows", "stats", "dataflow", "wall_s"}``: the rows of every worker merged by epoch,
        each worker's statistics, the dataflow id and the wall time.

    Raises:
        RuntimeError: the registration was refused, or a worker failed (with its stderr).

    Example (against a running service)::

        result = launch("wordcount", {"epochs": 4}, "http://127.0.0.1:8000", program_token, workers=3)
        example = load_example("wordcount")
        assert result["rows"] == example.reference({**example.DEFAULTS, "epochs": 4})
    """
    example = load_example(name)
    config = {**example.DEFAULTS, **config}
    flow = example.build(config)
    flow.last_epoch = config["epochs"] - 1  # every example's input sends epochs 0 .. epochs - 1
    dataflow_id, dataflow_token, endpoint = Admin(url.rstrip("/"), token).enrol(flow.registration(workers))
    if on_registered is not None:
        on_registered(dataflow_id)
    addresses = ",".join(f"127.0.0.1:{p}" for p in free_ports(workers))
    urls = service_url if isinstance(service_url, list) else [service_url or endpoint] * workers
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    started = time.perf_counter()
    processes = []
    for index in range(workers):
        # --opt=value: a token may start with "-", which argparse would take for an option.
        command = [sys.executable, "-m", "tracker.cli", "worker", name, f"--url={urls[index]}",
                   f"--dataflow={dataflow_id}", f"--token={dataflow_token}", f"--index={index}",
                   f"--addresses={addresses}", f"--config={json.dumps(config)}", f"--delay={delay}",
                   f"--progress-delay={progress_delay}", f"--seed={seed * 1000 + index}", f"--timeout={timeout}",
                   f"--link={link}"]
        if trace_dir is not None:
            command += ["--trace", str(Path(trace_dir) / f"trace-{index}.jsonl")]
        processes.append(subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    outputs = []
    try:
        for index, process in enumerate(processes):
            out, err = process.communicate(timeout=timeout + 30)
            if process.returncode != 0:
                raise RuntimeError(f"worker {index} exited with {process.returncode}:\n{err.decode()[-3000:]}")
            outputs.append(json.loads(out.decode().strip().splitlines()[-1]))
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait(10)
    rows = sorted((row for o in outputs for row in o["rows"]), key=lambda r: r["epoch"])
    return {"rows": rows, "stats": [o["stats"] for o in outputs], "dataflow": dataflow_id,
            "wall_s": time.perf_counter() - started}


async def run_worker(name: str, config: dict[str, Any], index: int, addresses: list[tuple[str, int]], url: str,
                     dataflow: str, token: str, *, delay: float = 0.0, progress_delay: float = 0.0, seed: int = 0,
                     trace: list[tuple[Any, ...]] | None = None, timeout: float = 120.0, link: str = "ws"
                     ) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """Host worker ``index`` of example ``name`` in this process until the dataflow finishes;
    returns its rows and statistics."""
    example = load_example(name)
    if link == "sse":
        from tracker.worker.sse_link import SseLink

        progress: Link = SseLink(url, dataflow, token, f"w{index}")
    else:
        progress = ServiceLink(url, dataflow, token, f"w{index}", delay=progress_delay, seed=seed)
    transport = Transport(index, addresses, delay=delay, seed=seed)
    await transport.start()
    await transport.connect_all()
    worker = Worker(example.build(config), index, len(addresses), progress, transport, trace=trace)
    stats = await worker.run(lambda w: example.drive(w, config), timeout=timeout)
    return example.collect(worker), stats


def worker_main(args: argparse.Namespace) -> int:
    """``tracker worker``: run one worker process; prints ``{"rows", "stats"}`` as one JSON line."""
    addresses = [(host, int(port)) for host, port in (a.rsplit(":", 1) for a in args.addresses.split(","))]
    trace: list[tuple[Any, ...]] | None = [] if args.trace else None
    try:
        rows, stats = asyncio.run(run_worker(
            args.name, json.loads(args.config), args.index, addresses, args.url, args.dataflow, args.token,
            delay=args.delay, progress_delay=args.progress_delay, seed=args.seed, trace=trace, timeout=args.timeout,
            link=args.link))
    finally:
        if trace is not None:
            with open(args.trace, "w") as handle:
                for event in trace:
                    handle.write(json.dumps(event) + "\n")
    print(json.dumps({"rows": rows, "stats": stats}), flush=True)
    return 0


def example_main(args: argparse.Namespace, admin: Admin) -> int:
    """``tracker example``: register, run on ``--workers`` processes, print the dataflow's id and
    then the rows."""
    example = load_example(args.name)
    config = {**example.DEFAULTS, **{k: v for k, v in (("epochs", args.epochs), ("seed", args.seed)) if v is not None}}
    try:
        result = launch(args.name, config, admin.url, admin.token, args.workers, delay=args.delay,
                        timeout=args.timeout, link=args.link, on_registered=lambda dataflow_id: print(
                            f"dataflow {args.name} registered: id {dataflow_id}", flush=True))
    except RuntimeError as error:  # a worker failed: its last line says why
        lines = str(error).strip().splitlines()
        print(f"tracker example: error: {lines[0]}{' ' + lines[-1] if len(lines) > 1 else ''}", file=sys.stderr)
        return 1
    for line in example.render(result["rows"]):
        print(line)
    if args.stats:
        print(json.dumps({"wall_s": result["wall_s"], "workers": result["stats"]}, sort_keys=True))
    if args.check:
        if result["rows"] != example.reference(config):
            print("MISMATCH: the distributed result differs from the sequential reference", file=sys.stderr)
            return 1
        print(f"OK: {len(result['rows'])} epochs equal the sequential reference")
    return 0
