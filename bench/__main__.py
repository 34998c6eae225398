"""``python -m bench`` lists the benchmarks; ``python -m bench NAME [--quick] [--sizes ...] [--parts ...]
[--seed N] [--minutes M]`` runs one (``--sizes``/``--parts``/``--seed``/``--minutes`` for the benchmarks
whose ``run`` takes ``sizes``/``parts``/``seed``/``minutes``).

A benchmark is a module ``bench/NAME.py`` with ``run(quick: bool) -> dict`` that prints a
readable table and returns ``{"name": ..., "figures": {...}, "targets": {...}}``; this runner
prints that dict as the last line, as one JSON object, so runs can be compared over time.
Importing a benchmark module starts nothing (no service, no Spark session): only ``run`` does.
The package's docstring (``bench/__init__.py``) shows the listing.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import pkgutil
import sys
from pathlib import Path
from typing import Any

_NOT_BENCHMARKS = {"__main__", "workloads", "spark_workloads", "watcher"}


def available() -> dict[str, str]:
    """Benchmark names and the first line of each one's docstring."""
    found: dict[str, str] = {}
    for info in pkgutil.iter_modules([str(Path(__file__).parent)]):
        if info.name.startswith("_") or info.name in _NOT_BENCHMARKS:
            continue
        module = importlib.import_module(f"bench.{info.name}")
        if callable(getattr(module, "run", None)):
            found[info.name] = (module.__doc__ or "").strip().splitlines()[0] if module.__doc__ else ""
    return found


def main(argv: list[str] | None = None) -> int:
    """``python -m bench [NAME] [--quick] [options]``: list the benchmarks, or run one; the exit code."""
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("name", nargs="?", help="benchmark to run; omit to list them")
    parser.add_argument("--quick", action="store_true", help="a short run (smaller workloads, fewer repetitions)")
    parser.add_argument("--sizes", default=None,
                        help="comma-separated workload sizes, for the benchmarks that take them (spark: 1k,10k,100k)")
    parser.add_argument("--parts", default=None,
                        help="comma-separated parts to run, for the benchmarks that have them (spark: core,engines,"
                             "jobs,cluster; isolation: its scenarios)")
    parser.add_argument("--seed", type=int, default=None, help="the random choices' seed, for the benchmarks that "
                                                                "make them (chaos; printed when not given)")
    parser.add_argument("--minutes", type=float, default=None, help="how long to run, for the benchmarks that run "
                                                                    "for a time (chaos)")
    args = parser.parse_args(argv)
    benchmarks = available()
    if not args.name:
        width = max(map(len, benchmarks))
        for name, summary in sorted(benchmarks.items()):
            print(f"{name:{width}} {summary}")
        return 0
    if args.name not in benchmarks:
        print(f"unknown benchmark {args.name!r}; available: {', '.join(sorted(benchmarks))}", file=sys.stderr)
        return 2
    run = importlib.import_module(f"bench.{args.name}").run
    options: dict[str, Any] = {name: getattr(args, name).split(",") for name in ("sizes", "parts")
                               if getattr(args, name)}
    options.update({name: getattr(args, name) for name in ("seed", "minutes") if getattr(args, name) is not None})
    unknown = [f"--{name}" for name in options if name not in inspect.signature(run).parameters]
    if unknown:
        print(f"benchmark {args.name!r} takes no {', '.join(unknown)}", file=sys.stderr)
        return 2
    result = run(quick=args.quick, **options)
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
