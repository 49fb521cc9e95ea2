"""Block columns as Arrow arrays and back (schemas/columns.py): byte for byte what NumPy holds,
ASCII fast path and general path alike, interior NULs kept."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from streamjoin.schemas.columns import binary_array, fixed_width_array, string_array
from tests.profiles import examples

ascii_text = st.text(st.characters(min_codepoint=0, max_codepoint=0x7F), max_size=12)
any_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)


@settings(max_examples=examples(300), deadline=None)
@given(values=st.lists(st.one_of(ascii_text, any_text), max_size=30))
def test_a_str_column_is_the_text_numpy_holds(values: list[str]) -> None:
    column = np.array(values, dtype=str) if values else np.zeros(0, "U1")
    assert string_array(column).to_pylist() == column.tolist()  # NumPy's own values: trailing NULs cut
    assert string_array(column).type == pa.large_string()


@settings(max_examples=examples(200), deadline=None)
@given(values=st.lists(st.binary(max_size=12), max_size=30))
def test_a_bytes_column_is_the_bytes_numpy_holds(values: list[bytes]) -> None:
    column = np.array(values, dtype=bytes) if values else np.zeros(0, "S1")
    assert binary_array(column).to_pylist() == column.tolist()


@settings(max_examples=examples(300), deadline=None)
@given(values=st.lists(st.one_of(st.none(), ascii_text, any_text), max_size=30), start=st.integers(0, 3),
       chunks=st.integers(1, 3), extra_width=st.integers(0, 4))
def test_an_arrow_text_column_becomes_what_numpys_own_cast_makes(values: list[str | None], start: int, chunks: int,
                                                                  extra_width: int) -> None:
    """Slices, chunks, nulls (read as empty), non-ASCII text and a width asked for all give NumPy's
    values; the width is the longest value's (in characters for 'U') unless a wider one is asked."""
    text = pa.array(values, pa.string()).slice(min(start, len(values)))
    expected = text.fill_null("").to_numpy(zero_copy_only=False).astype("U")
    cut = max(1, len(text) // chunks)
    chunked = pa.chunked_array([text[i:i + cut] for i in range(0, len(text), cut)] or [text], pa.string())
    for arrow in (text, chunked, text.cast(pa.large_string())):
        got = fixed_width_array(arrow, "U")
        assert got.tolist() == expected.tolist()
        assert got.dtype.itemsize == max(expected.dtype.itemsize, 4)
    wide = expected.dtype.itemsize // 4 + extra_width
    assert fixed_width_array(text, "U", wide).dtype == np.dtype(f"U{max(wide, 1)}")
    as_bytes = text.cast(pa.binary())
    assert fixed_width_array(as_bytes, "S").tolist() == as_bytes.fill_null(b"").to_numpy(zero_copy_only=False) \
        .astype("S").tolist()
