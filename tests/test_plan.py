"""``tracker plan``: its arithmetic, its measured figures (each the one docs/operations.md lists,
and, where the service manual reports the same measurement, the one it reports), its answers for
the shards benchmark's configurations against that benchmark's documented measurements, internet
scale, and bad input refused in one line.

No timing here: the plan's predictions beside fresh measurements are ``python -m bench shards``'s
output (``bench/plan_check.py``).
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from api.ops import capacity
from api.ops.capacity import FIGURES, Load, plan, promised_updates_per_second
from tests.helpers import ROOT

RING = Load(dataflows=4, workers_per_dataflow=2, batches_per_second=1, updates_per_batch=128, operators=101,
            subscribers_per_dataflow=0, spark=False)
"""The shards benchmark's ingest: 4 rings of 100 operators and an input (202 locations), two
workers each, batches of 128 updates, workers not subscribed."""


def doc(name: str) -> str:
    return (ROOT / "docs" / name).read_text()


def figure_rows() -> dict[str, list[str]]:
    """docs/operations.md's table of measured figures: constant -> its cells."""
    section = doc("operations.md").split("## Capacity planning", 1)[1]
    rows = re.findall(r"^\| `([A-Z_]+)` \| (.*) \|$", section, re.M)
    return {name: [cell.strip() for cell in rest.split(" | ")] for name, rest in rows}


def test_every_figure_is_the_documented_one() -> None:
    rows = figure_rows()
    assert set(rows) == set(FIGURES), "docs/operations.md's figures and api/ops/capacity.py's differ"
    for name, measured in FIGURES.items():
        value, what, bench = rows[name]
        assert value == str(measured), name
        assert what == measured.what, name
        assert bench == f"`{measured.bench}`", name
        assert measured.bench.startswith("python -m bench "), name


def test_figures_the_service_manual_reports_are_the_same() -> None:
    """Where docs/performance.md, docs/durability.md or docs/tables.md report the measurement a
    figure comes from, it is that one."""
    performance, durability, tables = doc("performance.md"), doc("durability.md"), doc("tables.md")
    assert re.search(rf"\| registrations per second through the front \| "
                     rf"{capacity.REGISTRATIONS_PER_SECOND.value:g} \|", performance)
    assert re.search(rf"about {capacity.LOG_HEADER_BYTES_PER_LOCATION.value:g} bytes per\s+location", durability)
    assert f"took {capacity.SPARK_BUSY_CORES.value:g} of the machine's 2 cores" in performance
    assert f"{capacity.SPARK_CHECK_SECONDS.value:g} s on a quiet machine" in tables
    assert re.search(rf"\| propagation, 1,026 locations: GraphX helper / DataFrame path \(84 rounds\) \| "
                     rf"{capacity.SPARK_AUDIT_SECONDS.value:.2f} s \|", tables)
    # The many part's shards of 2,500 rings (202 locations each), as docs/performance.md reports them.
    shard = re.search(r"resident memory per shard \(2,500 dataflows each\) \| ([\d,]+) /", performance)
    assert shard
    planned = capacity.BASE_RSS_MIB.value + 2500 * 202 * capacity.MEMORY_KIB_PER_LOCATION.value / 1024
    assert planned == pytest.approx(int(shard.group(1).replace(",", "")), rel=0.1)


def test_the_shards_benchmark_configuration() -> None:
    """The ingest the shards benchmark measured on one shard of this machine (docs/performance.md) is
    more than the plan promises there (its event loop at 70%, the host's cores at 70%), and not
    several times more; the plan lays the many part's 10,000 idle rings on its 4 shards, each
    with the memory measured there within 25%."""
    measured = re.search(r"\| ingest, updates/s \(ratio to 1 shard\) \| ([\d,]+) \(1\.00\)", doc("performance.md"))
    assert measured
    ingest = int(measured.group(1).replace(",", ""))
    promised = promised_updates_per_second(RING, shards=1)
    assert promised <= ingest <= 3 * promised, (promised, ingest)
    idle = plan(Load(dataflows=10_000, workers_per_dataflow=1, batches_per_second=1e-6, updates_per_batch=1,
                     operators=101, changes_per_batch=0, subscribers_per_dataflow=0, spark=False, cores_per_host=8,
                     memory_per_host_gib=4096))
    assert idle.shards == 4 and idle.dataflows_per_shard == 2500
    shard = re.search(r"resident memory per shard \(2,500 dataflows each\) \| ([\d,]+) /", doc("performance.md"))
    assert shard and idle.memory_per_shard_mib == pytest.approx(int(shard.group(1).replace(",", "")), rel=0.25)


def test_the_arithmetic_of_a_small_load() -> None:
    load = Load(dataflows=10, workers_per_dataflow=3, batches_per_second=4, updates_per_batch=100, operators=50,
                spark=False, cores_per_host=4, memory_per_host_gib=16)
    p = plan(load)
    assert (p.locations_per_dataflow, p.changes_per_batch, p.subscribers_per_dataflow) == (100, 100, 3)
    assert p.batches_per_second == 120 and p.updates_per_second == 12_000
    loop = (capacity.LOOP_MS_PER_BATCH.value + (100 * capacity.LOOP_US_PER_UPDATE.value
                                                + 100 * capacity.LOOP_US_PER_CHANGE.value
                                                + 3 * capacity.LOOP_US_PER_SUBSCRIBER.value) / 1e3)
    assert p.loop_ms_per_batch == pytest.approx(loop)
    assert p.loop_cores == pytest.approx(120 * loop / 1e3)
    # Two shards per 4-core host; one host is enough for this load.
    assert (p.hosts, p.shards, p.dataflows_per_shard) == (1, 2, 5)
    # A busy dataflow's history: 100,000 versions of 100 changes, at most ten a version: 1,000,000.
    history = 1_000_000 * capacity.HISTORY_BYTES_PER_CHANGE.value / 2**20
    assert p.history_mib_per_dataflow == pytest.approx(history)
    assert p.memory_per_shard_mib == pytest.approx(
        capacity.BASE_RSS_MIB.value + 5 * (100 * capacity.MEMORY_KIB_PER_LOCATION.value / 1024 + history))
    assert p.log_bytes_per_day == pytest.approx(
        120 * 86_400 * (capacity.LOG_BYTES_PER_BATCH.value + 100 * capacity.LOG_BYTES_PER_UPDATE.value))
    # Every dataflow sends 12 batches a second: a progress file each flush (1 s), a
    # frontier_changes file and a snapshot of 100 locations each compaction (5 s).
    files = 10 * 86_400 + 10 * 86_400 / 5
    rows = 120 * 86_400 * (100 * capacity.PROGRESS_BYTES_PER_ROW.value + 100 * capacity.CHANGES_BYTES_PER_ROW.value)
    snapshots = 10 * 86_400 / 5 * 100 * capacity.SNAPSHOT_BYTES_PER_LOCATION.value
    assert p.delta_bytes_per_day == pytest.approx(rows + files * capacity.FILE_BYTES.value + snapshots)
    assert p.delta_bytes_held == pytest.approx(rows * 8 + files * capacity.FILE_BYTES.value + snapshots)
    assert p.log_bytes_held == 2 * 2 * 64 * 2**20
    assert p.settings == {} and p.fronts == 1 and p.spark_processes == 0
    # A shorter history: a tenth of the versions, a tenth of the memory it holds.
    assert plan(replace(load, history=10_000)).history_mib_per_dataflow == pytest.approx(history / 10)
    # Few changes a batch: the history holds every change of its versions.
    assert plan(replace(load, changes_per_batch=4)).history_mib_per_dataflow == pytest.approx(
        400_000 * capacity.HISTORY_BYTES_PER_CHANGE.value / 2**20)


def test_spark_audits_and_big_graphs() -> None:
    load = Load(dataflows=3000, workers_per_dataflow=1, batches_per_second=0.1, updates_per_batch=10, operators=20,
                cores_per_host=16, memory_per_host_gib=256)
    p = plan(load)
    assert p.spark_processes == pytest.approx(3000 * capacity.SPARK_AUDIT_SECONDS.value / 60)
    assert p.binding == ["spark audits"] and p.hosts == math.ceil(p.spark_processes)
    assert any("TRACKER_AUDIT_SECONDS=" in n for n in p.notes)
    slower = plan(replace(load, audit_seconds=3600))
    assert slower.hosts < p.hosts and "spark audits" not in slower.binding
    off = plan(replace(load, spark=False))
    assert off.spark_processes == 0 and off.spark_cores == 0 and off.hosts < p.hosts
    big = plan(replace(load, operators=5000))  # 10,000 locations: over TRACKER_SPARK_MAX_LOCATIONS
    assert big.spark_processes == 0 and any("neither checks nor audits" in n for n in big.notes)


def test_internet_scale() -> None:
    """A million workers: 100,000 dataflows of 10 workers, ten batches a second each. The numbers
    stay finite and in their units, the plan needs several fronts and says so, and the settings
    the service would refuse it with are named."""
    load = Load(dataflows=100_000, workers_per_dataflow=10, batches_per_second=10, updates_per_batch=100,
                operators=100, cores_per_host=64, memory_per_host_gib=512, spark=False)
    p = plan(load)
    assert p.batches_per_second == 10_000_000 and p.binding == ["event loop"]
    assert p.shards > capacity.SHARDS_PER_FRONT and p.fronts == math.ceil(p.shards / capacity.SHARDS_PER_FRONT)
    assert any("services, each with its own front" in n for n in p.notes)
    assert p.hosts * 32 == p.shards and p.dataflows_per_shard * p.shards >= 100_000
    values = json.loads(json.dumps(p.as_json()))
    assert all(math.isfinite(v) for v in numbers(values))
    assert p.memory_total_gib < 512 * p.hosts
    # One dataflow with the million workers: its batches cannot fit one shard, and it says so.
    one = plan(replace(load, dataflows=1, workers_per_dataflow=1_000_000))
    assert any("one dataflow's batches need" in n for n in one.notes)
    # The largest input accepted still plans, in exact integers where it counts.
    huge = plan(Load(10**9, 10**9, 10**6, 10**7, 10**7, cores_per_host=100_000, memory_per_host_gib=10**7))
    assert isinstance(huge.shards, int) and huge.shards > 10**20 and huge.fronts > 10**17


def numbers(value: Any) -> list[float]:
    if isinstance(value, bool):
        return []
    if isinstance(value, int | float):
        return [float(value)]
    if isinstance(value, dict):
        return [n for v in value.values() for n in numbers(v)]
    if isinstance(value, list):
        return [n for v in value for n in numbers(v)]
    return []


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 10**6), st.integers(1, 1000), st.floats(0.01, 1000), st.integers(1, 10_000),
       st.integers(1, 5000), st.booleans(), st.integers(1, 10))
def test_more_load_never_needs_fewer_hosts(dataflows: int, workers: int, rate: float, updates: int, operators: int,
                                           spark: bool, factor: int) -> None:
    load = Load(dataflows, workers, rate, updates, operators, spark=spark, cores_per_host=16, memory_per_host_gib=128)
    p = plan(load)
    assert p.hosts >= 1 and p.shards >= p.hosts and p.binding
    assert p.hosts == max(1, math.ceil(max(p.hosts_needed.values())))
    for more in (replace(load, dataflows=dataflows * factor), replace(load, batches_per_second=rate * factor),
                 replace(load, updates_per_batch=updates * factor)):
        bigger = plan(more)
        assert bigger.hosts >= p.hosts
        assert bigger.log_bytes_per_day >= p.log_bytes_per_day and bigger.delta_bytes_per_day >= p.delta_bytes_per_day


def tracker(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tracker.cli", "plan", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)


LOAD = ["--dataflows", "1000", "--workers-per-dataflow", "10", "--batches-per-second", "2", "--updates-per-batch", "64",
        "--operators", "50"]


def test_the_command_prints_the_plan_and_its_json() -> None:
    text = tracker(*LOAD, "--cores-per-host", "16", "--memory-per-host", "64")
    assert text.returncode == 0, text.stderr
    p = plan(Load(1000, 10, 2, 64, 50, cores_per_host=16, memory_per_host_gib=64))
    assert f"Plan: {p.hosts:,} hosts of 16 cores and 64 GiB, {p.shards:,} shards" in text.stdout
    assert f"binding: {', '.join(p.binding)}" in text.stdout
    for measured in FIGURES.values():  # every row says where its figures come from
        if measured.bench.startswith("python -m bench shards --parts costs"):
            assert str(measured) in text.stdout
    assert "(python -m bench shards --parts costs)" in text.stdout
    found = json.loads(tracker(*LOAD, "--cores-per-host", "16", "--memory-per-host", "64", "--json").stdout)
    assert found["hosts"] == p.hosts and found["shards"] == p.shards and found["binding"] == p.binding
    assert found["figures"]["LOOP_MS_PER_BATCH"]["bench"] == "python -m bench shards --parts costs"
    assert found["load"]["spark"] is True and found["spark_processes"] == pytest.approx(p.spark_processes)
    off = json.loads(tracker(*LOAD, "--spark", "off", "--retention-days", "30", "--history", "1000", "--json").stdout)
    assert off["spark_processes"] == 0 and off["load"]["retention_days"] == 30 and off["load"]["history"] == 1000


def test_the_documented_example_is_what_the_command_prints() -> None:
    section = doc("operations.md").split("## Capacity planning", 1)[1]
    command = re.search(r"```bash\n(tracker plan .*?)\n(?=tracker plan \.\.\.)", section, re.S)
    printed = re.search(r"The example above prints.*?```\n(.*?)```", section, re.S)
    assert command and printed
    argv = command.group(1).replace("\\\n", " ").split()[2:]
    ran = tracker(*argv)
    assert ran.returncode == 0, ran.stderr
    assert [line for line in ran.stdout.splitlines() if "from:" not in line] == printed.group(1).splitlines()


@pytest.mark.parametrize(("change", "message"), [
    (["--dataflows", "0"], "--dataflows must be from 1 to"),
    (["--dataflows", "ten"], "--dataflows must be a whole number, got 'ten'"),
    (["--dataflows", "1e3"], "--dataflows must be a whole number"),
    (["--batches-per-second", "0"], "--batches-per-second must be above 0"),
    (["--batches-per-second", "nan"], "--batches-per-second must be above 0"),
    (["--batches-per-second", "inf"], "--batches-per-second must be above 0"),
    (["--updates-per-batch", "-5"], "--updates-per-batch must be from 1 to"),
    (["--operators", str(10**12)], "--operators must be from 1 to"),
    (["--spark", "maybe"], "--spark must be on or off, got 'maybe'"),
    (["--cores-per-host", "0"], "--cores-per-host must be from 1 to"),
    (["--memory-per-host", "0.1"], "--memory-per-host must be from 0.25 to"),
])
def test_bad_input_is_one_line_and_exit_2(change: list[str], message: str) -> None:
    argv = list(LOAD)
    if change[0] in argv:
        argv[argv.index(change[0]) + 1] = change[1]
    else:
        argv += change
    ran = tracker(*argv)
    assert ran.returncode == 2 and ran.stdout == ""
    assert ran.stderr.count("\n") == 1 and ran.stderr.startswith("tracker plan: error: "), ran.stderr
    assert message in ran.stderr


def test_a_missing_option_is_named() -> None:
    ran = tracker("--dataflows", "3")
    assert ran.returncode == 2 and ran.stderr == "tracker plan: error: --workers-per-dataflow is required\n"
    # An option no command has is refused by the `tracker` parser itself, as for every command.
    ran = tracker(*LOAD, "--bogus", "1")
    assert ran.returncode == 2 and "unrecognized arguments: --bogus 1" in ran.stderr and "Traceback" not in ran.stderr
