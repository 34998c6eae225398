"""The v1 bodies: the pydantic models of every JSON body (the OpenAPI document), the hot
path's progress parser, the registration body parsed in slices, and the graph checks a
registration must pass.

Guarantees: a body is either refused with the exact 4xx body the routes answer, or turned into
validated values of the core model (:mod:`tracker.graph`); nothing here keeps state.

May import: tracker, pydantic.
"""
