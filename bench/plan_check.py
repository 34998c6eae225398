"""``tracker plan``'s predictions for the shards benchmark's own configurations, printed beside
what the benchmark measures (``python -m bench shards``, parts ``ingest`` and ``many``): the
event loop's and the shards' processes' CPU per batch at the rate each ingest run reached, and a
shard's resident memory for the many part's idle rings.

Performance belongs to benchmarks, so the comparison is a benchmark's output, not a test; the
test of the plan (``tests/test_plan.py``) checks its arithmetic and that its figures are the
documented ones.
"""

from __future__ import annotations

import os
from typing import Any

from bench.unit_costs import DATAFLOWS

INGEST_TOLERANCE = (0.5, 1.5)
"""How far the measured event loops' and processes' cores may be from the plan's (measured over
planned): the costs were measured at a lower load than the ingest's, on a shared machine."""
MEMORY_TOLERANCE = 0.25
"""How far a shard's measured resident memory may be from the plan's, as a share of the plan's."""


def compare_ingest(rates: dict[int, float], usage: dict[int, dict[str, float]]) -> dict[str, Any]:
    """``tracker plan`` for each ingest run's load (its dataflows, workers and batches, at the
    rate it reached, on this machine's cores): the event loop's and the processes' CPU per batch
    it plans beside those measured, and the rate it would promise on this machine, beside the
    rate reached."""
    from api.ops.capacity import Load, plan, promised_updates_per_second
    from bench.service import BATCH, OPERATORS

    cores = os.cpu_count() or 1
    found: dict[str, Any] = {}
    print(f"tracker plan for each ingest run's load (per batch; measured / planned, tolerance {INGEST_TOLERANCE}):")
    print(f"{'shards':>6} {'updates/s':>10} {'loop ms planned':>15} {'measured':>8} {'ratio':>5} "
          f"{'CPU ms planned':>14} {'measured':>8} {'ratio':>5} {'clients':>7} {'plan promises':>13}")
    for shards, rate in rates.items():
        p = plan(Load(dataflows=DATAFLOWS, workers_per_dataflow=2, batches_per_second=rate / BATCH / (2 * DATAFLOWS),
                      updates_per_batch=BATCH, operators=OPERATORS + 1, subscribers_per_dataflow=0, spark=False,
                      cores_per_host=cores))
        used = usage[shards]
        promises = promised_updates_per_second(p.load, shards, hosts=1)  # this many shards on this machine
        loop_ratio = used["loop_ms_per_batch"] / p.loop_ms_per_batch
        cpu_ratio = used["cpu_ms_per_batch"] / p.cpu_ms_per_batch
        found[str(shards)] = {
            "updates_per_s": round(rate), "loop_ms_planned": round(p.loop_ms_per_batch, 4),
            "loop_ms_measured": round(used["loop_ms_per_batch"], 4), "cpu_ms_planned": round(p.cpu_ms_per_batch, 4),
            "cpu_ms_measured": round(used["cpu_ms_per_batch"], 4), "client_cores": round(used["client_cores"], 3),
            "plan_promises_updates_per_s": round(promises),
            "loop_within": INGEST_TOLERANCE[0] <= loop_ratio <= INGEST_TOLERANCE[1],
            "cpu_within": INGEST_TOLERANCE[0] <= cpu_ratio <= INGEST_TOLERANCE[1]}
        print(f"{shards:>6} {rate:>10,.0f} {p.loop_ms_per_batch:>15.3f} {used['loop_ms_per_batch']:>8.3f} "
              f"{loop_ratio:>5.2f} {p.cpu_ms_per_batch:>14.3f} {used['cpu_ms_per_batch']:>8.3f} {cpu_ratio:>5.2f} "
              f"{used['client_cores']:>7.2f} {promises:>13,.0f}")
    return found


def compare_memory(per_shard: int, rss: dict[int, float], half: dict[int, float]) -> dict[str, Any]:
    """``tracker plan``'s memory per shard for the many part's idle rings, at half of them and at
    all of them, beside each shard's measured resident memory; and the base and the memory per
    location a line through the two measurements gives (what the plan's figures are made of)."""
    from api.ops.capacity import Load, plan
    from bench.service import OPERATORS

    locations = 2 * OPERATORS + 2
    found: dict[str, Any] = {}
    for label, count, measured in (("half", per_shard // 2, half), ("all", per_shard, rss)):
        p = plan(Load(dataflows=4 * count, workers_per_dataflow=1, batches_per_second=1, updates_per_batch=1,
                      operators=OPERATORS + 1, changes_per_batch=0, subscribers_per_dataflow=0, spark=False,
                      cores_per_host=8, memory_per_host_gib=4096))
        planned = p.memory_per_shard_mib
        worst = max(abs(v - planned) / planned for v in measured.values())
        print(f"tracker plan for {count:,} idle rings a shard: {planned:,.0f} MiB a shard; measured "
              f"{', '.join(f'{v:,.0f}' for v in measured.values())} MiB (at most {worst:.0%} apart; tolerance "
              f"{MEMORY_TOLERANCE:.0%})")
        found[label] = {"rings_per_shard": count, "planned_mib": round(planned),
                        "measured_mib": {str(k): v for k, v in measured.items()}, "worst_share_apart": round(worst, 3),
                        "within": worst <= MEMORY_TOLERANCE}
    # The line through the two sizes (each the shards' mean), per location of a ring.
    low, high = sum(half.values()) / len(half), sum(rss.values()) / len(rss)
    per_location_kib = (high - low) * 1024 / ((per_shard - per_shard // 2) * locations)
    found["fit"] = {"base_mib": round(low - per_shard // 2 * locations * per_location_kib / 1024),
                    "kib_per_location": round(per_location_kib, 3)}
    print(f"measured: {found['fit']['base_mib']} MiB a shard + {found['fit']['kib_per_location']} KiB per location")
    return found
