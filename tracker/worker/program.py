"""``tracker run MODULE[:NAME]``: your own dataflow on worker processes against the service.

A *program* is a Python module (importable from the current directory or ``PYTHONPATH``) that
holds a :class:`~tracker.worker.vertex.Dataflow` under ``NAME`` (default ``flow``; a function
with no arguments returning one works too) and, if the dataflow has inputs, a driver
``async def drive(worker)`` that feeds this worker's share of them and closes them
(``examples/mine.py`` is one). :func:`run` registers the dataflow under its name, prints its id,
starts one process per worker (each runs :func:`worker_main`: the same module, its own
:class:`~tracker.worker.runtime.Worker`, a :class:`~tracker.worker.link.ServiceLink` and a
:class:`~tracker.worker.transport.Transport`), lets their output through, and ends with the
dataflow's state as the service sees it.

Guarantees: a program that cannot be loaded, a service that cannot be reached or refuses the
token fail before any process starts, with one line (:class:`ProgramError`,
:class:`~tracker.worker.client.ClientError`); a worker that fails says why in one line
(a timeout names what it still holds) and makes :func:`run` return 1.

>>> program = load_program("examples.mine")
>>> program.flow.name, [stage.name for stage in program.flow.stages], program.drive is not None
('mine', ['numbers', 'square', 'total'], True)
>>> load_program("examples.mine:nothing")  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
tracker.worker.program.ProgramError: module 'examples.mine' has no attribute 'nothing' (a Dataflow, ...)
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import inspect
import os
import subprocess
import sys
from dataclasses import dataclass
from typing import TextIO

from tracker.worker.client import Admin
from tracker.worker.cluster import free_ports
from tracker.worker.link import Link, LinkFailure, ServiceLink
from tracker.worker.runtime import Driver, Worker
from tracker.worker.transport import Transport
from tracker.worker.vertex import Dataflow, ProgressError


class ProgramError(Exception):
    """A one-line reason why ``MODULE[:NAME]`` is not a program (exit code 2)."""


@dataclass(frozen=True)
class Program:
    """A loaded program: where it came from, its dataflow and its driver (``None``: no inputs)."""

    spec: str
    flow: Dataflow
    drive: Driver | None


def load_program(spec: str) -> Program:
    """Import ``MODULE[:NAME]`` (the current directory first on the path) and find its dataflow
    and driver.

    Raises:
        ProgramError: the module does not import, has no such dataflow, or has inputs but no
            ``async def drive(worker)``.
    """
    module_name, _, attribute = spec.partition(":")
    attribute = attribute or "flow"
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ProgramError(f"cannot import {module_name!r}: {error} (run from the directory holding it, "
                           "or add it to PYTHONPATH)") from None
    found = getattr(module, attribute, None)
    if found is None:
        raise ProgramError(f"module {module_name!r} has no attribute {attribute!r} (a Dataflow, or a function "
                           "returning one)")
    flow = found() if callable(found) and not isinstance(found, Dataflow) else found
    if not isinstance(flow, Dataflow):
        raise ProgramError(f"{module_name}:{attribute} is a {type(flow).__name__}, not a Dataflow")
    drive = getattr(module, "drive", None)
    if drive is not None and not inspect.iscoroutinefunction(drive):
        raise ProgramError(f"{module_name}.drive must be 'async def drive(worker)'")
    if drive is None and any(stage.factory is None for stage in flow.stages):
        raise ProgramError(f"{module_name} declares inputs but no 'async def drive(worker)' to feed and close them")
    return Program(spec, flow, drive)


def run(program: Program, admin: Admin, workers: int, *, timeout: float = 120.0, link: str = "ws",
        out: TextIO = sys.stdout) -> int:
    """Register ``program``'s dataflow, run it on ``workers`` processes and wait for them.

    Returns:
        0 once every worker finished (the dataflow's frontiers are all empty), 1 if one failed.

    Raises:
        ClientError: the registration was refused.
    """
    flow = program.flow
    dataflow_id, token, endpoint = admin.enrol(flow.registration(workers))
    print(f"dataflow {flow.name} registered: id {dataflow_id}", file=out, flush=True)
    addresses = ",".join(f"127.0.0.1:{port}" for port in free_ports(workers))
    path = os.pathsep.join(p for p in (os.getcwd(), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path}
    processes = [subprocess.Popen(
        # --opt=value: a token may start with "-", which argparse would take for an option.
        [sys.executable, "-m", "tracker.cli", "run-worker", program.spec, f"--url={endpoint}",
         f"--dataflow={dataflow_id}", f"--token={token}", f"--index={index}", f"--addresses={addresses}",
         f"--timeout={timeout}", f"--link={link}"], env=env) for index in range(workers)]
    failed = []
    try:
        for index, process in enumerate(processes):
            if process.wait(timeout + 60) != 0:
                failed.append(index)
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait(10)
    state = admin.dataflow(dataflow_id)["status"]["state"]
    if failed:
        print(f"dataflow {flow.name} ({dataflow_id}): {state}; worker(s) {', '.join(map(str, failed))} failed",
              file=out, flush=True)
        return 1
    print(f"dataflow {flow.name} ({dataflow_id}): {state}", file=out, flush=True)
    return 0


async def host(program: Program, index: int, addresses: list[tuple[str, int]], url: str, dataflow: str,
               token: str, *, timeout: float = 120.0, link: str = "ws") -> dict[str, float]:
    """Run worker ``index`` of ``program`` in this process until the dataflow is finished; its
    statistics (see :meth:`Worker.run`)."""
    if link == "sse":
        from tracker.worker.sse_link import SseLink

        progress: Link = SseLink(url, dataflow, token, f"w{index}")
    else:
        progress = ServiceLink(url, dataflow, token, f"w{index}")
    transport = Transport(index, addresses)
    await transport.start()
    await transport.connect_all()
    worker = Worker(program.flow, index, len(addresses), progress, transport)
    return await worker.run(program.drive, timeout=timeout)


def worker_main(args: argparse.Namespace) -> int:
    """``tracker run-worker`` (started by :func:`run`): one worker; 1 with one line on failure."""
    addresses = [(host_, int(port)) for host_, port in (a.rsplit(":", 1) for a in args.addresses.split(","))]
    try:
        program = load_program(args.program)
        asyncio.run(host(program, args.index, addresses, args.url, args.dataflow, args.token,
                         timeout=args.timeout, link=args.link))
    except (ProgramError, TimeoutError, ProgressError, LinkFailure, OSError, RuntimeError) as error:
        text, prefix = str(error), f"worker {args.index}: "
        print(f"tracker run: {text if text.startswith(prefix) else prefix + text}", file=sys.stderr)
        return 1
    return 0
