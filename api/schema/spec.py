"""A registration, normalised: the one definition the request, the log, the Spark process
and ``GET`` share, so that no field can be dropped between them.

Guarantees: :func:`registration_record` keeps every field of a validated request; whatever
copies a registration copies :func:`spec_fields`, all of them; :func:`initial_json` serves the
initial pointstamps back as registered, scopes included.

>>> from api.schema.models import RegisterRequest
>>> request = RegisterRequest.model_validate({"name": "n", "nodes": [{"id": 0, "inputs": 0, "outputs": 1}],
...     "initial": [{"location": {"node": 0, "port": 0, "kind": "source"}, "time": [2], "delta": 1}]})
>>> initial_json(registration_record(request))
[{'location': {'node': 0, 'port': 0, 'kind': 'source'}, 'time': [2], 'delta': 1}]
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from api.schema.models import RegisterRequest

InitialRow = tuple[int, int, Literal["source", "target"], tuple[int, ...], int]
"""An initial pointstamp as logged: ``(node, port, kind, time, delta)``."""

class Spec(msgspec.Struct, frozen=True, kw_only=True):
    """A registration, normalised: the form that is logged (:class:`api.durability.records.Register`
    extends it) and that :func:`build_graph` checks.

    ``nodes`` and ``edges`` keep the JSON shape of the request (they are served back as
    registered, scopes nested in their nodes); ``initial`` is ``None`` when the request named
    none; ``initial_scopes[i]`` is the scope path of ``initial[i]`` when some initial pointstamp
    lies in a nested scope (``None`` otherwise, and in records logged before scopes existed).
    """

    name: str
    arity: int
    nodes: list[dict[str, Any]]
    edges: list[dict[str, Any]]
    initial: list[InitialRow] | None
    initial_scopes: list[list[int]] | None = None
    last_epoch: int | None = None
    """The inputs' last epoch, if the registration declared it (progress estimates)."""


def spec_fields(spec: Spec) -> dict[str, Any]:
    """Every field of :class:`Spec`, read from ``spec`` or from a record extending it (the
    logged :class:`api.durability.records.Register`): whatever copies a registration copies
    them all, so that no field can be dropped between the request, the log and the Spark
    process (a field added to :class:`Spec` travels everywhere at once).

    >>> spec = Spec(name="n", arity=2, nodes=[], edges=[], initial=[(1, 0, "source", (0, 0), 1)],
    ...             initial_scopes=[[1]], last_epoch=7)
    >>> Spec(**spec_fields(spec)) == spec
    True
    """
    return {name: getattr(spec, name) for name in Spec.__struct_fields__}


def registration_record(req: RegisterRequest) -> Spec:
    """The normalised form of a validated request body."""
    return Spec(
        name=req.name,
        arity=req.timestamp_arity,
        nodes=[n.model_dump(exclude_none=True) for n in req.nodes],
        edges=[e.model_dump() for e in req.edges],
        initial=None if not req.initial else [
            (u.location.node, u.location.port, u.location.kind, tuple(u.time), u.delta) for u in req.initial
        ],
        initial_scopes=[list(u.location.scope or ()) for u in req.initial]
        if req.initial and any(u.location.scope for u in req.initial) else None,
        last_epoch=req.last_epoch,
    )


def initial_json(spec: Spec) -> list[dict[str, Any]] | None:
    """The initial pointstamps of ``spec`` in the request's JSON shape (``GET /v1/dataflows/{id}``):
    what the registration named, scopes included.

    >>> initial_json(Spec(name="n", arity=1, nodes=[], edges=[], initial=[(1, 0, "source", (0, 0), 1)],
    ...                   initial_scopes=[[1]]))
    [{'location': {'scope': [1], 'node': 1, 'port': 0, 'kind': 'source'}, 'time': [0, 0], 'delta': 1}]
    """
    if spec.initial is None:
        return None
    scopes = spec.initial_scopes or [[] for _ in spec.initial]
    return [{"location": {**({"scope": list(scope)} if scope else {}), "node": node, "port": port, "kind": kind},
             "time": list(time), "delta": delta}
            for scope, (node, port, kind, time, delta) in zip(scopes, spec.initial, strict=True)]
