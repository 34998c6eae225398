"""The benchmark runner's contract: listing, and a last line that is one JSON object."""

from __future__ import annotations

import json
import subprocess
import sys


def test_bench_lists_and_runs_native_quick() -> None:
    listing = subprocess.run([sys.executable, "-m", "bench"], capture_output=True, text=True, check=True)
    assert "native" in listing.stdout
    result = subprocess.run([sys.executable, "-m", "bench", "native", "--quick"], capture_output=True, text=True,
                            check=True, timeout=300)
    last = json.loads(result.stdout.strip().splitlines()[-1])
    assert last["name"] == "native"
    assert set(last) == {"name", "figures", "targets"}
    assert last["figures"]["random.locations"] > 100


def test_bench_unknown_name_is_a_clear_error() -> None:
    result = subprocess.run([sys.executable, "-m", "bench", "nope"], capture_output=True, text=True)
    assert result.returncode == 2
    assert "unknown benchmark 'nope'" in result.stderr


def test_restart_benchmarks_run_quick_against_the_real_service() -> None:
    """The two restart benchmarks read the service's answers and its Delta tables as a user's
    tools would (raw HTTP/1.1, delta-rs): a change in either (a streamed answer, a table made
    later) must not leave them broken unnoticed."""
    for name, check in (("recovery", lambda f: f["batches"] == f["version"] == 3_000),
                        ("restart", lambda f: f["dataflows"] == 200 and f["all_dataflows_seconds"] > 0)):
        result = subprocess.run([sys.executable, "-m", "bench", name, "--quick"], capture_output=True, text=True,
                                timeout=600)
        assert result.returncode == 0, result.stderr[-2000:]
        last = json.loads(result.stdout.strip().splitlines()[-1])
        assert last["name"] == name and check(last["figures"]), last
