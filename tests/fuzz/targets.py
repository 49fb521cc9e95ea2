"""Fuzz targets, one per record decoder: bytes in, the decoder's verdict checked
(plus `cql`, the query parser's, in tests/fuzz/query_target.py, and `split`, the slots'
record decoder's, in tests/fuzz/split_target.py).

A fuzz input is a poll of records: its bytes split at RS (0x1e), each piece one
record value, an empty piece a tombstone, followed by one known good record.
The `json-fields` target reads its bytes as choices instead: per record, per
declared field, one of many awkward JSON values (or none), so it explores type
confusion that byte mutation of JSON text seldom reaches.
Whatever the bytes, a decoder must return a `Decoded` whose tuples and rejects
account for the records without overlap, reject only with a reason, and decode
the good record. Used by tests/fuzz/fuzz.py (atheris, coverage-guided) and by
tests/unit/test_fuzz_corpus.py (the kept corpus, as a regression test).
"""

from __future__ import annotations

import io
import json
from typing import Callable

import fastavro
import numpy as np

from streamjoin.engine.block import KEY, Block
from streamjoin.schemas.codecs import DECODERS, Decoded, avro_schema, encode_block
from streamjoin.settings import StreamSpec
from tests.fuzz.query_target import check_query_text
from tests.fuzz.split_target import check_split_record

SPEC = StreamSpec(name="f", fields={"k": "int", "ts": "int", "v": "str", "w": "float", "b": "bool", "raw": "bytes"},
                  time_field="ts", key_fields=["k"], window={"range_ms": 10})
SEPARATOR = b"\x1e"
GOOD_KEY = 424242
_GOOD_ROW = {"k": GOOD_KEY, "ts": 7, "v": "good", "w": 1.5, "b": True, "raw": "AA=="}


def good_record(decoder: str) -> bytes:
    """One record every decoder must take, in `decoder`'s format."""
    if decoder == "json":
        return json.dumps(_GOOD_ROW).encode()
    if decoder == "avro":
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, fastavro.parse_schema(avro_schema(SPEC)), {**_GOOD_ROW, "raw": b"\x00"})
        return buf.getvalue()
    return encode_block(Block({"k": np.array([GOOD_KEY]), "ts": np.array([7]), "v": np.array(["good"]),
                               "w": np.array([1.5]), "b": np.array([True]), "raw": np.array([b"\x01"])}))


def records_of(data: bytes) -> list[bytes | None]:
    """The poll a fuzz input stands for (without the good record)."""
    return [piece or None for piece in data.split(SEPARATOR)] if data else []


_ABSENT = object()
# Values a field of a JSON record may hold, good and awkward, for `json-fields`.
_FIELD_VALUES: list[object] = [
    _ABSENT, None, 0, 7, -1, (1 << 63) - 1, -(1 << 63), 1 << 63, -(1 << 63) - 1, 1 << 70, 2 ** 53 + 1, 1 << 61,
    0.5, -0.0, 1e308, float("nan"), float("inf"), float("-inf"), "", "x", "9", "\x00", "\ud800", "é" * 50, True, False,
    [], [1, 2], {}, {"a": {"b": [1]}}, [[[[[[[[[[]]]]]]]]]], "AA==",
]


def structured_json_records(data: bytes) -> list[bytes | None]:
    """A poll of JSON objects chosen by `data`: one byte per declared field picks its value
    (or leaves it out), one more picks how the object is written (ASCII-escaped or raw, which
    turns a lone surrogate into invalid UTF-8; on one line or pretty-printed over several)."""
    fields, width = list(SPEC.fields), len(SPEC.fields) + 1
    out: list[bytes | None] = []
    for at in range(0, len(data) - width + 1, width):
        choice = data[at:at + width]
        obj = {f: _FIELD_VALUES[c % len(_FIELD_VALUES)] for f, c in zip(fields, choice)}
        text = json.dumps({f: v for f, v in obj.items() if v is not _ABSENT}, ensure_ascii=choice[-1] % 2 == 0,
                          indent=2 if choice[-1] & 2 else None)
        out.append(text.encode("utf-8", "surrogatepass"))
    return out


def check(decoder: str, data: bytes) -> Decoded:
    """Decode the poll `data` stands for plus a good record with `decoder` (json, avro, blocks,
    or json-fields: the json decoder on structured_json_records); raise AssertionError
    if the verdict does not account for every record (any other exception is a decoder bug)."""
    if decoder == "json-fields":
        decoder, polled = "json", structured_json_records(data)
    else:
        polled = records_of(data)
    values = polled + [good_record(decoder)]
    n = len(values)
    out = DECODERS[decoder](SPEC, values, np.zeros(n, np.int32), np.arange(n, dtype=np.int64), np.zeros(n, np.int64))
    assert isinstance(out, Decoded)
    taken, rejected = set(out.records.tolist()), [r.index for r in out.rejects]
    assert len(out.records) == len(out.block), "one record position per tuple"
    assert len(rejected) == len(set(rejected)) and not taken & set(rejected), "a record both taken and rejected"
    assert taken | set(rejected) <= set(range(n)), "a verdict on a record that is not there"
    if decoder != "blocks":  # a block record may hold no tuples; a JSON/Avro record is one tuple or a reject
        assert taken | set(rejected) == set(range(n)), "a record neither taken nor rejected"
    assert all(r.reason in ("malformed", "oversize", "unsupported") and r.detail for r in out.rejects)
    assert n - 1 in taken and out.block[KEY][out.records == n - 1].tolist() == [GOOD_KEY], "the good record was lost"
    for i, v in enumerate(values[:-1]):  # a record's fate must not depend on its neighbours (replay decodes fewer)
        alone = DECODERS[decoder](SPEC, [v], np.zeros(1, np.int32), np.zeros(1, np.int64), np.zeros(1, np.int64))
        assert bool(alone.rejects) == (i in rejected), f"record {i} is judged otherwise alone"
    return out


def target(decoder: str) -> Callable[[bytes], None]:
    """The libFuzzer entry point for `decoder`, the query parser (`cql`) or the slots' records (`split`)."""
    if decoder == "cql":
        return check_query_text
    if decoder == "split":
        return check_split_record

    def one_input(data: bytes) -> None:
        check(decoder, data)
    return one_input
