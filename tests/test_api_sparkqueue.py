"""The fair queue of Spark turns (:mod:`api.spark.turns`): round-robin per dataflow, one turn at a
time, a cancelled waiter skipped; no Spark needed."""

from __future__ import annotations

import asyncio

from api.spark.turns import SparkQueue


def test_a_dataflow_with_many_jobs_cannot_starve_another() -> None:
    async def scenario() -> list[str]:
        turns, order, inside = SparkQueue(), [], []

        async def job(owner: str, name: str) -> None:
            async with turns.turn(owner):
                inside.append(name)
                assert len(inside) == 1, f"two turns at once: {inside}"
                order.append(name)
                await asyncio.sleep(0.001)
                inside.remove(name)

        audits = [asyncio.create_task(job("busy", f"audit{i}")) for i in range(5)]
        await asyncio.sleep(0)  # the busy dataflow's jobs queue first
        checks = [asyncio.create_task(job("quiet", "check")), asyncio.create_task(job("other", "check2"))]
        await asyncio.gather(*audits, *checks)
        return order

    # The running audit finishes; then each other dataflow gets a turn before the busy one's next.
    assert asyncio.run(scenario()) == ["audit0", "check", "check2", "audit1", "audit2", "audit3", "audit4"]


def test_a_waiter_cancelled_before_its_turn_is_skipped() -> None:
    async def scenario() -> tuple[list[str], int]:
        turns, order = SparkQueue(), []
        release = asyncio.Event()

        async def job(owner: str, name: str, hold: asyncio.Event | None = None) -> None:
            async with turns.turn(owner):
                order.append(name)
                if hold is not None:
                    await hold.wait()

        first = asyncio.create_task(job("a", "first", release))
        await asyncio.sleep(0)
        gone = asyncio.create_task(job("b", "gone"))
        after = asyncio.create_task(job("c", "after"))
        await asyncio.sleep(0)
        assert turns.waiting() == 2
        gone.cancel()
        await asyncio.sleep(0)
        release.set()
        await asyncio.gather(first, after)
        return order, turns.waiting()

    order, waiting = asyncio.run(scenario())
    assert order == ["first", "after"] and waiting == 0
