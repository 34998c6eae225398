"""The manual (``docs/*.md`` and the README) against itself and the code: every pointer into it
lands on a section that exists, every setting and option of ``tracker serve`` is in the settings
table, every route is in the reference, and the code layout names every package and module.

A pointer is a page and a section's title in quotes, the form the whole repository uses in
prose, docstrings, comments and help texts: `` `docs/running.md`, "Shards" ``,
`` `docs/running.md` ("Metrics and logs") ``, `` ("Damage" in `docs/durability.md`) ``. A bare
``see "Shards"`` (or ``under``, ``in``, or ``("Shards")``) inside a page means a section of that
same page. A section is a heading or a bold lead-in (``**Lifecycle.**``, ``* **Damage**``); a
pointer may leave out a heading's subtitle (``"SQL"`` for ``## SQL: `tracker sql` ...``) but
nothing else.
"""

from __future__ import annotations

import argparse
import ast
import re
from collections.abc import Iterator
from pathlib import Path

from tests.helpers import ROOT

SOURCES = ["api", "tracker", "spark_jobs", "bench", "tests", "docs", "docker", "bin", "ops", "examples",
           "engine/src", "connectors/timely/src", "connectors/timely/examples"]
"""Where pointers into the manual may be written, besides the files at the top level."""
SUFFIXES = {".py", ".md", ".yml", ".yaml", ".cfg", ".sh", ".js", ".html", ".rs", ".toml", ".java", ""}
SKIPPED = {".venv", "target", "node_modules", "vendor", "__pycache__"}
JOURNAL = ROOT / "bench" / "HISTORY.md"
"""Kept out: a journal quotes what the manual said when each run was made."""

PAGE = r"(?P<page>(?:docs/[a-z_]+|README|bench/HISTORY)\.md)"
QUOTED = r'\\?"(?P<section>[^"\\]+)\\?"'
POINTERS = [
    re.compile(rf'(?<!["\w/]){PAGE}`*(?:,\s*|\s*\(|\s+){QUOTED}'),  # `docs/x.md`, "Section" / docs/x.md ("Section")
    re.compile(rf'{QUOTED}\s+in\s+`*{PAGE}'),  # "Section" in `docs/x.md`
]
BARE = re.compile(r'(?<![`\w])(?:[Ss]ee|under|in)\s+"(?P<section>[A-Z][^"]*)"|\("(?P<paren>[A-Z][^"]*)"\)')
NOT_SECTIONS = {"Held back by"}
"""Quoted after "under" but not a section: the dashboard's column of that name."""


def source_files() -> Iterator[Path]:
    """Every file of the repository that may point into the manual."""
    yield from (path for path in ROOT.iterdir() if path.is_file() and path.suffix in SUFFIXES)
    for top in SOURCES:
        for path in (ROOT / top).rglob("*"):
            if (path.is_file() and path.suffix in SUFFIXES and path not in (JOURNAL, Path(__file__))
                    and not SKIPPED & set(path.relative_to(ROOT).parts)):
                yield path


def prose(text: str) -> str:
    """Markdown without its fenced blocks, every run of white space one space."""
    return re.sub(r"\s+", " ", re.sub(r"^```.*?^```", "", text, flags=re.S | re.M))


def sections(page: Path) -> set[str]:
    """The titles of a page's headings and bold lead-ins."""
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
    found = {m.group(1).strip() for m in re.finditer(r"^#+ (.+)$", text, re.M)}
    found |= {m.group(1).strip().rstrip(".:") for m in re.finditer(r"^\s*(?:[*-]\s+)?\*\*([^*]+)\*\*", text, re.M)}
    return found


def has_section(titles: set[str], wanted: str) -> bool:
    """Whether ``wanted`` is one of ``titles``, or one of them without its subtitle."""
    return any(title == wanted or re.match(re.escape(wanted) + r"(:| \()", title) for title in titles)


def pointers(text: str) -> Iterator[tuple[str, str]]:
    """(page, section) of every pointer in ``text``, which may wrap, in a comment too."""
    flat = re.sub(r"\s*\n\s*(?:#+|//+)?\s*|\s+", " ", text)
    for pattern in POINTERS:
        for m in pattern.finditer(flat):
            yield m.group("page"), m.group("section").strip()


def test_every_pointer_into_the_manual_lands_on_a_section() -> None:
    titles = {page: sections(page) for page in [*(ROOT / "docs").glob("*.md"), ROOT / "README.md", JOURNAL]}
    wrong, seen = [], 0
    for path in source_files():
        for page, section in pointers(path.read_text(errors="replace")):
            seen += 1
            target = ROOT / page
            if target not in titles:
                wrong.append(f"{path.relative_to(ROOT)}: {page} does not exist")
            elif not has_section(titles[target], section):
                wrong.append(f"{path.relative_to(ROOT)}: {page} has no section {section!r}")
    assert seen > 50, "the pointers' pattern finds (almost) nothing: it no longer matches how they are written"
    assert not wrong, "\n".join(wrong)


def test_every_page_named_exists() -> None:
    wrong = sorted({f"{path.relative_to(ROOT)}: {m.group(0)}" for path in source_files()
                    for m in re.finditer(r"(?<![\w/.-])docs/[a-z_]+\.md", path.read_text(errors="replace"))
                    if not (ROOT / m.group(0)).is_file()})
    assert not wrong, "\n".join(wrong)


def test_a_bare_pointer_lands_on_its_own_page() -> None:
    wrong = []
    for page in [*(ROOT / "docs").glob("*.md"), ROOT / "README.md"]:
        text = prose(page.read_text())
        for pattern in POINTERS:  # pointers naming a page are the first test's
            text = pattern.sub("", text)
        titles = sections(page)
        for m in BARE.finditer(text):
            wanted = m.group("section") or m.group("paren")
            if wanted not in NOT_SECTIONS and not has_section(titles, wanted):
                wrong.append(f"{page.relative_to(ROOT)}: no section {wanted!r} here ({m.group(0)})")
    assert not wrong, "\n".join(wrong)


def settings_table() -> str:
    """The rows of docs/running.md's table of options and settings."""
    section = (ROOT / "docs" / "running.md").read_text().split("\n## Running it\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ")]
    assert len(rows) > 30, "docs/running.md lost its settings table"
    return "\n".join(rows)


def test_every_setting_and_option_of_tracker_serve_is_in_the_settings_table() -> None:
    from api.run.commands import add_commands

    table = settings_table()
    config = (ROOT / "api" / "config.py").read_text()
    variables = set(re.findall(r'"((?:TRACKER|SPARK)_[A-Z_]+)"', config))
    assert {"TRACKER_WAREHOUSE", "SPARK_MASTER", "TRACKER_SQL_QUERIES"} <= variables
    parser = argparse.ArgumentParser()
    add_commands(parser.add_subparsers())
    serve = next(action for action in parser._actions if isinstance(action, argparse._SubParsersAction))
    options = {flag for action in serve.choices["serve"]._actions for flag in action.option_strings
               if flag.startswith("--") and flag != "--help"}
    assert {"--shards", "--max-dataflows", "--spark-nice"} <= options
    documented = set(re.findall(r"`((?:--|TRACKER_|SPARK_)[\w-]+)`", table))
    assert not variables - documented, f"settings missing from docs/running.md: {sorted(variables - documented)}"
    assert not options - documented, f"options missing from docs/running.md: {sorted(options - documented)}"
    assert not documented - variables - options, f"documented but unknown: {sorted(documented - variables - options)}"


def routes() -> Iterator[tuple[str, str]]:
    """(method, path) of every route the service's web modules declare for its OpenAPI document."""
    for module in sorted((ROOT / "api" / "web").glob("*.py")):
        tree = ast.parse(module.read_text())
        prefixes = {target.id: str(keyword.value.value)
                    for node in ast.walk(tree) if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
                    for target in node.targets if isinstance(target, ast.Name)
                    for keyword in node.value.keywords
                    if keyword.arg == "prefix" and isinstance(keyword.value, ast.Constant)}
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for decorator in node.decorator_list:
                if not (isinstance(decorator, ast.Call) and isinstance(decorator.func, ast.Attribute)
                        and isinstance(decorator.func.value, ast.Name) and decorator.args
                        and isinstance(decorator.args[0], ast.Constant)):
                    continue
                method = decorator.func.attr
                hidden = any(k.arg == "include_in_schema" and isinstance(k.value, ast.Constant) and not k.value.value
                             for k in decorator.keywords)
                if method in ("get", "post", "delete", "put", "patch", "websocket") and not hidden:
                    path = prefixes.get(decorator.func.value.id, "") + str(decorator.args[0].value)
                    yield ("WS" if method == "websocket" else method.upper()), path


def test_every_route_is_in_the_reference() -> None:
    reference = (ROOT / "docs" / "reference.md").read_text()
    found = set(routes())
    assert {("GET", "/healthz"), ("WS", "/v1/dataflows/{id}/ws"), ("POST", "/v1/sql")} <= found
    missing = []
    for method, path in sorted(found):
        short = path.replace("/v1/dataflows/{id}/", ".../", 1)
        if not re.search(rf"`{method} ({re.escape(path)}|{re.escape(short)})[`?, ]", reference):
            missing.append(f"{method} {path}")
    assert not missing, f"routes missing from docs/reference.md: {missing}"


def test_the_code_layout_names_every_package_and_module() -> None:
    text = (ROOT / "docs" / "service.md").read_text().split("\n## Code layout\n", 1)[1].split("\n## ", 1)[0]
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^\| `(\w+)/` \| .*? \| (.*) \|$", text, re.M)}
    packages = {path.parent.name: path.parent for path in (ROOT / "api").glob("*/__init__.py")}
    assert set(rows) == set(packages), "docs/service.md's code layout and api/'s packages differ"
    missing = [f"{name}/{module.stem}" for name, package in sorted(packages.items())
               for module in sorted(package.glob("*.py"))
               if module.stem != "__init__" and not re.search(rf"`{module.stem}`", rows[name])]
    assert not missing, f"modules missing from docs/service.md's code layout: {missing}"
