"""The write-ahead log: typed records and their one encoding, segments and their framing, group
commit with the ``fdatasync`` process, and what recovery must find for each dataflow.

Guarantees: a record's future resolves only after the ``fdatasync`` covering it returned; a
torn tail is cut and anything else damaged is attributed to its dataflow, which recovery then
refuses alone.

May import: api.schema.
"""
