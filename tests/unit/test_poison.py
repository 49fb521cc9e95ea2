"""Poison records: whatever a record's bytes or headers, the decoders and the intake
never raise; each hostile record is refused once with its reason (malformed,
unknown-stream, future, ...), and the good records beside it decode as usual."""

from __future__ import annotations

import io
import json

import fastavro
import numpy as np
import pyarrow as pa
import pytest

from streamjoin.engine.block import KEY, OFF, TS, Block
from streamjoin.schemas.codecs import (BLOCK_INDEX, BLOCK_SHIFT, avro_schema, decode_avro, decode_blocks, decode_json,
                                       encode_block)
from streamjoin.services.io.intake import (FUTURE, H_ORIGIN_OFFSET, H_ORIGIN_PARTITION, STREAM_HEADER, RecordBuffer,
    decode_by_group, origin_of, routing_for)
from streamjoin.settings import JobSettings, SettingsError, StreamSpec, load
from tests.unit.test_intake import Msg

FIELDS = {"k": "int", "ts": "int", "v": "str", "w": "float"}
SPEC = StreamSpec(name="r", fields=FIELDS, time_field="ts", key_fields=["k"], window={"range_ms": 10})
GOOD = {"k": 1, "ts": 5, "v": "x", "w": 0.5}
NOW = 1_000_000


def job(fmt: str = "json", max_future_ms: int | None = 300_000) -> JobSettings:
    """A 2-way job with one partition (so no record is misrouted) in the given format."""
    streams = [{"name": n, "format": fmt, "fields": FIELDS, "time_field": "ts", "key_fields": ["k"],
                "window": {"range_ms": 100}} for n in "rs"]
    return load(None, job="p", partitions=1, streams=streams, join={"max_future_ms": max_future_ms})


def _meta(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return np.zeros(n, np.int32), np.arange(100, 100 + n, dtype=np.int64), np.zeros(n, np.int64)


def _json(**change: object) -> bytes:
    return json.dumps({**GOOD, **change}).encode()


def _without(field: str) -> bytes:
    return json.dumps({k: v for k, v in GOOD.items() if k != field}).encode()


HOSTILE_JSON = {
    "int past int64": (b'{"k": 1180591620717411303424, "ts": 5, "v": "x", "w": 0.5}', "outside int64"),
    "float for int": (_json(k=1.5), "'k' should be int"),
    "float time": (_json(ts=5.25), "'ts' should be int"),
    "NaN": (b'{"k": 1, "ts": 5, "v": "x", "w": NaN}', "not a finite number"),
    "Infinity": (b'{"k": 1, "ts": 5, "v": "x", "w": -Infinity}', "not a finite number"),
    "too big for a double": (b'{"k": 1, "ts": 5, "v": "x", "w": 1e999}', "not a finite number"),
    "string for int": (_json(k="1"), "'k' should be int"),
    "number for string": (_json(v=7), "'v' should be str"),
    "bool for float": (_json(w=True), "'w' should be float"),
    "deep nesting": (b'{"k": ' + b"[" * 50_000 + b"]" * 50_000 + b', "ts": 5, "v": "x", "w": 0.5}', "not JSON"),
    "huge array": (_json(v=list(range(100_000))), "'v' should be str"),
    "invalid UTF-8": (b'{"k": 1, "ts": 5, "v": "\xff\xfe", "w": 0.5}', "not valid UTF-8"),
    "lone surrogate": (b'{"k": 1, "ts": 5, "v": "\\ud800", "w": 0.5}', "not valid UTF-8"),
    "missing key": (_without("k"), "missing field 'k'"),
    "null key": (_json(k=None), "'k'"),
    "missing time": (_without("ts"), "missing field 'ts'"),
    "null time": (_json(ts=None), "'ts'"),
    "time past 2^60": (_json(ts=1 << 61), "outside +-2^60"),
    "empty": (b"", "empty value"),
    "blank": (b"  \t ", "empty value"),
    "tombstone": (None, "empty value"),
    "random bytes": (bytes(range(256)) * 3, "not JSON"),
    "random bytes on one line": (bytes(range(14, 256)), "not JSON"),
    "two objects on one line": (_json() + b" " + _json(), "Extra data"),
    "carriage return between objects": (_json() + b"\r" + _json(), "Extra data"),
    "line break inside a string": (_json(v="a\nb").replace(b"\\n", b"\n"), "Invalid control character"),
    "form feed as whitespace": (b"\x0c" + _json(), "not JSON"),
    "null": (b"null", "must be an object"),  # Arrow's reader segfaults on input that starts with null
    "null after whitespace": (b" \t null", "must be an object"),
    "object then null": (_json() + b" null", "Extra data"),
    "number": (b"5", "must be an object"),
    "byte order mark": (b"\xef\xbb\xbf" + _json(), ""),
    "array": (b"[1, 2]", "must be an object"),
    "duplicate key": (b'{"k": 1, "k": 2, "ts": 5, "v": "x", "w": 0.5}', "more than once"),
    "truncated": (_json()[:-3], "not JSON"),
}


@pytest.mark.parametrize("name", sorted(HOSTILE_JSON))
def test_a_hostile_json_record_is_rejected_and_its_neighbours_decode(name: str) -> None:
    value, words = HOSTILE_JSON[name]
    values = [_json(k=10), value, _json(k=11)]
    out = decode_json(SPEC, values, *_meta(3))
    assert out.block[KEY].tolist() == [10, 11] and out.records.tolist() == [0, 2]
    assert [(r.index, r.reason) for r in out.rejects] == [(1, "malformed")]
    assert words in out.rejects[0].detail, out.rejects[0].detail


def test_every_hostile_json_record_at_once_is_rejected_once() -> None:
    """The bisection finds each bad record however many share the poll."""
    hostile = [v for v, _ in HOSTILE_JSON.values()]
    values = [x for pair in zip([_json(k=i) for i in range(len(hostile))], hostile) for x in pair]
    out = decode_json(SPEC, values, *_meta(len(values)))
    assert out.block[KEY].tolist() == list(range(len(hostile)))
    assert sorted(r.index for r in out.rejects) == list(range(1, len(values), 2))


def test_what_arrow_takes_is_taken_whatever_python_thinks() -> None:
    """An int for a float field, and deep nesting or bad UTF-8 in a field the stream does not
    declare, are good records: the decision is Arrow's, whatever else is in the poll."""
    lenient = [_json(w=3), b'{"k": 2, "ts": 5, "v": "x", "w": 0.5, "z": ' + b"[" * 50_000 + b"]" * 50_000 + b"}",
               b'{"k": 3, "ts": 5, "v": "x", "w": 0.5, "z": "\xff"}']
    for neighbours in ([], [b"{bad"]):
        out = decode_json(SPEC, lenient + neighbours, *_meta(len(lenient) + len(neighbours)))
        assert out.block[KEY].tolist() == [1, 2, 3] and out.block["w"].tolist() == [3.0, 0.5, 0.5]


def _avro(record: dict, schema: dict | None = None) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(schema or avro_schema(SPEC)), record)
    return buf.getvalue()


HOSTILE_AVRO = {
    "truncated": (_avro(GOOD)[:-4], "not Avro"),
    "wrong schema": (_avro({"a": "hello world"}, {"type": "record", "name": "w",
                                                  "fields": [{"name": "a", "type": "string"}]}), "not Avro"),
    "NaN": (_avro({**GOOD, "w": float("nan")}), "not a finite number"),
    "time past 2^60": (_avro({**GOOD, "ts": 1 << 62}), "outside +-2^60"),
    "invalid UTF-8": (_avro(GOOD).replace(b"\x02x", b"\x02\xff"), "not Avro"),
    "random bytes": (b"\xff" * 40, "not Avro"),
    "empty": (b"", "not Avro"),
    "tombstone": (None, "not Avro"),
}


@pytest.mark.parametrize("name", sorted(HOSTILE_AVRO))
def test_a_hostile_avro_record_is_rejected_and_its_neighbours_decode(name: str) -> None:
    value, words = HOSTILE_AVRO[name]
    out = decode_avro(SPEC, [_avro({**GOOD, "k": 10}), value, _avro({**GOOD, "k": 11})], *_meta(3))
    assert out.block[KEY].tolist() == [10, 11] and out.records.tolist() == [0, 2]
    assert [(r.index, r.reason) for r in out.rejects] == [(1, "malformed")]
    assert words in out.rejects[0].detail, out.rejects[0].detail


def _block(n: int = 2, **change: np.ndarray) -> bytes:
    cols = {"k": np.arange(n, dtype=np.int64), "ts": np.full(n, 5, np.int64), "v": np.full(n, "x"),
            "w": np.full(n, 0.5)}
    return encode_block(Block(cols | change))


def _ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return sink.getvalue().to_pybytes()


GOOD_TABLE = pa.table({"k": [1, 2], "ts": [5, 5], "v": ["x", "y"], "w": [0.5, 0.5]})
HOSTILE_BLOCKS = {
    "missing field": (_ipc(GOOD_TABLE.drop_columns(["v"])), "not an Arrow IPC block"),
    "string for int": (_ipc(GOOD_TABLE.set_column(0, "k", pa.array(["a", "b"]))), "not an Arrow IPC block"),
    "fractional float for int": (_ipc(GOOD_TABLE.set_column(0, "k", pa.array([1.5, 2.0]))), "not an Arrow IPC block"),
    "struct for string": (_ipc(GOOD_TABLE.set_column(2, "v", pa.array([{"a": 1}, {"a": 2}]))), "not an Arrow IPC"),
    "null key": (_ipc(GOOD_TABLE.set_column(0, "k", pa.array([1, None], pa.int64()))), "missing field 'k' (or null)"),
    "NaN": (_block(w=np.array([0.5, np.nan])), "not a finite number"),
    "time past 2^60": (_block(ts=np.array([5, 1 << 61])), "outside +-2^60"),
    "tuple index out of range": (_block(**{BLOCK_INDEX: np.array([0, 1 << BLOCK_SHIFT], np.int32)}), "_sj_index"),
    "truncated": (_block()[:-20], "not an Arrow IPC block"),
    "random bytes": (bytes(range(256)), "not an Arrow IPC block"),
    "tombstone": (None, "not an Arrow IPC block"),
}


@pytest.mark.parametrize("name", sorted(HOSTILE_BLOCKS))
def test_a_hostile_block_record_is_rejected_whole_and_its_neighbours_decode(name: str) -> None:
    value, words = HOSTILE_BLOCKS[name]
    out = decode_blocks(SPEC, [_block(), value, _block()], *_meta(3))
    assert out.block[KEY].tolist() == [0, 1, 0, 1] and out.records.tolist() == [0, 0, 2, 2]
    assert out.block[OFF].tolist() == [100 << BLOCK_SHIFT, (100 << BLOCK_SHIFT) + 1, 102 << BLOCK_SHIFT,
                                       (102 << BLOCK_SHIFT) + 1]
    assert [(r.index, r.reason) for r in out.rejects] == [(1, "malformed")]
    assert words in out.rejects[0].detail, out.rejects[0].detail


def test_a_block_with_more_tuples_than_the_offset_encoding_holds_is_rejected() -> None:
    n = (1 << BLOCK_SHIFT) + 1
    big = encode_block(Block({"k": np.zeros(n, np.int64), "ts": np.zeros(n, np.int64), "v": np.full(n, ""),
                              "w": np.zeros(n)}))
    out = decode_blocks(SPEC, [big, _block()], *_meta(2))
    assert out.block[KEY].tolist() == [0, 1]
    assert [r.index for r in out.rejects] == [0] and "tuple indexes" in out.rejects[0].detail


@pytest.mark.parametrize("compression", ["zstd", "lz4", None])
def test_a_block_that_would_expand_past_max_block_bytes_is_oversize_before_it_is_decompressed(
        compression: str | None) -> None:
    """A few kilobytes of compressed zeros hold megabytes: refused by the headers' sizes, and
    a compressed block within the bound decodes beside it."""
    spec = SPEC.model_copy(update={"max_block_bytes": 1 << 20})
    n = 1 << 17  # 8 bytes x 2 int columns + 8 x float: 3 MiB of buffers
    bomb = pa.table({"k": np.zeros(n, np.int64), "ts": np.zeros(n, np.int64), "v": [""] * n, "w": np.zeros(n)})
    small = pa.table({"k": [7, 8], "ts": [5, 5], "v": ["x", "y"], "w": [0.5, 0.5]})

    def ipc(table: pa.Table) -> bytes:
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema, options=pa.ipc.IpcWriteOptions(compression=compression)) as w:
            w.write_table(table)
        return sink.getvalue().to_pybytes()

    out = decode_blocks(spec, [ipc(small), ipc(bomb), ipc(small)], *_meta(3))
    assert out.block[KEY].tolist() == [7, 8, 7, 8]
    assert [(r.index, r.reason) for r in out.rejects] == [(1, "oversize")]
    assert "max_block_bytes" in out.rejects[0].detail
    if compression:
        assert len(ipc(bomb)) < 1 << 20, "the bomb must be small on the wire for the bound to matter"


@pytest.mark.parametrize("fmt", ["json", "avro", "blocks"])
def test_a_value_longer_than_max_field_bytes_is_oversize_and_its_neighbours_decode(fmt: str) -> None:
    """Fixed-width columns: one long value would widen every tuple beside it and the window
    after it, so it is refused, in every format, before it becomes a column."""
    spec = SPEC.model_copy(update={"max_field_bytes": 64})
    long_value, fitting = "é" * 33, "y" * 64  # 66 UTF-8 bytes: over; 64: fits
    if fmt == "json":
        values, decode = [_json(k=0, v=fitting), _json(k=1, v=long_value), _json(k=2)], decode_json
    elif fmt == "avro":
        def avro(**change: object) -> bytes:
            out = io.BytesIO()
            fastavro.schemaless_writer(out, fastavro.parse_schema(avro_schema(SPEC)), {**GOOD, **change})
            return out.getvalue()
        values, decode = [avro(k=0, v=fitting), avro(k=1, v=long_value), avro(k=2)], decode_avro
    else:
        values = [_block(1, v=np.array([fitting])), _block(1, v=np.array([long_value])), _block(1)]
        decode = decode_blocks
    out = decode(spec, values, *_meta(3))
    assert out.records.tolist() == [0, 2] and out.block["v"].dtype.itemsize <= 64 * 4
    assert [(r.index, r.reason) for r in out.rejects] == [(1, "oversize")]
    assert "max_field_bytes=64" in out.rejects[0].detail


def _buffer(values: list[bytes | None], headers: list[list | None] | None = None) -> RecordBuffer:
    buf = RecordBuffer()
    for offset, v in enumerate(values):
        buf.add(Msg("p.r", 0, offset, v, (headers or [None] * len(values))[offset]), 0)  # type: ignore[arg-type]
    return buf


@pytest.mark.parametrize("header, words", [
    ([(STREAM_HEADER, b"\xff\xfe")], "'\ufffd\ufffd'"),
    ([(STREAM_HEADER, None)], "None"),
    ([(STREAM_HEADER, b"s")], "'s'"),
])
def test_a_stream_header_naming_no_stream_of_the_topic_dead_letters_the_record(header: list, words: str) -> None:
    j = job()
    buf = _buffer([_json(k=1), _json(k=2), _json(k=3)], [None, header, [("other", None)]])
    (sl,) = decode_by_group(j, 0, buf, routing_for(j, 1), {}).values()
    assert sl.block[KEY].tolist() == [1, 3]
    assert [(d.offset, d.reason) for d in sl.dead] == [(1, "unknown-stream")] and words in sl.dead[0].detail


@pytest.mark.parametrize("fmt", ["json", "blocks"])
def test_records_from_the_future_are_dead_lettered_and_the_rest_joins(fmt: str) -> None:
    j = job(fmt)
    limit = NOW + 300_000
    if fmt == "json":
        values = [_json(k=1, ts=NOW), _json(k=2, ts=limit + 1), _json(k=3, ts=limit)]
    else:
        values = [_block(ts=np.array([NOW, limit + 1])), _block(ts=np.array([limit, limit]))]
    (sl,) = decode_by_group(j, 0, _buffer(values), routing_for(j, 1), {}, NOW).values()
    assert int(sl.block[TS].max()) == limit and len(sl.block) == (2 if fmt == "json" else 3)
    assert [(d.offset, d.reason) for d in sl.dead] == [(1 if fmt == "json" else 0, FUTURE)]
    assert "join.max_future_ms=300000" in sl.dead[0].detail
    if fmt == "blocks":  # just the future tuple, as a block of its own
        dead = pa.ipc.open_stream(sl.dead[0].value).read_all()
        assert dead.column("ts").to_pylist() == [limit + 1] and dead.column(BLOCK_INDEX).to_pylist() == [1]


@pytest.mark.parametrize("off", [0, None])
def test_max_future_ms_zero_or_null_is_off(off: int | None) -> None:
    j = job(max_future_ms=off)
    (sl,) = decode_by_group(j, 0, _buffer([_json(ts=1 << 59)]), routing_for(j, 1), {}, NOW).values()
    assert len(sl.block) == 1 and sl.dead == []


@pytest.mark.parametrize("bad", [-1, "soon"])
def test_a_bad_max_future_ms_is_a_settings_error_naming_it(bad: object) -> None:
    with pytest.raises(SettingsError, match="join.max_future_ms"):
        job(max_future_ms=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("partition, offset", [(b"99999999999999999999999", b"1"), (b"0", b"-5"), (b"\xff", b"1"),
                                               (None, b"1"), (b"0", str(1 << 62).encode())])
def test_a_by_key_record_naming_an_impossible_origin_is_dead_lettered(partition: bytes | None, offset: bytes) -> None:
    j = job()
    m = Msg("p.r.by-key", 0, 9, _json(), [(H_ORIGIN_PARTITION, partition), (H_ORIGIN_OFFSET, offset)])
    assert origin_of(m) is None  # type: ignore[arg-type]
    buf = RecordBuffer()
    buf.add_forwarded(m)  # type: ignore[arg-type]
    (sl,) = decode_by_group(j, 0, buf, routing_for(j, 1), {}).values()
    assert len(sl.block) == 0 and [(d.offset, d.reason, d.topic) for d in sl.dead] == [(9, "malformed", "p.r.by-key")]


def test_a_failed_udf_probe_dead_letters_each_trigger_record_once() -> None:
    """udf_dead_letters (ring nodes and SplitJoin cores): one letter per trigger record not seen
    before, on the record's partition modulo the job's, with its place and the UDF's error."""
    from streamjoin.engine.block import PART
    from streamjoin.engine.predicates import UDF_ERROR
    from streamjoin.engine.psp.plan import prefixed
    from streamjoin.schemas.results import decode_headers
    from streamjoin.services.io.dead_letters import udf_dead_letters

    two = job()
    rows = Block({prefixed(1, PART): np.array([0, 0, 3], dtype=np.int64),
                  prefixed(1, OFF): np.array([7, 7, 9], dtype=np.int64), "x": np.array([1, 2, 3], dtype=np.int64)})
    seen = {(1, 3, 9)}  # already lettered (an earlier release of this node)
    letters = udf_dead_letters(two, 1, rows, "boom", seen)
    assert len(letters) == 1 and seen == {(1, 3, 9), (1, 0, 7)}
    value, partition, headers = letters[0]
    meta = decode_headers(headers)
    assert partition == 0 and meta["sj-reason"] == UDF_ERROR and meta["sj-detail"] == "boom"
    assert meta["sj-topic"] == two.topic_of(two.streams[1]) and (meta["sj-partition"], meta["sj-offset"]) == ("0", "7")
    assert pa.ipc.open_stream(value).read_all().column("x").to_pylist() == [1]  # the first failed row's members
    assert udf_dead_letters(two, 1, rows, "boom", seen) == []  # every record lettered now
