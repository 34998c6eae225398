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
