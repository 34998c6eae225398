"""The registration body parsed in slices (``api.schema.bodies``) against the whole-body parser
(``api.schema.parsing.parse_registration``): the same request, or the same refusal."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from api.schema.bodies import SLICE, parse_registration_sliced
from api.schema.parsing import InvalidRequest, MalformedJSON, parse_registration
from tests.strategies import nested_bodies


def _outcome(parse: Any, data: bytes, exact: bool = False) -> tuple[str, Any]:
    """The request, or the refusal: its message (an invalid request's only if ``exact``: with
    several mistakes the one reported may differ)."""
    try:
        return "ok", parse(data)
    except MalformedJSON as error:
        return "malformed", str(error)
    except InvalidRequest as error:
        return "invalid", str(error) if exact else None


def _chain(nodes: int) -> dict[str, Any]:
    return {"name": "chain", "nodes": [{"id": i, "inputs": min(i, 1), "outputs": 1} for i in range(nodes)],
            "edges": [{"source": {"node": i, "port": 0}, "target": {"node": i + 1, "port": 0}}
                      for i in range(nodes - 1)]}


_SIGNIFICANT = [b"{", b"}", b"[", b"]", b",", b":", b'"', b"\\", b" ", b"\n", b"0", b"-", b"e", b"x", b"\xff",
                b"\xc3", b"null", b"1e999", b"18446744073709551616", b"\\u00e9", b'"nodes"', b'"\\ud800"']


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_the_sliced_parser_accepts_and_refuses_what_the_whole_body_parser_does(data: st.DataObject) -> None:
    body = data.draw(st.one_of(nested_bodies().map(lambda drawn: drawn[1]),
                               st.integers(1, 3 * SLICE).map(_chain)))
    separators = data.draw(st.sampled_from([(",", ":"), (", ", ": "), (" ,\n", " :\t")]))
    text = json.dumps(body, separators=separators, ensure_ascii=data.draw(st.booleans())).encode()
    for _ in range(data.draw(st.integers(0, 2))):  # a few bytes deleted, inserted or replaced
        at = data.draw(st.integers(0, len(text)))
        cut = data.draw(st.integers(0, 3))
        text = text[:at] + data.draw(st.sampled_from(_SIGNIFICANT)) * data.draw(st.integers(0, 1)) + text[at + cut:]
    whole, sliced = _outcome(parse_registration, text), _outcome(parse_registration_sliced, text)
    assert sliced == whole, text[:300]


_PAIR = ('"nodes": [{"id": 0, "inputs": 0, "outputs": 1}, {"id": 1, "inputs": 1, "outputs": 0}], '
         '"edges": [{"source": {"node": 0, "port": 0}, "target": {"node": 1, "port": 0}}]')


@pytest.mark.parametrize("text", [
    '{"name": "p", ' + _PAIR + '}',
    ' \n{"name":"p",' + _PAIR.replace(" ", "") + '}\t',
    '{"name": "p", ' + _PAIR + ', "nodes": []}',  # a repeated key: the last one counts
    '{"name": "p", ' + _PAIR + ', "nodes": 5}',
    '{"name": "p", "nod\\u0065s": [{"id": 0, "inputs": 0, "outputs": 1}], "edges": []}',
    '{"name": "p", "nodes": [{"id": 0, "inputs": 0, "outputs": 18446744073709551616}], "edges": []}',
    '{"name": "p", "nodes": [{"id": 0, "inputs": 0, "outputs": 1e999}], "edges": []}',
    '{"nodes": [{"id": 0, "inputs": 0, "outputs": 1e999}], "edges": []}',
    '{"name": "p", "nodes": [{"id": 0, "inputs": 0, "outputs": 1}, ], "edges": []}',
    '{"name": "p", "nodes": [], "edges": [], }',
    '{"name": "p", "nodes": [], "edges": []} []',
    '[]', '', '{}', '{"name": "p", "nodes": {}, "edges": []}',
    '{"name": "p", "nodes": [' + ",".join(f'{{"id": {i}, "inputs": 0, "outputs": 1}}' for i in range(200)) + '], '
    '"edges": [], "initial": [{"location": {"node": 0, "port": 0, "kind": "source"}, "time": [0], "delta": 0}]}',
])
def test_the_sliced_parser_agrees_on_corner_cases(text: str) -> None:
    data = text.encode()
    assert _outcome(parse_registration_sliced, data, exact=True) == _outcome(parse_registration, data, exact=True)
