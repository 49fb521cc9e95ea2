"""Block columns as Arrow arrays (schemas/columns.py): byte for byte what NumPy holds,
ASCII fast path and general path alike, interior NULs kept."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from streamjoin.schemas.columns import binary_array, string_array

ascii_text = st.text(st.characters(min_codepoint=0, max_codepoint=0x7F), max_size=12)
any_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)


@settings(max_examples=300, deadline=None)
@given(values=st.lists(st.one_of(ascii_text, any_text), max_size=30))
def test_a_str_column_is_the_text_numpy_holds(values: list[str]) -> None:
    column = np.array(values, dtype=str) if values else np.zeros(0, "U1")
    assert string_array(column).to_pylist() == column.tolist()  # NumPy's own values: trailing NULs cut
    assert string_array(column).type == pa.large_string()


@settings(max_examples=200, deadline=None)
@given(values=st.lists(st.binary(max_size=12), max_size=30))
def test_a_bytes_column_is_the_bytes_numpy_holds(values: list[bytes]) -> None:
    column = np.array(values, dtype=bytes) if values else np.zeros(0, "S1")
    assert binary_array(column).to_pylist() == column.tolist()
