"""Spark jobs over the Delta warehouse: cycle check, path summaries, frontier propagation.

Modules, by the noun they hold:

* ``session``: ``get_spark()``, the process's one session; ``graph_engine()`` (which engine runs
  the graph work); ``has_delta_jvm``/``has_graphframes_jvm``.
* ``graphx`` (+ ``jvm/``, Java): the GraphX helper, its build and the calls into it: the default
  engine of the cycle check, ``Psi``, propagation and incremental batches
  (``TRACKER_GRAPH_ENGINE=dataframe`` chooses the DataFrame path instead).
* ``nested``: nested dataflows checked and audited from the in-memory graph (for the service).
* ``tables`` / ``storage``: the Delta layout and ``Warehouse`` (delta-rs or
  delta-spark; atomic commits, time travel, watermarks).
* ``frames`` / ``iteration``: the shared DataFrame vocabulary and the semi-naive fixed point.
* ``cycles``, ``summaries``, ``propagate``, ``incremental``: the computations, each with an
  in-memory entry point (``find_cycles_for_graph``, ``summaries_for_graph``, ``frontiers_for``,
  ``update_frontiers`` / ``SparkFrontierEngine``) and a DataFrame one used by ``jobs``.
* ``jobs`` / ``cli``: the warehouse jobs behind ``tracker jobs cycles|summaries|propagate|incremental``.
* ``quickstart``: the driver JVM's options and class-data archive that start a short
  ``tracker jobs`` run on a local master quickly (``quickstart_dump`` builds the archive, in a process
  of its own).
"""
