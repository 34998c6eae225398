"""The registration body parsed in slices (and served back in slices), so that a huge graph never
holds the GIL for long.

Guarantees: :func:`parse_registration_sliced` accepts and refuses exactly what
:func:`api.schema.parsing.parse_registration` does (the same :class:`~api.schema.parsing.MalformedJSON` and,
for a single mistake, the same :class:`~api.schema.parsing.InvalidRequest` location and message; with
several mistakes the one reported may differ), and returns an equal
:class:`~api.schema.models.RegisterRequest`; no single C call it makes decodes or validates more than
:data:`SLICE` nodes or edges.

Why: pydantic validates a whole body in one call that holds the GIL, ~40 us per node: 2.2 s
for a 50,000-node graph, during which a thread cannot let the event loop run, so every other
dataflow's acknowledgements waited. Here the body's members and the elements of its node and
edge lists are first found by the compiled engine's ``split_members`` without the GIL (msgspec
scanning the whole body as ``msgspec.Raw`` held it 10-24 ms per scan of a 5 MB body; it is
still the way when the extension is not installed); every piece is then decoded (anything
msgspec refuses is refused by the whole-body parser, for its exact message), and only then are
the nodes and edges validated, a slice at a time, in a worker thread
(:meth:`api.host.service.Service.register`), which the interpreter interrupts between slices to let
the event loop run.

>>> request = parse_registration_sliced(b'{"name": "pair", "nodes": [{"id": 0, "inputs": 0, "outputs": 1},'
...     b' {"id": 1, "inputs": 1, "outputs": 0}], "edges": [{"source": {"node": 0, "port": 0},'
...     b' "target": {"node": 1, "port": 0}}]}')
>>> request == parse_registration(request.model_dump_json(exclude_none=True).encode())
True
>>> parse_registration_sliced(b'{"name": "x", "nodes": [{"id": 0, "inputs": -1, "outputs": 1}]}')
Traceback (most recent call last):
...
api.schema.parsing.InvalidRequest: body.nodes.0.inputs: Input should be greater than or equal to 0
"""

from __future__ import annotations

import contextlib
import gc
import json
import threading
from collections.abc import Iterator
from typing import Any

import msgspec
import pydantic

from api.schema.models import DataflowDetail, EdgeModel, NodeModel, RegisterRequest
from api.schema.parsing import InvalidRequest, parse_registration

SLICE = 64
"""Nodes (or edges) decoded and validated per call: ~3 ms of the GIL at most."""
_LISTS: dict[str, tuple[pydantic.TypeAdapter[Any], int]] = {
    "nodes": (pydantic.TypeAdapter(list[NodeModel]), 100_000),
    "edges": (pydantic.TypeAdapter(list[EdgeModel]), 1_000_000),
}
_REQUEST: pydantic.TypeAdapter[RegisterRequest] = pydantic.TypeAdapter(RegisterRequest)
_RAW_LIST = msgspec.json.Decoder(list[msgspec.Raw])


def parse_registration_sliced(data: bytes) -> RegisterRequest:
    """The body of ``POST /v1/dataflows`` (see the module docstring).

    Raises:
        MalformedJSON: not one strict JSON document.
        InvalidRequest: not of the shape of :class:`~api.schema.models.RegisterRequest`.
    """
    try:
        return _sliced(data)
    except RecursionError:  # nested too deeply for the interpreter: the whole-body parser says so
        return parse_registration(data)


def _sliced(data: bytes) -> RegisterRequest:
    if not data.isascii():
        try:  # msgspec checks UTF-8 only in the strings it decodes: a bad byte anywhere is malformed first
            data.decode()
        except UnicodeDecodeError:
            return parse_registration(data)
    pieces = _split(data)
    if pieces is None:
        return parse_registration(data)  # malformed or not an object: cheap to refuse, exact message
    top, lists = pieces
    rest: dict[str, Any] = {key: [] for key in lists}
    # Every piece decoded before anything is validated, so that a body msgspec refuses is refused
    # as such; the lists are decoded again below, a slice at a time, for validation: keeping
    # every slice's objects would hold the whole graph's, freed wherever a refusal is handled.
    try:
        for key, raw in top.items():
            rest[key] = msgspec.json.decode(raw)
        for _, chunks in lists.values():
            for chunk in chunks:
                msgspec.json.decode(b"[" + chunk + b"]")  # numbers out of range too: not JSON to the whole parser
    except msgspec.DecodeError:  # ValidationError (a number out of range) included
        return parse_registration(data)
    request: RegisterRequest = _validated(_REQUEST, rest, ())
    for key, (count, chunks) in lists.items():
        adapter, limit = _LISTS[key]
        if count > limit:
            raise InvalidRequest(f"body.{key}", f"List should have at most {limit} items after validation, "
                                                f"not {count}")
        models: list[Any] = []
        for start, chunk in enumerate(chunks):
            models += _validated(adapter, msgspec.json.decode(b"[" + chunk + b"]"), (key,), start * SLICE)
        setattr(request, key, models)
    return request


_Lists = dict[str, tuple[int, list[bytes]]]
"""A body's node and edge lists: each list's length and its elements' JSON text, :data:`SLICE`
consecutive elements (with the commas between them) per chunk."""


def _split(data: bytes) -> tuple[dict[str, bytes], _Lists] | None:
    """The body's members other than its node and edge lists, as JSON text by key (the last of
    a repeated key), and those lists; ``None`` if the body is not a JSON object where the scan
    looks (the pieces are decoded by the caller, which refuses the rest)."""
    try:
        from progress_engine import split_members
    except ImportError:  # the compiled engine is not installed: msgspec scans the body (holding the GIL)
        return _scanned(data)
    found = split_members(data, [key.encode() for key in _LISTS])
    if found is None:
        return None
    top: dict[str, bytes] = {}
    lists: _Lists = {}
    for key_start, key_end, start, end, offsets in found:
        try:
            key = msgspec.json.decode(data[key_start:key_end], type=str)
        except msgspec.DecodeError:
            return None
        if key in top or key in lists:  # a repeated key: the last one counts, as a JSON decoder says
            return _scanned(data)
        if offsets is None:
            top[key] = data[start:end]
            continue
        spans = memoryview(offsets).cast("Q")
        chunks = [data[spans[2 * i]:spans[2 * min(i + SLICE, len(spans) // 2) - 1]]
                  for i in range(0, len(spans) // 2, SLICE)]
        lists[key] = (len(spans) // 2, chunks)
    return top, lists


def _scanned(data: bytes) -> tuple[dict[str, bytes], _Lists] | None:
    """:func:`_split` by msgspec: one scan of the whole body, one of each list (holding the GIL)."""
    try:
        members = msgspec.json.decode(data, type=dict[str, msgspec.Raw])
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    top: dict[str, bytes] = {}
    lists: _Lists = {}
    for key, raw in members.items():
        if key in _LISTS:
            try:
                raws = _RAW_LIST.decode(raw)
            except (msgspec.ValidationError, msgspec.DecodeError):
                pass  # not a list: the request's validation names the mistake
            else:
                lists[key] = (len(raws), [b",".join(raws[i:i + SLICE]) for i in range(0, len(raws), SLICE)])
                continue
        top[key] = bytes(raw)
    return top, lists


def _validated(schema: pydantic.TypeAdapter[Any], value: Any, where: tuple[str, ...], offset: int = 0) -> Any:
    """``value`` validated by ``schema`` (the request, or a list adapter whose items start at index
    ``offset`` of the body's list ``where``); :class:`InvalidRequest` naming the first mistake."""
    try:
        return schema.validate_python(value)
    except pydantic.ValidationError as error:
        first = error.errors()[0]
        loc = list(first["loc"])
        if where:
            loc[0] = int(loc[0]) + offset
        place = ".".join(str(part) for part in ("body", *where, *loc))
        if len(place) > 200:  # as api.schema.parsing: pydantic's depth limit names every level on the way down
            place = place[:100] + " ... " + place[-95:]
        raise InvalidRequest(place, first["msg"]) from None


_pauses = 0
_was_enabled = True
_pause_lock = threading.Lock()


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic garbage collector off while a registration is parsed and built (nested and
    concurrent uses share one pause; the collector's state before the first is restored).

    A registration allocates ~10 objects per location, all alive until it is refused or
    hosted, and each full collection pass triggered meanwhile walked all of them (and the
    rest of the heap) holding the GIL: passes of 0.3-1.5 s over a 20,000-node graph, stalling
    the event loop however the work was sliced. Reference counting still frees everything
    that is not cyclic meanwhile.

    >>> with collector_paused():
    ...     gc.isenabled()
    False
    >>> gc.isenabled()
    True
    """
    global _pauses, _was_enabled
    with _pause_lock:
        if _pauses == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _pauses += 1
    try:
        yield
    finally:
        with _pause_lock:
            _pauses -= 1
            if _pauses == 0 and _was_enabled:
                gc.enable()


def graph_json(nodes: list[Any], edges: list[Any]) -> list[bytes]:
    """``nodes`` and ``edges`` (as registered) as ``GET /dataflows/{id}`` writes them, as chunks
    to put between ``"nodes":[`` and the rest of :func:`detail_json`: validated, dumped in JSON
    mode and ``json.dumps`` compact, a :data:`SLICE` at a time (in one call a 50,000-node graph
    held the GIL over a second). Call it in a worker thread; the graph never changes, so keep it."""
    chunks: list[bytes] = []
    for key, items in (("nodes", nodes), ("edges", edges)):
        adapter, _ = _LISTS[key]
        for i in range(0, len(items), SLICE):
            part = json.dumps(adapter.dump_python(adapter.validate_python(items[i:i + SLICE]), mode="json",
                                                  by_alias=True), ensure_ascii=False, allow_nan=False,
                              separators=(",", ":"))[1:-1]
            chunks.append(("," + part if i else part).encode())
        if key == "nodes":
            chunks.append(b'],"edges":[')
    return chunks


def detail_json(detail: dict[str, Any], graph: list[bytes]) -> list[bytes]:
    """The ``GET /dataflows/{id}`` body of ``detail`` (a :class:`~api.schema.models.DataflowDetail`'s
    fields but ``nodes`` and ``edges``) and ``graph`` (their :func:`graph_json`), as FastAPI would
    write it through that response model (validated, dumped in JSON mode, ``json.dumps`` compact
    and not ASCII-only), as chunks to send one after the other.

    >>> detail = {"id": "d", "name": "n", "timestamp_arity": 1, "version": 0, "created_at": "t",
    ...           "state": "running", "endpoint": "http://127.0.0.1:8000",
    ...           "status": {"state": "running", "spark_check": "skipped"}}
    >>> nodes = [{"id": 0, "inputs": 0, "outputs": 1}]
    >>> model = DataflowDetail.model_validate({**detail, "nodes": nodes, "edges": []})
    >>> whole = json.dumps(model.model_dump(mode="json", by_alias=True), ensure_ascii=False, separators=(",", ":"))
    >>> b"".join(detail_json(detail, graph_json(nodes, []))) == whole.encode()
    True
    """
    shell = DataflowDetail.model_validate({**detail, "nodes": [], "edges": []}).model_dump(mode="json", by_alias=True)
    text = json.dumps(shell, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    # In the shell, '"nodes":[],"edges":[]' cannot occur unescaped inside a string: the first is the fields'.
    before, after = text.split('"nodes":[],"edges":[]', 1)
    return [f'{before}"nodes":['.encode(), *graph, f"]{after}".encode()]
