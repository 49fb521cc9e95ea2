"""Codecs: whole-batch JSON decoding with exact reasons for the records that
cannot be tuples; Avro and Arrow IPC blocks round-trip."""

from __future__ import annotations

import io
import json

import fastavro
import numpy as np

from streamjoin.engine.block import ARR, KEY, OFF, PART, TS, Block
from streamjoin.schemas.codecs import (BLOCK_SHIFT, avro_schema, decode_avro, decode_block, decode_blocks, decode_json,
                            encode_block)
from streamjoin.settings import StreamSpec

SPEC = StreamSpec(name="r", fields={"k": "int", "ts": "int", "pad": "str", "x": "float"}, time_field="ts",
                  key_fields=["k"], window={"range_ms": 10})


def _meta(n: int):
    return np.zeros(n, np.int32), np.arange(100, 100 + n, dtype=np.int64), np.full(n, 7, np.int64)


def test_json_batch_decodes_to_columns() -> None:
    values = [json.dumps({"k": i, "ts": 1000 + i, "pad": "p" * i, "x": i / 2, "extra": 1}).encode() for i in range(5)]
    out = decode_json(SPEC, values, *_meta(5))
    assert out.rejects == []
    b = out.block
    assert b[KEY].tolist() == [0, 1, 2, 3, 4] and b[TS].tolist() == [1000, 1001, 1002, 1003, 1004]
    assert b[OFF].tolist() == [100, 101, 102, 103, 104] and b[ARR].tolist() == [7] * 5 and b[PART].tolist() == [0] * 5
    assert b["pad"].tolist() == ["", "p", "pp", "ppp", "pppp"] and b["x"].tolist() == [0, 0.5, 1, 1.5, 2]


def test_json_bad_records_are_rejected_with_reasons_and_the_rest_kept() -> None:
    good = {"k": 1, "ts": 5, "pad": "a", "x": 1.0}
    values = [
        json.dumps(good).encode(),
        b"{not json",
        json.dumps({**good, "k": "one"}).encode(),
        json.dumps({k: v for k, v in good.items() if k != "ts"}).encode(),
        None,
        b'{"k": 2,\n "ts": 6, "pad": "b", "x": 2.0}',  # valid JSON over two lines: good
        json.dumps([1, 2]).encode(),
        json.dumps({**good, "k": 3}).encode(),
    ]
    out = decode_json(SPEC, values, *_meta(len(values)))
    assert out.block[KEY].tolist() == [1, 2, 3]
    reasons = {r.index: r.detail for r in out.rejects}
    assert set(reasons) == {1, 2, 3, 4, 6}
    assert "not JSON" in reasons[1]
    assert "'k' should be int" in reasons[2]
    assert "missing field 'ts'" in reasons[3]
    assert "empty" in reasons[4]
    assert "object" in reasons[6]
    assert all(r.reason == "malformed" for r in out.rejects)


def test_a_str_value_ending_in_nul_is_unsupported_and_an_inner_nul_is_kept() -> None:
    """NumPy text columns end a value at its last non-NUL character: "a\\u0000" would join as "a"."""
    good = {"k": 1, "ts": 5, "x": 1.0}
    values = [json.dumps({**good, "pad": p}).encode() for p in ("a\u0000", "a\u0000b", "a", "\u0000")]
    for decode in (decode_json, _avro_decoder()):
        out = decode(SPEC, values, *_meta(len(values)))
        assert [(r.index, r.reason) for r in out.rejects] == [(0, "unsupported"), (3, "unsupported")]
        assert out.block["pad"].tolist() == ["a\u0000b", "a"]


def _avro_decoder():  # type: ignore[no-untyped-def]
    """decode_avro over the same documents, each written with the stream's Avro schema."""
    schema = fastavro.parse_schema(avro_schema(SPEC))

    def decode(spec: StreamSpec, values: list[bytes], *meta):  # type: ignore[no-untyped-def]
        framed = []
        for v in values:
            buf = io.BytesIO()
            fastavro.schemaless_writer(buf, schema, json.loads(v))
            framed.append(buf.getvalue())
        return decode_avro(spec, framed, *meta)
    return decode


def test_avro_records_round_trip_and_bad_bytes_are_rejected() -> None:
    schema = fastavro.parse_schema(avro_schema(SPEC))
    values = []
    for i in range(3):
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, schema, {"k": i, "ts": 10 * i, "pad": "z", "x": 0.25})
        values.append(buf.getvalue())
    values.append(b"\xff")
    out = decode_avro(SPEC, values, *_meta(4))
    assert out.block[KEY].tolist() == [0, 1, 2] and out.block[TS].tolist() == [0, 10, 20]
    assert [r.index for r in out.rejects] == [3]


def test_block_records_give_each_tuple_a_unique_offset() -> None:
    rows = Block({"k": np.array([5, 6]), "ts": np.array([1, 2]), "pad": np.array(["a", "b"]),
                  "x": np.array([0.0, 1.0])})
    bad_utf8 = encode_block(rows).replace(b"\x00\x00a", b"\x00\x00\xff")  # reads fine, then fails to convert
    values = [encode_block(rows), b"garbage", encode_block(rows), b"\x00" + encode_block(rows), bad_utf8]
    out = decode_blocks(SPEC, values, np.zeros(5, np.int32), np.array([40, 41, 42, 43, 44]), np.zeros(5, np.int64))
    assert out.block[KEY].tolist() == [5, 6, 5, 6]
    assert out.block[OFF].tolist() == [40 << BLOCK_SHIFT, (40 << BLOCK_SHIFT) + 1, 42 << BLOCK_SHIFT,
                                       (42 << BLOCK_SHIFT) + 1]
    assert [r.index for r in out.rejects] == [1, 3, 4]  # a damaged IPC stream raises OSError inside Arrow
    assert "UTF8" in out.rejects[2].detail


def test_internal_block_codec_round_trips_every_dtype() -> None:
    b = Block({"i": np.array([1, -2], np.int64), "u": np.array([3, 4], np.uint64), "f": np.array([0.5, 1.5]),
               "s": np.array(["x", "yé"]), "b": np.array([True, False]),
               "nul": np.array(["a\x00b", "\x00"]), "raw": np.array([b"\x00\x01", b"z"]),
               "img": np.array([b"\x05\x00", b"\x07\x00"], "S2"), "txt": np.array(["a", "b"], "U4")})
    back = decode_block(encode_block(b))
    for name in b.names:
        assert back[name].tolist() == b[name].tolist()
        assert back[name].dtype == b[name].dtype, name  # widths too: every value of img ends in NUL


def test_an_image_ending_in_zero_bytes_crosses_a_ring_hop_and_still_matches() -> None:
    """Arrow drops a value's trailing NULs; a hop must still deliver the width that was sent, or
    pixel_similarity compares images of unequal widths (it once raised: a udf-error, and the
    results of that tuple went missing)."""
    from streamjoin.engine.psp.messages import Build
    from streamjoin.engine.udfs import pixel_similarity
    from streamjoin.schemas import ring as wire

    image = np.frombuffer(bytes([9] * 29 + [0]), "S30")
    sent = Build(3, 0, Block({"img": image}))
    got = wire.decode(*wire.encode(sent, 1))
    assert got.tuples["img"].dtype == image.dtype
    assert pixel_similarity(got.tuples["img"], image).tolist() == [True]
    assert pixel_similarity(image, np.frombuffer(bytes([9] * 29), "S29")).tolist() == [True]  # widths may differ
