"""timely_stats: the connector's own cost with its statistics off and on, in the program's CPU time.

``python -m bench timely`` gives every part of an attached program's cost, but on a shared
2-core machine its wall times swing by tens of per cent between identical runs, more than the
few per cent in question here. This benchmark measures only the connector's own share, which
needs no service: each example runs ``--logging-only`` (timely's logging on, into loggers that
do nothing), ``--without-service`` (the whole connector, every request answered at once) and the
same with the statistics every second and every 100 ms (``--statistics-ms``), one after the
other in a rotating order, many times. Each figure is the program's CPU time (user + system,
its sender threads included), which load inflates far less than wall time; the ratios are over
``--logging-only``, taken per repetition (each variant against the logging-only run next to it)
and then the median, with the spread (the lowest and highest) beside. Target: the connector's
own cost at most 1.05x, with the statistics off and on. Workloads run a few seconds each.

>>> paired({"logging": [2.0, 4.0, 2.0], "connector": [2.1, 4.4, 2.0]}, "connector")
(1.05, 1.0, 1.1)
"""

from __future__ import annotations

import os
import statistics
from typing import Any

from bench.timely import build, run_example

WORKLOADS = {
    "collatz": (["--rounds", "600", "--records", "1000"], ["--rounds", "200", "--records", "1000"]),
    "bfs": (["--rounds", "80", "--nodes", "50000", "--edges", "200000"],
            ["--rounds", "30", "--nodes", "50000", "--edges", "200000"]),
    "dd_bfs": (["--rounds", "40", "--nodes", "100000", "--edges", "400000", "--changes", "1000"],
               ["--rounds", "15", "--nodes", "100000", "--edges", "400000", "--changes", "1000"]),
}
VARIANTS = {
    "logging": ["--logging-only"],
    "connector": ["--without-service"],
    "statistics": ["--without-service", "--statistics-ms", "1000"],
    "statistics_100ms": ["--without-service", "--statistics-ms", "100"],
}


def paired(cpu: dict[str, list[float]], variant: str) -> tuple[float, float, float]:
    """``variant``'s CPU time over the logging-only run of the same repetition: the median, the
    lowest and the highest of those ratios."""
    ratios = [v / base for v, base in zip(cpu[variant], cpu["logging"], strict=True)]
    return round(statistics.median(ratios), 3), round(min(ratios), 3), round(max(ratios), 3)


def run(quick: bool) -> dict[str, Any]:
    """Measure, print a table, return the figures."""
    repetitions = 5 if quick else 9
    print("building the examples (release, feature bench) ...", flush=True)
    binaries = build(release=True, features=("bench",))
    figures: dict[str, Any] = {"load_average_before": os.getloadavg()[0]}
    order = list(VARIANTS)
    for example, workloads in WORKLOADS.items():
        args = workloads[1 if quick else 0]
        load = os.getloadavg()[0]
        cpu: dict[str, list[float]] = {v: [] for v in VARIANTS}
        wall: dict[str, list[float]] = {v: [] for v in VARIANTS}
        for repetition in range(repetitions):
            for variant in order[repetition % len(order):] + order[:repetition % len(order)]:
                # The service's address is never used: without it, every request is answered at once.
                one = run_example(binaries, example, ["-w", "4", *VARIANTS[variant], *args],
                                  url="http://127.0.0.1:9", token="unused")
                if one.returncode != 0:
                    raise RuntimeError(f"{example} ({variant}) failed: {one.stderr[-2000:]}")
                sent = "statistics reports" in one.stderr
                if sent != variant.startswith("statistics"):
                    raise RuntimeError(f"{example} ({variant}): statistics {'sent' if sent else 'not sent'}")
                cpu[variant].append(one.cpu_seconds)
                wall[variant].append(one.wall_seconds)
        figures[example] = {
            "workload": " ".join(args), "load_average": load,
            **{f"cpu_{v}_s": statistics.median(cpu[v]) for v in VARIANTS},
            **{f"wall_{v}_s": statistics.median(wall[v]) for v in VARIANTS},
            **{f"cpu_{v}_ratio": paired(cpu, v) for v in VARIANTS if v != "logging"}}
    figures["load_average_after"] = os.getloadavg()[0]
    print(f"timely_stats ({'quick' if quick else 'full'}): 4 workers, release build, {repetitions} runs of each "
          f"variant side by side; load average {figures['load_average_before']:.1f} before, "
          f"{figures['load_average_after']:.1f} after")
    print("program cpu s (median): logging only, connector, + statistics 1 s, + statistics 100 ms; ratios over "
          "logging only, per repetition: median (lowest-highest); target at most 1.05")
    for example in WORKLOADS:
        r = figures[example]
        ratios = "  ".join(f"{v} {r[f'cpu_{v}_ratio'][0]:.3f} ({r[f'cpu_{v}_ratio'][1]:.3f}-"
                           f"{r[f'cpu_{v}_ratio'][2]:.3f})" for v in VARIANTS if v != "logging")
        print(f"{example:8} load {r['load_average']:4.1f}  " + " ".join(f"{r[f'cpu_{v}_s']:6.2f}" for v in VARIANTS)
              + f"  {ratios}")
    return {"name": "timely_stats", "figures": figures, "targets": {"cpu_ratio": 1.05}}
