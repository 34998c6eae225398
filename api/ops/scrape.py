"""What a ``/metrics`` scrape reads from the hosted dataflows: their inputs' lags, the oldest live
pointstamp, how many are in each lifecycle state, the operators' progress estimates, and the
statistics of the programs that send them (busy share per operator, records per second per
channel).

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
from api.metrics import ActivityRow, EstimateRow, Scrape
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

    views = [(tenant.id, tenant.activity.view()) for tenant in ready
             if tenant.activity is not None and tenant.activity.reports]

    def activity() -> list[ActivityRow]:
        rows: list[ActivityRow] = []
        for dataflow_id, view in views:
            rows += [(dataflow_id, "busy_share", op["label"], op["busy_share"]) for op in view["operators"]
                     if not op["is_scope"]]
            rows += [(dataflow_id, "records_per_second", f"{ch['from']}:{ch['source'][1]} -> {ch['to']}:"
                      f"{ch['target'][1]}", ch["records_per_second"]) for ch in view["channels"]]
        return rows

    return Scrape(service_lag_rows(ready), service_oldest_age(ready), Counter(states.values()), estimates, spark,
                  activity)
