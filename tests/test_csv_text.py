"""The column-wise CSV writer writes what Python's formatting writes row by row (issue 31, item 4)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from splitplan.base import csv_text

# Values where a shortcut would go wrong: rounding ties (as binary floats sit on either side),
# negative zero and negatives, values too large for exact integers, and no value at all.
AWKWARD = [0.0, -0.0, 0.0005, 0.0015, 0.0025, 1.0005, 2.675, 0.9995, 0.99949999, 123.4565, 999.9995, -1.2, -0.0004,
           1e12, 1.5e15, 2.0**53, 1e300, np.nan, np.inf, -np.inf, 5e-324]


def _python(columns: list[tuple[str, object]], n: int) -> list[str]:
    def cell(kind, spec, i):
        if kind == "int":
            return str(int(spec[i]))
        if kind == "label":
            names, index = spec
            return names[index[i]]
        values, digits, scale = spec
        with np.errstate(over="ignore"):
            x = values[i] * scale
        return format(x, f".{digits}f") if np.isfinite(x) else ""
    return [",".join(cell(kind, spec, i) for kind, spec in columns) for i in range(n)]


def _writer(kind, spec):
    if kind == "int":
        return csv_text.integers(spec)
    if kind == "label":
        return csv_text.labels(*spec)
    values, digits, scale = spec
    return csv_text.fixed(values, digits, scale)


floats = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from(AWKWARD),
                   st.integers(0, 10**7).map(lambda k: k / 1000), st.integers(0, 10**7).map(lambda k: (k + 0.5) / 1000),
                   st.floats(0, 1e4))


@settings(max_examples=300, deadline=None)
@given(rows=st.lists(st.tuples(floats, floats, st.integers(-(2**62), 2**62), st.integers(0, 3)), min_size=1, max_size=40),
       digits=st.sampled_from([0, 1, 3, 6]), block=st.sampled_from([1, 3, 50_000]))
def test_the_text_is_python_formatting_row_by_row(rows, digits, block):
    a, b, whole, label = (np.array(c) for c in zip(*rows, strict=True))
    names = ["prompt:h100-80gb:tp8:0", "x", "", "token:a100-80gb:tp4:12"]
    columns = [("float", (a, digits, 1.0)), ("float", (b, 3, 1e3)), ("int", whole), ("label", (names, label)),
               ("int", np.arange(len(rows)))]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(csv_text, "ROWS_PER_BLOCK", block)
        text = csv_text.csv_text(["a", "b", "c", "d", "e"], [_writer(k, s) for k, s in columns], len(rows))
    assert text == "a,b,c,d,e\n" + "".join(line + "\n" for line in _python(columns, len(rows)))


@pytest.mark.parametrize("value", AWKWARD)
@pytest.mark.parametrize("digits", [3, 6])
def test_each_awkward_value_alone(value, digits):
    text = csv_text.csv_text(["x"], [csv_text.fixed([value], digits)], 1)
    assert text == "x\n" + (format(value, f".{digits}f") if np.isfinite(value) else "") + "\n"


def test_no_rows_is_the_header_alone():
    assert csv_text.csv_text(["a", "b"], [csv_text.integers([]), csv_text.fixed([], 3)], 0) == "a,b\n"
