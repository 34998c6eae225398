"""Runnable timely dataflow examples on the worker SDK (``tracker example NAME``).

Each module offers the same small surface, used by :mod:`tracker.worker.cluster` and the tests:
``DEFAULTS`` (config), ``build(config) -> Dataflow``, ``async drive(worker, config)`` (feeds
this worker's share of the input), ``collect(worker) -> rows``, ``reference(config) -> rows``
(a plain sequential computation of the same thing) and ``render(rows) -> lines``; the epoch
feeding (``pace``, ``lockstep``) and the reading of the sink's rows they share are in
``examples/_common.py``. The examples:
``wordcount`` (a flat dataflow), ``components`` (a loop scope) and ``digitroot`` (a loop in a
loop). What each example guarantees: run on any number of workers, its rows equal its ``reference``
(``tracker example NAME --check`` checks this against the service).

One worker against an in-process tracker, with no service:

>>> import asyncio
>>> from examples import wordcount
>>> from tracker.reachability import Tracker
>>> from tracker.worker import LocalHub, Worker
>>> config = {**wordcount.DEFAULTS, "epochs": 2}
>>> flow = wordcount.build(config)
>>> tracker = Tracker(flow.graph())
>>> _ = tracker.apply(flow.initial(workers=1))
>>> worker = Worker(flow, 0, 1, LocalHub(tracker).link("w0"))
>>> _ = asyncio.run(worker.run(lambda w: wordcount.drive(w, config)))
>>> wordcount.collect(worker) == wordcount.reference(config)
True
>>> for line in wordcount.render(wordcount.collect(worker)):
...     print(line)
epoch 0: 160 words, 49 distinct; top w032=8, w001=7, w014=7, w035=7, w031=6
epoch 1: 160 words, 49 distinct; top w001=8, w010=7, w013=5, w016=5, w019=5
"""
