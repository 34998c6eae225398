"""The worker SDK: run dataflow vertices natively in your own processes, with the service
telling each one when a notification is safe.

Install it alone with ``pip install 'timely-progress-service[worker]'``: it needs neither Spark
nor FastAPI. The pieces, one module each:

* :mod:`tracker.worker.vertex`: :class:`Vertex` (``on_recv``, ``on_notify``, ``send_by``,
  ``notify_at``) and :class:`Dataflow`, the logical graph a program declares, with nested
  scopes (:meth:`Dataflow.scope` gives a :class:`Subscope`: loops and regions);
* :mod:`tracker.worker.runtime`: :class:`Worker`, one process's share of a dataflow, and
  :class:`InputHandle`;
* :mod:`tracker.worker.link`: :class:`ServiceLink` (a WebSocket to the service),
  :class:`LocalHub` (an in-process tracker, for tests); :mod:`tracker.worker.sse_link`: the
  POST + SSE fallback;
* :mod:`tracker.worker.transport`: :class:`Transport`, data between worker processes over TCP;
* :mod:`tracker.worker.cluster`: :func:`~tracker.worker.cluster.launch`, registering a dataflow
  and starting worker processes (the ``tracker example`` command).

>>> from tracker.worker import Dataflow, Vertex, Worker
>>> flow = Dataflow("hello")
>>> source = flow.input("in")
>>> sink = flow.stage("sink", lambda index, peers: Vertex(), inputs=1, outputs=0)
>>> flow.connect((source, 0), (sink, 0))
>>> Worker(flow, 0, 1, link=None).input(source).epoch
0
>>> loop = flow.scope("loop")                  # an iterative scope: its stages see (epoch, i)
>>> step = loop.stage("step", lambda index, peers: Vertex(), inputs=1, outputs=0)
>>> flow.connect((source, 0), (step, 0))       # enters the loop: (e,) becomes (e, 0)
>>> flow.arity_of(step), loop.path, flow.nested().scopes[loop.path].kind
(2, (2,), 'iterative')
"""

from tracker.worker.link import Link, LinkFailure, LocalHub, ServiceLink
from tracker.worker.runtime import InputHandle, Worker
from tracker.worker.transport import Transport
from tracker.worker.vertex import Dataflow, ProgressError, Subscope, Vertex

__all__ = ["Dataflow", "InputHandle", "Link", "LinkFailure", "LocalHub", "ProgressError", "ServiceLink",
           "Subscope", "Transport", "Vertex", "Worker"]
