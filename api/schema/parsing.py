"""The hot path's parser for progress batches: strict, exact errors, and cheap.

``POST .../progress`` and the WebSocket carry the most traffic, and parsing is the service's
largest cost after the tracker itself: pydantic models cost as much per update as
``Tracker.apply`` (~6 us), ``json`` plus a hand-written check about half a microsecond. Here
``msgspec`` decodes the body straight into typed structs, in C, checking the same shape as
:class:`api.schema.models.ProgressRequest` (which stays the documented schema): strict integers (no
bools, no floats), known fields only, the same bounds. What depends on the graph (known ports,
arity, the range of times) is checked in one short Python pass that also builds the compiled
engine's flat lists (:func:`parse_indexed`) or the core's updates, ready for ``Tracker.apply``
(:func:`parse_progress`).

Shape mistakes raise :class:`InvalidRequest` (``invalid_request``, like pydantic's 422),
mistakes against the graph raise :class:`~tracker.graph.GraphError` (``invalid_update``), and
undecodable JSON raises :class:`MalformedJSON` (400). Duplicate keys resolve to the last one.

>>> from tracker.graph import Edge, Node
>>> g = Graph.build(1, [Node(0, 0, 1), Node(1, 1, 0)], [Edge(Location.source(0, 0), Location.target(1, 0))])
>>> parse_progress(b'{"worker": "w", "seq": 0, "updates": '
...                b'[{"location": {"node": 1, "port": 0, "kind": "target"}, "time": [4], "delta": 1}]}', g)
('w', 0, [(Location(node=1, port=0, kind='target'), (4,), 1)])
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Annotated, Literal, NoReturn

import msgspec
import pydantic

from api.schema.models import MAX_SEQ, RegisterRequest
from tracker.graph import MAX_DELTA, Graph, GraphError, Location, Update
from tracker.timestamp import MAX_TIME

MAX_UPDATES = 100_000


class MalformedJSON(ValueError):
    """The body is not JSON."""


class InvalidRequest(ValueError):
    """The body does not have the documented shape; ``loc`` says where."""

    def __init__(self, loc: str, msg: str) -> None:
        super().__init__(f"{loc}: {msg}")
        self.loc = loc
        self.msg = msg

    def detail(self) -> list[dict[str, str]]:
        """Pydantic-like error list."""
        return [{"loc": self.loc, "msg": self.msg, "type": "invalid"}]


# gc=False: decoded structs hold only ints, strings and tuples (no cycles), and left to the
# collector the hundreds of them per batch triggered collections that cost as much as decoding.
class _Location(msgspec.Struct, frozen=True, forbid_unknown_fields=True, gc=False):
    # frozen: hashable, so it is itself the key that finds the graph's Location.
    node: int
    port: int
    kind: Literal["source", "target"]
    scope: tuple[int, ...] = ()  # the root; a dataflow without nested scopes has no other


class _Update(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    location: _Location
    time: tuple[int, ...]
    delta: Annotated[int, msgspec.Meta(ge=-MAX_DELTA, le=MAX_DELTA)]


class _Batch(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    worker: Annotated[str, msgspec.Meta(min_length=1, max_length=200)]
    seq: Annotated[int, msgspec.Meta(ge=0, le=MAX_SEQ)]
    updates: Annotated[list[_Update], msgspec.Meta(max_length=MAX_UPDATES)]


_DECODER = msgspec.json.Decoder(_Batch)
# The decoded wire form of a progress body, shared with api.live.scopes (nested dataflows).
WireLocation = _Location
WireUpdate = _Update
BATCH_DECODER = _DECODER
_INDEXED: dict[int, tuple[Graph, list[Location], dict[_Location, int]]] = {}
_PATH = re.compile(r"^(.*) - at `\$(.*)`$", re.S)


def parse_registration(data: bytes) -> RegisterRequest:
    """The body of ``POST /v1/dataflows``: :class:`MalformedJSON` unless it is one strict JSON
    document (no ``NaN``, no trailing data, not empty), :class:`InvalidRequest` unless it has
    the shape of :class:`~api.schema.models.RegisterRequest` (nesting too deep for the interpreter's
    recursion limit included). The graph itself is checked later.

    >>> try:
    ...     parse_registration(b"[" * 200_000)
    ... except InvalidRequest as error:
    ...     print(error.loc, error.msg[:40])
    body arrays and objects are nested too deeply
    """
    try:
        document = msgspec.json.decode(data)
    except msgspec.DecodeError as error:
        raise MalformedJSON("the body is not one JSON document" + (f": {error}" if data.strip() else ": it is empty")
                            ) from None
    except UnicodeDecodeError as error:  # JSON is UTF-8; msgspec checks it only in string values
        raise MalformedJSON(f"the body is not UTF-8: {error}") from None
    except msgspec.ValidationError as error:  # an integer beyond 64 bits
        raise InvalidRequest("body", str(error)) from None
    except RecursionError:  # valid JSON, but no registration nests that deep
        raise InvalidRequest("body", "arrays and objects are nested too deeply (a registration needs a few dozen "
                                     "levels at most)") from None
    try:
        return RegisterRequest.model_validate(document)
    except RecursionError:
        raise InvalidRequest("body", "arrays and objects are nested too deeply") from None
    except pydantic.ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in ("body", *first["loc"]))
        if len(where) > 200:  # pydantic's depth limit names every level on the way down
            where = where[:100] + " ... " + where[-95:]
        raise InvalidRequest(where, first["msg"]) from None


def parse_progress(data: bytes | str, graph: Graph) -> tuple[str, int, list[Update]]:
    """``(worker, seq, updates)`` of a progress body, fully validated against ``graph``."""
    worker, seq, updates = _parse(data, graph, False)
    assert isinstance(updates, list)
    return worker, seq, updates


def parse_indexed(data: bytes | str, graph: Graph) -> tuple[str, int, Indexed]:
    """:func:`parse_progress` for the compiled engine: the same checks and errors, but the updates
    as flat integer lists over the engine's location order (``sorted(graph.locations())``, as
    :func:`tracker.compiled.engine_for` numbers them), with no Python object per update.

    >>> from tracker.graph import Edge, Node
    >>> g = Graph.build(1, [Node(0, 0, 1), Node(1, 1, 0)], [Edge(Location.source(0, 0), Location.target(1, 0))])
    >>> body = b'{"worker": "w", "seq": 0, "updates": [{"location": {"node": 1, "port": 0, "kind": "target"}, '
    >>> _, _, batch = parse_indexed(body + b'"time": [4], "delta": 1}]}', g)
    >>> batch.locations, batch.times, batch.deltas, list(batch)
    ([1], [4], [1], [(Location(node=1, port=0, kind='target'), (4,), 1)])
    """
    worker, seq, updates = _parse(data, graph, True)
    assert isinstance(updates, Indexed)
    return worker, seq, updates


class Indexed:
    """One batch's updates as the compiled engine takes them (``Engine.apply_indexed``):
    ``locations[i]`` (an index into ``order``), the time ``times[i * arity:(i + 1) * arity]``,
    ``deltas[i]``. Iterating yields the core's ``(location, time, delta)`` updates, built on
    demand (for the rare readers that want them: in-flight counts, Spark)."""

    __slots__ = ("arity", "deltas", "locations", "order", "times")

    def __init__(self, order: list[Location], arity: int, locations: list[int], times: list[int],
                 deltas: list[int]) -> None:
        self.order, self.arity, self.locations, self.times, self.deltas = order, arity, locations, times, deltas

    def __len__(self) -> int:
        return len(self.deltas)

    def __iter__(self) -> Iterator[Update]:
        order, times, arity = self.order, self.times, self.arity
        for i, (location, delta) in enumerate(zip(self.locations, self.deltas, strict=True)):
            yield order[location], tuple(times[i * arity:(i + 1) * arity]), delta


def _indexed(graph: Graph) -> tuple[list[Location], dict[_Location, int]]:
    """The graph's locations in the compiled engine's order, and their index by decoded form."""
    cached = _INDEXED.get(id(graph))
    if cached is None or cached[0] is not graph:
        order = graph.sorted_locations()
        cached = (graph, order, {_Location(loc.node, loc.port, loc.kind): i for i, loc in enumerate(order)})
        _INDEXED[id(graph)] = cached
    return cached[1], cached[2]


def _parse(data: bytes | str, graph: Graph, indexed: bool) -> tuple[str, int, list[Update] | Indexed]:
    """The checks both parsers make, in one pass that builds either answer (a shared pass keeps
    their errors the same; building in it keeps the hot path to one loop)."""
    try:
        batch = _DECODER.decode(data)
    except msgspec.ValidationError as error:
        raise _invalid(str(error)) from None
    except msgspec.DecodeError as error:
        raise MalformedJSON(str(error)) from None
    except UnicodeDecodeError as error:  # JSON is UTF-8; msgspec checks it only in string values
        raise MalformedJSON(f"the body is not valid UTF-8 (byte {error.start})") from None
    arity = graph.arity
    order, index = _indexed(graph)
    find = index.get
    locations: list[int] = []
    times: list[int] = []
    deltas: list[int] = []
    updates: list[Update] = []
    add_location, add_delta, add_update = locations.append, deltas.append, updates.append
    add_time = times.append if arity == 1 else times.extend
    for position, update in enumerate(batch.updates):
        at = find(update.location)
        if at is None:
            _unknown(position, update.location)
        time = update.time
        if len(time) != arity:
            _wrong_arity(position, time, arity)
        if arity == 1:
            if not 0 <= time[0] <= MAX_TIME:
                _out_of_range(position, time)
        elif min(time) < 0 or max(time) > MAX_TIME:
            _out_of_range(position, time)
        if not indexed:
            add_update((order[at], time, update.delta))
            continue
        add_time(time[0] if arity == 1 else time)  # type: ignore[arg-type]
        add_location(at)
        add_delta(update.delta)
    return batch.worker, batch.seq, Indexed(order, arity, locations, times, deltas) if indexed else updates


def _wrong_arity(index: int, time: tuple[int, ...], arity: int) -> NoReturn:
    raise GraphError(f"update {index}: time {list(time)} has {len(time)} coordinates, "
                     f"the dataflow's arity is {arity}")


_ALLOWED = {"kind": ("source", "target")}
"""The values of each enumerated field, named in the message when another one is sent."""


def _invalid(message: str) -> InvalidRequest:
    """msgspec's ``"Expected `int`, got `str` - at `$.updates[0].delta`"`` as a located error; a
    bad enumerated value names the allowed ones, as pydantic's messages do.

    >>> _invalid("Invalid enum value 'src' - at `$.updates[0].location.kind`").msg
    "Input should be 'source' or 'target', got 'src'"
    """
    match = _PATH.match(message)
    if match is None:
        return InvalidRequest("body", message)
    path = re.sub(r"\[(\d+)\]", r".\1", match.group(2))
    text = match.group(1)
    allowed = _ALLOWED.get(path.rpartition(".")[2])
    if allowed is not None and text.startswith("Invalid enum value "):
        text = "Input should be " + " or ".join(f"'{value}'" for value in allowed) + ", got " + text[19:]
    return InvalidRequest("body" + path, text)


def _unknown(index: int, loc: _Location) -> NoReturn:
    if loc.scope:
        raise GraphError(f"update {index}: unknown scope {list(loc.scope)}")
    if loc.node < 0 or loc.port < 0:
        raise InvalidRequest(f"body.updates.{index}.location", "node and port must be non-negative integers")
    raise GraphError(f"update {index}: unknown location {Location(loc.node, loc.port, loc.kind)}")


def _out_of_range(index: int, time: tuple[int, ...]) -> NoReturn:
    raise GraphError(f"update {index}: time {list(time)} must hold integers from 0 to {MAX_TIME}")
