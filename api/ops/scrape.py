"""What a ``/metrics`` scrape reads from the hosted dataflows: their inputs' lags, the oldest live
pointstamp, how many are in each lifecycle state, and the operators' progress estimates.

Guarantee: everything is read on the event loop when :func:`service_scrape` is called (copies,
and each dataflow's state once); the rows are built by the returned :class:`~api.metrics.Scrape`'s
callables, which may run in a worker thread. Estimates are made only for dataflows that are
``running`` or ``stalled`` (the others have nothing left to estimate).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable

from api.host.tenant import Tenant
from api.metrics import EstimateRow, Scrape
from api.ops.estimate import operator_rates
from api.ops.lag import service_lag_rows, service_oldest_age


def service_scrape(dataflows: Iterable[Tenant], spark: str = "disabled") -> Scrape:
    """The :class:`~api.metrics.Scrape` of these dataflows (the ready ones), read now, with the
    Spark process's state ``spark``."""
    ready = [tenant for tenant in list(dataflows) if tenant.ready]
    now = time.time()
    states = {tenant.id: tenant.lifecycle()["state"] for tenant in ready}
    rates = [(tenant.id, operator_rates(tenant, now)) for tenant in ready
             if states[tenant.id] in ("running", "stalled")]

    def estimates() -> list[EstimateRow]:
        return [(dataflow_id, *row) for dataflow_id, rows in rates for row in rows()]

    return Scrape(service_lag_rows(ready), service_oldest_age(ready), Counter(states.values()), estimates, spark)
