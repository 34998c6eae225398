"""workers: word count epochs per second on 1 and 3 worker processes, and time spent waiting on progress.

The real service (``tracker serve`` on a loopback port, Spark and Delta flushing off so they do
not compete for the 2 cores; the write-ahead log still syncs every acknowledged batch) and
real worker processes (``tracker worker``) running ``examples/wordcount.py``. Two modes:

* **streaming**: every worker pushes all epochs as fast as it can and the computation keeps up;
  epochs/s = epochs / the slowest worker's run time (process start-up excluded).
* **lockstep**: each worker waits (``Worker.probe``) until epoch ``e`` has cleared the sink
  before feeding ``e + 1``; epochs/s is then bounded by the progress round trip through the
  service (batch -> durable -> frontier change -> every worker).

Each configuration runs 3 times (once with ``--quick``); the table shows the best run's
figures and the median epochs/s. Waiting share = time the workers' schedulers sat idle while a
notification (or the end of the dataflow) waited for the frontier, over their run time; busy
share = time inside callbacks.
Every run's rows are checked against the sequential reference (a difference raises).

The sequential reference's own pace, the ceiling no amount of progress tracking reaches:

>>> _sequential({**wordcount.DEFAULTS, "epochs": 2}) > 0
True
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from api.run.process import ADMIN_TOKEN, ServiceProcess
from examples import wordcount
from tracker.worker.cluster import launch

TARGET_STREAMING_EPOCHS_PER_S = 20.0  # 3 workers, streaming: a floor well under what runs here


def _measure(service: ServiceProcess, workers: int, config: dict[str, Any], repeats: int) -> dict[str, float]:
    runs = []
    for _ in range(repeats):
        result = launch("wordcount", config, service.url, ADMIN_TOKEN, workers, timeout=120)
        if result["rows"] != wordcount.reference(config):
            raise AssertionError(f"{workers} workers: word count differs from the sequential reference")
        stats = result["stats"]
        # From the last worker's start (after the start barrier) to the last one's finish.
        wall = max(s["finished_at"] for s in stats) - max(s["started_at"] for s in stats)
        total = sum(s["wall_s"] for s in stats)
        runs.append({
            "epochs_per_s": config["epochs"] / wall,
            "wall_s": wall,
            "with_startup_s": result["wall_s"],
            "wait_progress_share": sum(s.get("wait_progress_s", 0.0) for s in stats) / total,
            "busy_share": sum(s.get("busy_s", 0.0) for s in stats) / total,
            "batches": sum(s.get("link_batches", 0) for s in stats),
            "callbacks": sum(s.get("callbacks", 0) for s in stats),
        })
    best = max(runs, key=lambda r: r["epochs_per_s"])
    return {**best, "median_epochs_per_s": statistics.median(r["epochs_per_s"] for r in runs)}


def _sequential(config: dict[str, Any]) -> float:
    started = time.perf_counter()
    wordcount.reference(config)
    return config["epochs"] / (time.perf_counter() - started)


def run(quick: bool = False) -> dict[str, Any]:
    """Measure both modes with 1 and 3 worker processes; print a table; return the figures."""
    epochs = 20 if quick else 150
    repeats = 1 if quick else 3
    base = {**wordcount.DEFAULTS, "epochs": epochs, "lines": 30, "words": 10}
    figures: dict[str, float] = {"sequential_epochs_per_s": round(_sequential(base), 1),
                                 "words_per_epoch": base["lines"] * base["words"]}
    with tempfile.TemporaryDirectory() as tmp:
        service = ServiceProcess(Path(tmp) / "warehouse", env={"TRACKER_DELTA": "0"}).start()
        try:
            print(f"{'mode':10} {'workers':>7} {'epochs':>6} {'epochs/s':>9} {'median':>7} {'run s':>7} "
                  f"{'+start s':>8} {'wait prog':>9} {'busy':>6} {'batches':>7}")
            for mode in ("streaming", "lockstep"):
                for workers in (1, 3):
                    config = {**base, "lockstep": mode == "lockstep"}
                    f = _measure(service, workers, config, repeats)
                    for key, value in f.items():
                        figures[f"{mode}.w{workers}.{key}"] = round(value, 4)
                    print(f"{mode:10} {workers:7d} {epochs:6d} {f['epochs_per_s']:9.1f} "
                          f"{f['median_epochs_per_s']:7.1f} {f['wall_s']:7.2f} "
                          f"{f['with_startup_s']:8.2f} {f['wait_progress_share']:9.0%} {f['busy_share']:6.0%} "
                          f"{f['batches']:7.0f}")
        finally:
            service.stop()
    print(f"sequential reference (one process, no progress tracking): {figures['sequential_epochs_per_s']:.0f} "
          f"epochs/s; {figures['words_per_epoch']:.0f} words per epoch")
    met = figures["streaming.w3.epochs_per_s"] >= TARGET_STREAMING_EPOCHS_PER_S
    return {"name": "workers", "figures": figures,
            "targets": {"streaming.w3.epochs_per_s": f">= {TARGET_STREAMING_EPOCHS_PER_S}", "met": met}}
