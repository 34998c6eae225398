"""The chaos suite's short run (``python -m bench chaos --quick``: one fault of each kind, about
a minute of faults) as a test, with the planted bug on: the checker must find the one tenant
that skips its resends, and only that one.

One run shows both sides: the planted bug lives in one tenant's client (the raw WebSocket
sender of shard 1, :mod:`bench.chaos_tenants`), never in the service, so every other tenant's
verdict is the verdict of a run without it, and the test asserts that each of them holds
(nothing lost, nothing applied twice, the REST state equal to the oracle's, every tenant
finished) while the planted one is reported. Waits are reported, not asserted: they are the
benchmark's figures (a timed test on a shared machine would only measure the machine).

It needs root, ``ip`` and ``iptables`` (the run makes a network namespace); it fails, naming what
is missing, otherwise. Whatever the run leaves, killed or not, is removed here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from bench.chaos_tenants import PLANT_ENV, PLANTED_TENANT
from bench.hosts import missing, remove_leftovers
from bench.nemesis import KINDS
from tests.helpers import ROOT


def test_the_quick_suite_holds_for_every_tenant_and_reports_the_planted_bug() -> None:
    reason = missing(firewall=True)
    if reason:
        pytest.fail(reason, pytrace=False)
    env = {**os.environ, PLANT_ENV: "skip-resend"}
    process = subprocess.Popen([sys.executable, "-m", "bench", "chaos", "--quick", "--seed", "7"], cwd=ROOT, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = process.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        process.terminate()  # the suite cleans up on SIGTERM
        out, err = process.communicate(timeout=60)
        raise AssertionError(f"the quick suite did not end within 10 minutes:\n{out[-3000:]}") from None
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
        left = remove_leftovers(process.pid)
    assert process.returncode == 0, err[-3000:]
    assert left == [], f"the suite left namespaces behind: {left}"
    figures = json.loads(out.strip().splitlines()[-1])["figures"]
    assert figures["plant"] == "skip-resend"
    assert {k for k, n in figures["faults"].items() if n >= 1} == set(KINDS), figures["faults"]
    assert figures["faults_not_healed"] == [] and figures["healthy_at_the_end"], figures
    tenants = figures["tenants"]
    assert sorted(tenants) == sorted(f"s{shard}-{kind}" for shard in (0, 1)
                                     for kind in ("post", "ws", "sdk-ws", "sdk-sse", "costly"))
    for name, verdict in tenants.items():
        assert verdict["acked"] > 0 and verdict["errors"] == [], (name, verdict)
        if name == PLANTED_TENANT:
            assert verdict["planted"] and not verdict["holds"], verdict
            assert verdict["lost"] or verdict["problems"], verdict
        else:
            assert verdict["holds"] and verdict["lost"] == 0 and verdict["applied_twice"] == 0, (name, verdict)
    assert set(figures["violations"]) == {PLANTED_TENANT}, figures["violations"]
    assert figures["longest_gap_healthy_s"] > 0 and figures["longest_gap_faulted_s"] > 0
