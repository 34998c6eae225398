"""The vectorised ``live_lag`` columns (:mod:`api.sql.columns`) round as Python does: every
instant's microsecond as ``datetime.fromtimestamp``, every age's millisecond as ``round(x, 3)``
(the REST answers' rounding), including values an ulp from a tie."""

from __future__ import annotations

import math
from datetime import UTC, datetime

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from api.sql.columns import micros, milliseconds
from api.sql.live import _micros

_INSTANTS = st.floats(0.0, 4.0e9, allow_nan=False, allow_infinity=False)


@st.composite
def _near_ties(draw: st.DrawFn, scale: float) -> float:
    """A value within a few ulps of ``(k + 0.5) / scale``: where scaling, then rounding, could
    go the other way."""
    k = draw(st.integers(0, 4 * 10**9))
    value = (k + 0.5) / scale
    for _ in range(draw(st.integers(0, 3))):
        value = math.nextafter(value, math.inf if draw(st.booleans()) else -math.inf)
    return value


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(_INSTANTS, _near_ties(1e6)), min_size=1, max_size=50))
def test_instants_round_to_the_microsecond_as_datetime(values: list[float]) -> None:
    got = micros(pa.array(values, pa.float64()))
    assert got.cast(pa.int64()).to_pylist() == [_micros(v) for v in values]
    assert got.to_pylist() == [datetime.fromtimestamp(v, UTC) for v in values]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.floats(0.0, 1.0e9, allow_nan=False), _near_ties(1e3)), min_size=1, max_size=50))
def test_ages_round_to_the_millisecond_as_python(values: list[float]) -> None:
    assert milliseconds(pa.array(values, pa.float64())).to_pylist() == [round(v, 3) for v in values]
