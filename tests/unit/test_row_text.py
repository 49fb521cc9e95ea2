"""Rows of text built piece by piece (schemas/columns.RowText, engine/text_kernels.py), against
plain Python: every piece kind, in runs that cut a block anywhere."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamjoin.schemas import columns
from streamjoin.schemas.columns import RowText
from tests.profiles import examples

INT64 = st.integers(-(1 << 63), (1 << 63) - 1)
UINT64 = st.integers(0, (1 << 64) - 1)
TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=10)  # UTF-8 exists for these
PIECES = ("same", "decimal", "hex", "utf8", "json", "fixed", "each")


def _piece(kind: str, rows: int) -> st.SearchStrategy:
    values = {"same": TEXT,
              "decimal": st.lists(INT64, min_size=rows, max_size=rows),
              "hex": st.lists(UINT64, min_size=rows, max_size=rows),
              "utf8": st.lists(TEXT, min_size=rows, max_size=rows),
              "json": st.lists(TEXT, min_size=rows, max_size=rows),
              "fixed": st.lists(st.binary(max_size=6), min_size=rows, max_size=rows),
              "each": st.lists(st.binary(max_size=6), min_size=rows, max_size=rows)}[kind]
    return values.map(lambda v: (kind, v))


@st.composite
def pieces(draw: st.DrawFn) -> tuple[int, list[tuple[str, object]]]:
    rows = draw(st.integers(0, 12))
    kinds = draw(st.lists(st.sampled_from(PIECES), max_size=8))
    return rows, [draw(_piece(kind, rows)) for kind in kinds]


def _expected(kind: str, values: object, row: int) -> bytes:
    """Row `row`'s bytes of one piece, as plain Python writes them."""
    if kind == "same":
        return values.encode()  # type: ignore[union-attr]
    value = values[row]  # type: ignore[index]
    if kind == "decimal":
        return str(value).encode()
    if kind == "hex":
        return f"{value:016x}".encode()
    if kind == "each":
        return value
    if kind == "fixed":
        return np.array([value], dtype=bytes).tolist()[0]  # what a 'S' column holds: trailing NULs cut
    text = np.array([value], dtype=str).tolist()[0]  # and a 'U' one
    return (json.dumps(text, ensure_ascii=False)[1:-1] if kind == "json" else text).encode()


def _append(text: RowText, kind: str, values: object) -> None:
    if kind == "same":
        text.same(values)  # type: ignore[arg-type]
    elif kind == "decimal":
        text.decimal(np.array(values, np.int64))
    elif kind == "hex":
        text.hex(np.array(values, np.uint64))
    elif kind in ("utf8", "json"):
        column = np.array(values, dtype=str) if values else np.zeros(0, "U1")
        assert text.utf8(column, json_escape=kind == "json")
    elif kind == "fixed":
        column = np.array(values, dtype=bytes) if values else np.zeros(0, "S1")
        text.fixed(column.view(np.uint8).reshape(len(column), column.dtype.itemsize))
    else:
        text.each(pa.array(values, pa.binary()))


@settings(max_examples=examples(300), deadline=None)
@given(case=pieces(), run_bytes=st.sampled_from([1, 7, 64, columns.RUN_BYTES]))
def test_rows_are_their_pieces_end_to_end(case: tuple[int, list[tuple[str, object]]], run_bytes: int) -> None:
    """Each row's record is its pieces in order, whatever runs the block is written in."""
    rows, parts = case
    expected = [b"".join(_expected(kind, values, row) for kind, values in parts) for row in range(rows)]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(columns, "RUN_BYTES", run_bytes)
        for arrow_type in (pa.large_binary(), pa.large_string()):
            text = RowText(arrow_type, rows)
            for kind, values in parts:
                _append(text, kind, values)
            got = text.join()
            assert got.type == arrow_type and len(got) == rows
            assert got.cast(pa.large_binary()).to_pylist() == expected


def test_json_escapes_are_json_dumps_own() -> None:
    """Every code point below 0x80, alone in a row and all in one, and some above, escaped as
    json.dumps(ensure_ascii=False) does."""
    alone = [f"{chr(code)}x" for code in range(1, 0x80)]
    text = np.array([*alone, "".join(map(chr, range(1, 0x80))), "é€\U0001d11e\x7f", "a\x00b"], dtype=str)
    rows = RowText(pa.large_string(), len(text))
    assert rows.utf8(text, json_escape=True)
    assert rows.join().to_pylist() == [json.dumps(t, ensure_ascii=False)[1:-1] for t in text.tolist()]


def test_text_without_utf8_is_refused_and_nothing_appended() -> None:
    """A lone surrogate has no UTF-8: utf8() says so, and the rows stay as they were."""
    rows = RowText(pa.large_binary(), 2)
    rows.same("x")
    assert not rows.utf8(np.array(["ok", "bad\ud800"], dtype=str))
    assert rows.join().to_pylist() == [b"x", b"x"]
