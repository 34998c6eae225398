"""The write-ahead log: typed records and their one encoding, segments and their framing, group
commit with the ``fdatasync`` process, and what recovery must find for each dataflow.

Guarantees: a record's future resolves only after the ``fdatasync`` covering it returned, and
after its dataflow's high-water mark, kept where a cut of a segment's tail cannot reach, counts
it; a torn tail is cut only when the marks show it was never acknowledged; anything else
damaged, or missing below a mark, is attributed to its dataflow, which recovery then refuses
alone.

May import: api.schema.
"""
