"""The plain-JSON scanner (engine/json_scan.py) against Arrow's reader: whatever batch it
accepts, it reads exactly as Arrow does; and it does accept what producers commonly write."""

from __future__ import annotations

import io
import json

import numpy as np
import pyarrow as pa
import pyarrow.json as pajson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamjoin.schemas import codecs
from streamjoin.schemas.codecs import arrow_schema, decode_json
from streamjoin.settings import StreamSpec
from tests.profiles import examples

SPEC = StreamSpec(name="r", fields={"k": "int", "ts": "int", "pad": "str"}, time_field="ts", key_fields=["k"],
                  window={"range_ms": 10})

def _mostly(plain: st.SearchStrategy, odd: st.SearchStrategy) -> st.SearchStrategy:
    """`plain` 19 times in 20, else `odd`: most lines stay plain but for one odd spelling, so the
    scanner reads many batches and meets each odd spelling beside plain ones."""
    return st.integers(0, 19).flatmap(lambda n: plain if n else odd)


# Values near and past what the plain form takes: digit counts around 18-19, leading zeros,
# signs, floats, escapes, non-ASCII, control characters, nested values, other JSON types.
INTEGERS = st.one_of(st.integers(-10 ** 18, 10 ** 18), st.sampled_from([2 ** 63 - 1, -2 ** 63, 10 ** 19, 0]))
SPELLED_INTS = _mostly(INTEGERS.map(str), st.sampled_from(["-0", "007", "00", "1.0", "1e3", "-", "", "+1", " 1", "true",
                                                           "null", '"5"', "[1]", "9" * 18, "9" * 19, "-" + "9" * 18]))
PRINTABLE = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=6)
SPELLED_TEXT = _mostly(PRINTABLE.map(json.dumps), st.one_of(
    st.text(st.characters(max_codepoint=0x2FF), max_size=6).map(lambda t: json.dumps(t, ensure_ascii=False)),
    st.text(st.characters(max_codepoint=0x2FF), max_size=6).map(json.dumps),
    st.text(max_size=4).map(lambda t: f'"{t}"'), st.sampled_from(["5", "null", '"a"x', '"', '{"a":1}', '"\x7f"'])))
ODD_NAMES = st.sampled_from(['"x"', '"k "', '"\\u006b"', "k", '"K"', '""', '"pad"', '"ts"'])


@st.composite
def lines(draw: st.DrawFn) -> bytes:
    """One record: the stream's fields in any order, each spelled plainly or otherwise (values
    near and past the plain form, names escaped or unknown), sometimes one missing or one extra,
    with or without whitespace and trailing bytes."""
    pairs = []
    for name in draw(st.permutations(["k", "ts", "pad"])):
        if draw(st.integers(0, 19)) == 0:
            continue  # missing
        spelled = draw(_mostly(st.just(f'"{name}"'), ODD_NAMES))
        value = draw(SPELLED_TEXT if name == "pad" else SPELLED_INTS)
        pairs.append(f"{spelled}{draw(_mostly(st.just(':'), st.just(': ')))}{value}")
    if draw(st.integers(0, 19)) == 0:
        pairs.insert(draw(st.integers(0, len(pairs))), f"{draw(ODD_NAMES)}:{draw(SPELLED_INTS)}")
    separator = draw(_mostly(st.just(","), st.sampled_from([", ", " ,"])))
    return ("{" + separator.join(pairs) + "}" + draw(_mostly(st.just(""), st.sampled_from([" ", "}", "\t"])))).encode()


def _arrow(lines_joined: bytes) -> pa.Table | None:
    opts = pajson.ParseOptions(explicit_schema=arrow_schema(SPEC), unexpected_field_behavior="ignore")
    try:
        return pajson.read_json(io.BytesIO(lines_joined), parse_options=opts).combine_chunks()
    except pa.ArrowException:
        return None


@settings(max_examples=examples(300), deadline=None)
@given(records=st.lists(lines(), min_size=1, max_size=2))
def test_a_batch_the_scanner_reads_is_what_arrow_reads(records: list[bytes]) -> None:
    joined = b"\n".join(records)
    plain = codecs._plain_table(SPEC, joined, len(records))
    if plain is None:
        return
    arrow = _arrow(joined)
    assert arrow is not None and arrow.num_rows == len(records)
    assert plain.schema == arrow.schema
    assert plain.equals(arrow), (plain.to_pylist(), arrow.to_pylist())


def test_what_producers_write_is_read_without_arrow(monkeypatch: pytest.MonkeyPatch) -> None:
    """Compact JSON of int and str fields, in any key order, is the scanner's: decoded right
    with Arrow's reader out of reach."""
    records = [json.dumps({"pad": "x" * i, "ts": 1000 + i, "k": -i}, separators=(",", ":")).encode() for i in range(50)]

    def no_arrow(*args: object, **kwargs: object) -> None:
        raise AssertionError("Arrow's reader was asked")

    monkeypatch.setattr(pajson, "read_json", no_arrow)
    decoded = decode_json(SPEC, records, np.zeros(50, np.int32), np.arange(50), np.zeros(50, np.int64))
    assert decoded.rejects == []
    assert decoded.block["k"].tolist() == [-i for i in range(50)]
    assert decoded.block["pad"].tolist() == ["x" * i for i in range(50)]


@pytest.mark.parametrize("record", [b'{"k":1, "ts":2,"pad":"a"}', b'{"k":1,"ts":2,"pad":"\\u0061"}',
                                    b'{"k":1,"ts":2}', b'{"k":1,"ts":2,"pad":"a","x":1}', b'{"k":01,"ts":2,"pad":"a"}',
                                    b'{"k":1,"ts":2,"pad":"\xc3\xa9"}', b'{"k":1,"k":1,"ts":2,"pad":"a"}',
                                    b'{"k":1000000000000000000,"ts":2,"pad":"a"}', b'{"k":1,"ts":2,"pad":"a"} '])
def test_anything_but_the_plain_form_is_left_to_arrow(record: bytes) -> None:
    """Whitespace, escapes, missing or extra fields, leading zeros, non-ASCII text, duplicate
    names, 19-digit integers, trailing bytes: the scanner declines the batch."""
    plain = b'{"k":1,"ts":2,"pad":"a"}'
    assert codecs._plain_table(SPEC, plain, 1) is not None
    assert codecs._plain_table(SPEC, plain + b"\n" + record, 2) is None
