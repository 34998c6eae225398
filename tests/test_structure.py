"""The shape of the code: imports flow one way, and the worker SDK installs on its own.

Every project module's imports are read from its syntax tree (function-level imports and
``TYPE_CHECKING`` blocks included, since those hide cycles rather than remove them). Two rules:

* no cycle between project modules;
* no module imports from a layer above its own (:data:`LAYERS`, lowest first).
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("tracker", "api", "spark_jobs", "bench", "examples", "tests")

LAYERS: list[tuple[str, ...]] = [
    # The pure core: model, reference engine, oracle.
    ("tracker.timestamp", "tracker.antichain", "tracker.graph", "tracker.structure", "tracker.reachability",
     "tracker.oracle", "tracker.engine", "tracker.compiled", "tracker",
     # The `tracker` command's dispatcher: it finds the commands by entry point, importing none.
     "tracker.cli"),
    # Roles built on the core, independent of each other.
    ("tracker.worker", "spark_jobs", "examples"),
    # The service, which keeps its state in the Delta tables and runs Spark jobs. A progress
    # batch flows up these layers: parsed, ordered and applied (live state), logged
    # (durability), published, synced to Delta, handed to Spark; a lower layer tells a higher
    # one through a Protocol or a callback it defines itself.
    # Parse and models: request bodies, registration checks, settings, metrics.
    ("api.config", "api.models", "api.parsing", "api.bodies", "api.registration", "api.auth", "api.metrics",
     "api.columns", "api.limits",
     "api.explain", "api.scopes", "api.lifecycle"),
    # Live state: the frontier engine, versions, workers.
    ("api.live", "api.counts", "api.ages"),
    # Durability: typed log records, framing and segment names, the group-committed log.
    ("api.records", "api.segments", "api.syncer", "api.wal"),
    # Publication: the published frontier, its history, its subscribers.
    ("api.fanout", "api.publish", "api.rewind", "api.streams"),
    # Delta sync: tables, flush, compaction, log retirement, tidying, graph tables.
    ("api.store", "api.tidy", "api.sync", "api.graphs"),
    # Spark tasks: the session, registration checks, audits, micro-batches.
    ("api.spark", "api.checks", "api.audit", "api.microbatch"),
    # The service and its use cases.
    ("api.tenant", "api.lag", "api.ingest", "api.service"),
    # HTTP: dependencies, routes, the app, the command.
    ("api.deps", "api.routes", "api.ws", "api.dashboard", "api.security", "api.protocol", "api.app", "api.server",
     "api.commands", "api.watch", "api"),
    # Measurements.
    ("bench",),
    # The tests, above everything they test: nothing else may import them.
    ("tests",),
]
"""Layers, lowest first; a module belongs to the layer of its longest matching prefix."""


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            found[_module_name(path)] = path
    return found


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The project modules ``name`` imports (``from pkg import mod`` counts ``pkg.mod`` if a module)."""
    found: set[str] = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def _layer(module: str) -> int:
    best, level = -1, -1
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, level = len(prefix), index
    assert level >= 0, f"{module} belongs to no layer: add it to LAYERS"
    return level


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {name: _imports(name, path, known) for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in graph.get(node, ()):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycle_between_project_modules() -> None:
    graph = _graph()
    # A package's __init__ re-exporting its own modules is not a cycle a reader trips over.
    for name in list(graph):
        graph[name] = {t for t in graph[name] if not (name.startswith(t + ".") and t in graph)}
    assert _cycles(graph) == []


def test_no_module_imports_from_a_layer_above_its_own() -> None:
    upward = [f"{name} (layer {_layer(name)}) imports {target} (layer {_layer(target)})"
              for name, targets in sorted(_graph().items()) for target in sorted(targets)
              if _layer(target) > _layer(name)]
    assert upward == []


def test_the_walker_sees_hidden_imports(tmp_path: Path) -> None:
    """The checks above can fail: a function-level import and a TYPE_CHECKING import are found."""
    source = tmp_path / "m.py"
    source.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from api.app import x\n"
                      "def f():\n    from spark_jobs import session\n")
    assert _imports("tracker.m", source, {"api.app", "spark_jobs", "spark_jobs.session"}) == {
        "api.app", "spark_jobs.session"}
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]


@pytest.mark.slow
def test_a_worker_only_install_runs_a_vertex_without_spark_or_fastapi(tmp_path: Path) -> None:
    """``pip install .[worker]`` into an empty venv: the SDK imports and a dataflow runs to
    completion against an in-process tracker; neither pyspark nor fastapi is installed."""
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    # Built from a copy, so that setuptools' build directory does not land in the work tree.
    source = tmp_path / "src"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".venv", ".git", "build", "target", "warehouse",
                                                                 "*.egg-info", "__pycache__", "node_modules"))
    subprocess.run([str(python), "-m", "pip", "install", "-q", f"{source}[worker]"], check=True, env=env,
                   cwd=tmp_path, timeout=600)
    script = (
        "import importlib.util, asyncio\n"
        "assert importlib.util.find_spec('pyspark') is None and importlib.util.find_spec('fastapi') is None\n"
        "from tracker.reachability import Tracker\n"
        "from tracker.worker import Dataflow, LocalHub, Vertex, Worker\n"
        "seen = []\n"
        "class Sink(Vertex):\n"
        "    def on_recv(self, port, message, time):\n"
        "        seen.append((message, time)); self.notify_at(time)\n"
        "    def on_notify(self, time):\n"
        "        seen.append(('notify', time))\n"
        "flow = Dataflow('only-workers')\n"
        "source = flow.input('in')\n"
        "sink = flow.stage('sink', lambda index, peers: Sink(), inputs=1, outputs=0)\n"
        "flow.connect((source, 0), (sink, 0))\n"
        "async def main():\n"
        "    tracker = Tracker(flow.graph())\n"
        "    tracker.apply(flow.initial(1))\n"
        "    worker = Worker(flow, 0, 1, LocalHub(tracker).link('w0'))\n"
        "    async def drive(w):\n"
        "        handle = w.input(source)\n"
        "        handle.send('a'); handle.advance_to(1); handle.send('b'); handle.close()\n"
        "    await worker.run(drive, timeout=20)\n"
        "asyncio.run(main())\n"
        "print(seen)\n"
    )
    done = subprocess.run([str(python), "-c", script], capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    seen = ast.literal_eval(done.stdout.strip())
    assert sorted(seen) == [("a", (0,)), ("b", (1,)), ("notify", (0,)), ("notify", (1,))]
    assert seen.index(("notify", (0,))) > seen.index(("a", (0,)))
    assert seen.index(("notify", (1,))) > seen.index(("b", (1,)))
