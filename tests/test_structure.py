"""The shape of the code: imports flow one way, each package of the service imports only what
its docstring says, no module grows long without a reason, and the worker SDK installs on its
own.

Every project module's imports are read from its syntax tree (function-level imports and
``TYPE_CHECKING`` blocks included, since those hide cycles rather than remove them). The rules:

* no cycle between project modules;
* no module imports from a layer above its own (:data:`LAYERS`, lowest first);
* every package of the service (``api/<package>/``) opens with a docstring whose "May import:"
  line lists what it may import besides itself (project packages, and the frameworks of
  :data:`GUARDED`); its modules import nothing else, so the folder shows the architecture;
* no project module is over :data:`LONG` lines unless its docstring says why
  (``Long because: ...``).
"""

from __future__ import annotations

import ast
import os
import re
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
    # The service; inside it, the packages' own rules (their docstrings) say what imports what.
    ("api",),
    # Measurements.
    ("bench",),
    # The tests, above everything they test: nothing else may import them.
    ("tests",),
]
"""Layers, lowest first; a module belongs to the layer of its longest matching prefix."""

GUARDED = ("fastapi", "starlette", "sse_starlette", "uvicorn", "pydantic", "pyspark", "duckdb")
"""Frameworks a service package may import only if its docstring lists them (DuckDB: only the SQL
package runs queries, so no other package can open a connection without its limits)."""

LONG = 400
"""Lines past which a module must say why it is long."""


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
    source.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from api.web.app import x\n"
                      "def f():\n    from spark_jobs import session\n")
    assert _imports("tracker.m", source, {"api.web.app", "spark_jobs", "spark_jobs.session"}) == {
        "api.web.app", "spark_jobs.session"}
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


def _third_party(path: Path) -> set[str]:
    """The top-level names of the :data:`GUARDED` frameworks ``path`` imports."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                 else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
        found |= {n.split(".")[0] for n in names if n.split(".")[0] in GUARDED}
    return found


def _may_import(package: Path) -> set[str]:
    """The "May import:" line of a package's docstring, as a set of names (it may wrap)."""
    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
    found = re.search(r"May import:(.*?)(?:\n\n|$)", doc, re.S)
    assert found, f"{package.relative_to(ROOT)}/__init__.py: its docstring has no 'May import:' line"
    return {name.strip(" .") for name in found.group(1).replace("\n", " ").split(",") if name.strip(" .")}


def _service_packages() -> list[Path]:
    return sorted(p for p in (ROOT / "api").iterdir() if (p / "__init__.py").exists())


def _allowed(target: str, allowed: set[str]) -> bool:
    return any(target == a or target.startswith(a + ".") for a in allowed)


def test_each_service_package_imports_only_what_its_docstring_says() -> None:
    graph, modules = _graph(), _modules()
    breaches = []
    for package in _service_packages():
        own = f"api.{package.name}"
        allowed = _may_import(package) | {own}
        for name in sorted(m for m in modules if m == own or m.startswith(own + ".")):
            breaches += [f"{name} imports {t}" for t in sorted(graph[name]) if not _allowed(t, allowed)]
            breaches += [f"{name} imports {f}" for f in sorted(_third_party(modules[name])) if f not in allowed]
    assert breaches == []


def test_the_service_packages_form_layers_and_the_top_docstring_names_each() -> None:
    """The packages' rules have no cycle (else they would not be layers), and ``api/__init__``'s
    table names every package, so a newcomer's map is complete."""
    rules = {f"api.{p.name}": {a for a in _may_import(p) if a.startswith("api.")} for p in _service_packages()}
    assert _cycles(rules) == []
    top = ast.get_docstring(ast.parse((ROOT / "api" / "__init__.py").read_text())) or ""
    listed = {line.split()[0] for line in top.splitlines() if line[:1].isalpha() and line.split()[0].islower()}
    assert {p.name for p in _service_packages()} <= listed


def test_only_the_spark_process_may_import_spark() -> None:
    """The hot path holds no JVM gateway: no package but ``api.spark`` (the Spark process's) may
    import pyspark or ``api.spark`` (the running hot-path process's ``sys.modules`` is checked in
    ``tests/test_api_spark.py``)."""
    allowed = {p.name: _may_import(p) for p in _service_packages()}
    assert "pyspark" in allowed["spark"]
    assert [name for name, may in allowed.items() if name != "spark" and {"pyspark", "api.spark"} & may] == []


def test_no_module_is_long_without_saying_why() -> None:
    long = [f"{name} ({n} lines)" for name, path in sorted(_modules().items())
            if not name.startswith("tests") and (n := len(path.read_text().splitlines())) > LONG
            and "Long because:" not in (ast.get_docstring(ast.parse(path.read_text())) or "")]
    assert long == []


def test_the_package_rules_can_fail(tmp_path: Path) -> None:
    """A guarded framework is found, and a "May import:" line is read across its wrapping."""
    (tmp_path / "m.py").write_text("import fastapi.responses\nfrom pydantic import BaseModel\nimport json\n")
    assert _third_party(tmp_path / "m.py") == {"fastapi", "pydantic"}
    (tmp_path / "__init__.py").write_text('"""Owns x.\n\nMay import: api.schema,\napi.live, tracker.\n"""\n')
    assert _may_import(tmp_path) == {"api.schema", "api.live", "tracker"}
    assert not _allowed("api.livestock", {"api.live"}) and _allowed("api.live.state", {"api.live"})
