"""Result records (schemas/result_format.py, result_encode.py, result_decode.py):
every whole-block encoder against a plain-Python reference (json.dumps /
fastavro of the record the spec describes), round trips through the readers,
readers that reject what is not a result record without raising, the results
schema file, the CLI command and the Helm chart's schema."""

from __future__ import annotations

import base64
import io
import json
import math
from pathlib import Path

import fastavro
import helm_python as helm
import numpy as np
import pyarrow as pa
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from streamjoin.cli import app
from streamjoin.engine.block import Block
from streamjoin.engine.result_ids import result_head
from streamjoin.job_files import default_job_file
from streamjoin.schemas import result_encode, result_format
from streamjoin.schemas.codecs import BLOCK_SHIFT, decode_block
from streamjoin.schemas.columns import to_bytes_list
from streamjoin.schemas.result_decode import decode_results
from streamjoin.schemas.result_encode import ROWS_PER_CHUNK, encode_avro, encode_blocks, encode_json, result_keys
from streamjoin.schemas.result_format import ResultLayout, result_columns, result_layout, results_avro_schema
from streamjoin.settings import JobSettings, load
from streamjoin.topology.partitioner import partition_for, partitions_for_keys
from tests.profiles import examples

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "streamjoin"
AVSC = REPO / "docs" / "reference" / "results-equijoin.avsc"
FMTS = ["json", "avro", "blocks"]

INT64 = st.integers(-(2**63), 2**63 - 1)
# NumPy 'U' and 'S' columns end a value at its last non-NUL unit, so a trailing NUL is not a value's.
TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=10).filter(lambda s: not s.endswith("\0"))
TRICKY_TEXT = st.sampled_from(['"', "\\", "\\\"", "\x00x", "\x1f", "\n\r\t\b\f", "\u2028", "é€😀", "a,b", "\x7f"])
RAW = st.binary(max_size=12).filter(lambda b: not b.endswith(b"\0"))
FLOATS = st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                   st.sampled_from([-0.0, 0.0, 1.0, 1e16, 1e-5, 5e-324, 1.7976931348623157e308, math.nan, -math.inf]))
VALUES = {"int": INT64, "float": FLOATS, "str": st.one_of(TEXT, TRICKY_TEXT), "bool": st.booleans(), "bytes": RAW}
DTYPES = {"int": np.int64, "float": np.float64, "str": str, "bool": np.bool_, "bytes": bytes}
FIELD_NAMES = ["a", "b_2", "Cc", "pad", "x"]
JSON_ONLY_NAMES = ['q"t', "é\\", "sp ace"]  # fine for JSON output, not Avro names


# --------------------------------------------------------------- jobs, blocks


def job_of(mode: str, stream_specs: list[dict], output: str = "json", name: str = "t-job") -> JobSettings:
    return JobSettings(job=name, streams=stream_specs, join={"mode": mode}, output={"format": output})


@st.composite
def jobs(draw: st.DrawFn, output: str = "json", min_streams: int = 2, max_streams: int = 4) -> JobSettings:
    """Random 2- to 4-way jobs: hash mode on a shared key of one type, or ring mode without keys."""
    mode = draw(st.sampled_from(["hash", "ring"]))
    key_type = draw(st.sampled_from(["int", "str", "bool"]))
    specs = []
    for i in range(draw(st.integers(min_streams, max_streams))):
        names = FIELD_NAMES + (JSON_ONLY_NAMES if output == "json" else [])
        extra = draw(st.dictionaries(st.sampled_from(names), st.sampled_from(list(VALUES)), max_size=3))
        fields = {"ts": "int", **extra}
        spec = {"name": f"s{i}", "fields": fields, "time_field": "ts", "window": {"range_ms": 10},
                "format": draw(st.sampled_from(FMTS))}
        if mode == "hash":
            spec["fields"] = {"k": key_type, **fields}
            spec["key_fields"] = ["k"]
        if draw(st.booleans()):
            spec["topic"] = f"topic.{i}"
        specs.append(spec)
    return job_of(mode, specs, output)


def column(values: list, ftype: str) -> np.ndarray:
    if ftype == "str":
        return np.array(values, dtype=str) if values else np.empty(0, "U1")
    if ftype == "bytes":
        return np.array(values, dtype=bytes) if values else np.empty(0, "S1")
    return np.array(values, dtype=DTYPES[ftype])


@st.composite
def blocks(draw: st.DrawFn, layout: ResultLayout, max_rows: int = 6) -> Block:
    """A result block as the engine builds it, with random ids, refs and values."""
    n = draw(st.integers(0, max_rows))
    ints = lambda lo, hi: np.array(draw(st.lists(st.integers(lo, hi), min_size=n, max_size=n)), np.int64)  # noqa: E731
    ids = lambda: np.array(draw(st.lists(st.integers(0, 2**64 - 1), min_size=n, max_size=n)), np.uint64)  # noqa: E731
    cols = {"result_id_hi": ids(), "result_id_lo": ids(),
            "event_time": ints(-(2**63), 2**63 - 1), "produced_ms": ints(-(2**63), 2**63 - 1)}
    for s in layout.streams:
        cols[f"{s.name}.partition"] = ints(0, 2**31 - 1).astype(np.int32)
        if s.blocks:
            cols[f"{s.name}.offset"] = (ints(0, 2**43 - 1) << BLOCK_SHIFT) | ints(0, 2**BLOCK_SHIFT - 1)
        else:
            cols[f"{s.name}.offset"] = ints(0, 2**63 - 1)
        for f, t in s.fields:
            cols[f"{s.name}.{f}"] = column(draw(st.lists(VALUES[t], min_size=n, max_size=n)), t)
        cols[f"{s.name}.ts"] = cols[f"{s.name}.{s.time_field}"]
    cols["newest_arrival_ms"] = ints(0, 2**40)
    return Block(cols)


def equijoin_block(n: int, seed: int = 0) -> tuple[ResultLayout, Block]:
    """The default job's layout and a block like the equi-join workload's results: int key, ts, 48-character pad
    per stream, ids from random refs."""
    layout = result_layout(load(default_job_file()))
    rng = np.random.default_rng(seed)
    parts = [rng.integers(0, 60, n).astype(np.int32) for _ in layout.streams]
    offs = [rng.integers(0, 1 << 30, n) for _ in layout.streams]
    ts = [1_700_000_000_000 + rng.integers(0, 60_000, n) for _ in layout.streams]
    key = rng.integers(0, 1 << 21, n)
    cols = result_head([s.topic for s in layout.streams], parts, offs, np.max(ts, axis=0), 1_700_000_100_000)
    for i, s in enumerate(layout.streams):
        pad = np.array(["".join(rng.choice(list("abcdefghij\"é"), 48)) for _ in range(n)], "U48")
        cols |= {f"{s.name}.partition": parts[i], f"{s.name}.offset": offs[i], f"{s.name}.ts": ts[i],
                 f"{s.name}.k": key, f"{s.name}.pad": pad}
    return layout, Block(cols | {"newest_arrival_ms": np.zeros(n, np.int64)})


# --------------------------------------------------------- plain-Python reference


def hex_id(block: Block, row: int) -> str:
    return f"{int(block['result_id_hi'][row]):016x}{int(block['result_id_lo'][row]):016x}"


def expected_record(layout: ResultLayout, block: Block, row: int, fmt: str) -> dict:
    """The record the spec describes, from one block row, in plain Python."""
    inputs = {}
    for s in layout.streams:
        offset = int(block[f"{s.name}.offset"][row])
        ref = {"topic": s.topic, "partition": int(block[f"{s.name}.partition"][row])}
        ref |= {"offset": offset >> BLOCK_SHIFT, "index": offset & ((1 << BLOCK_SHIFT) - 1)} if s.blocks else \
            {"offset": offset}
        inputs[s.name] = ref
    record = {"result_id": hex_id(block, row), "event_time": int(block["event_time"][row]),
              "produced_ms": int(block["produced_ms"][row]), "inputs": inputs}
    for s in layout.streams:
        record[s.name] = {f: plain_value(block[f"{s.name}.{f}"][row].item(), t, fmt) for f, t in s.fields}
    return record


def plain_value(value: object, ftype: str, fmt: str) -> object:
    if fmt == "json" and ftype == "float" and not math.isfinite(value):  # type: ignore[arg-type]
        return None
    if fmt == "json" and ftype == "bytes":
        return base64.b64encode(value).decode()  # type: ignore[arg-type]
    return value


def reference_json(layout: ResultLayout, block: Block) -> list[bytes]:
    return [json.dumps(expected_record(layout, block, i, "json"), separators=(",", ":"), ensure_ascii=False,
                       allow_nan=False).encode() for i in range(len(block))]


def reference_avro(layout: ResultLayout, block: Block) -> list[bytes]:
    schema = fastavro.parse_schema(results_avro_schema(layout))
    out = []
    for i in range(len(block)):
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, schema, expected_record(layout, block, i, "avro"))
        out.append(buf.getvalue())
    return out


def assert_columns_equal(got: dict[str, np.ndarray], block: Block, rows: np.ndarray | slice = slice(None),
                         json_floats: bool = False) -> None:
    """Decoded columns equal the block's written columns (at `rows`); JSON reads non-finite floats as NaN."""
    for name in got:
        want = block[name][rows]
        if want.dtype.kind == "f":
            if json_floats:
                want = np.where(np.isfinite(want), want, np.nan)
            np.testing.assert_array_equal(got[name], want, err_msg=name)  # NaN == NaN here; -0.0 checked below
            assert (np.signbit(got[name]) == np.signbit(want))[np.isfinite(want)].all(), name
        else:
            assert got[name].tolist() == want.tolist(), name
            assert got[name].dtype.kind == want.dtype.kind, name


ENCODERS = {"json": encode_json, "avro": encode_avro}


# ------------------------------------------------------------------ encoders


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_json_values_are_what_json_dumps_writes(data: st.DataObject) -> None:
    layout = result_layout(data.draw(jobs()))
    block = data.draw(blocks(layout))
    assert encode_json(layout, block) == reference_json(layout, block)


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_avro_values_are_what_fastavro_writes(data: st.DataObject) -> None:
    layout = result_layout(data.draw(jobs(output="avro")))
    block = data.draw(blocks(layout))
    assert encode_avro(layout, block) == reference_avro(layout, block)


def test_json_spells_the_spec_example_exactly() -> None:
    job = job_of("hash", [
        {"name": "r", "fields": {"k": "int", "ts": "int", "x": "float", "s": "str", "ok": "bool", "raw": "bytes"},
         "time_field": "ts", "key_fields": ["k"], "window": {"range_ms": 5}},
        {"name": "q", "fields": {"k": "int", "ts": "int"}, "time_field": "ts", "key_fields": ["k"],
         "window": {"range_ms": 5}, "format": "blocks", "topic": "quotes"}], name="ex")
    layout = result_layout(job)
    block = Block({"result_id_hi": np.array([1], np.uint64), "result_id_lo": np.array([2**64 - 1], np.uint64),
                   "event_time": np.array([7]), "produced_ms": np.array([9]),
                   "r.partition": np.array([3], np.int32), "r.offset": np.array([11]), "r.ts": np.array([5]),
                   "r.k": np.array([-4]), "r.x": np.array([1.0]), "r.s": np.array(['q"\\\n\x01é']),
                   "r.ok": np.array([True]), "r.raw": np.array([b"\xff\x00a"]),
                   "q.partition": np.array([0], np.int32), "q.offset": np.array([(12 << BLOCK_SHIFT) | 5]),
                   "q.ts": np.array([7]), "q.k": np.array([-4])})
    assert encode_json(layout, block) == [
        '{"result_id":"0000000000000001ffffffffffffffff","event_time":7,"produced_ms":9,'
        '"inputs":{"r":{"topic":"ex.r","partition":3,"offset":11},"q":{"topic":"quotes","partition":0,"offset":12,'
        '"index":5}},"r":{"k":-4,"ts":5,"x":1.0,"s":"q\\"\\\\\\n\\u0001é","ok":true,"raw":"/wBh"},'
        '"q":{"k":-4,"ts":7}}'.encode()]


def test_non_finite_floats_are_json_null_and_others_python_repr() -> None:
    job = job_of("ring", [{"name": n, "fields": {"ts": "int", "x": "float"}, "time_field": "ts",
                           "window": {"range_ms": 5}} for n in "ab"])
    layout = result_layout(job)
    floats = np.array([math.nan, math.inf, -math.inf, -0.0, 1e16, 1e-5, 0.1, 2.5e-7, 123456789.125])
    n = len(floats)
    cols = {"result_id_hi": np.zeros(n, np.uint64), "result_id_lo": np.zeros(n, np.uint64),
            "event_time": np.zeros(n, np.int64), "produced_ms": np.zeros(n, np.int64)}
    for s in "ab":
        cols |= {f"{s}.partition": np.zeros(n, np.int32), f"{s}.offset": np.zeros(n, np.int64),
                 f"{s}.ts": np.zeros(n, np.int64), f"{s}.x": floats}
    texts = [json.loads(v)["a"]["x"] for v in encode_json(layout, Block(cols))]
    assert texts[:3] == [None, None, None]
    assert [repr(x) for x in texts[3:]] == [repr(x) for x in floats[3:].tolist()]
    assert b'"x":-0.0}' in encode_json(layout, Block(cols))[3]


@pytest.mark.parametrize("fmt", FMTS)
def test_an_empty_block_has_no_records(fmt: str) -> None:
    layout, block = equijoin_block(0)
    values = {"json": encode_json, "avro": encode_avro}[fmt](layout, block) if fmt != "blocks" else \
        encode_blocks(block)
    assert values == []
    decoded = decode_results(layout, fmt, values)
    assert decoded.rejects == [] and list(decoded.columns) == list(result_columns(layout))
    assert all(len(v) == 0 for v in decoded.columns.values())


def test_blocks_are_chunked_without_internal_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    assert ROWS_PER_CHUNK == 50_000
    monkeypatch.setattr(result_encode, "ROWS_PER_CHUNK", 4)
    layout, block = equijoin_block(10)
    values = encode_blocks(block)
    chunks = [decode_block(v) for v in values]
    assert [len(c) for c in chunks] == [4, 4, 2]
    assert all("newest_arrival_ms" not in c.names for c in chunks)
    assert chunks[1]["r.offset"].tolist() == block["r.offset"][4:8].tolist()
    decoded = decode_results(layout, "blocks", values)
    assert decoded.rejects == []
    assert_columns_equal(decoded.columns, block)


# ------------------------------------------------------------------- keys


def test_hash_mode_keys_are_the_first_streams_join_key_text_and_land_on_its_group() -> None:
    layout, block = equijoin_block(200)
    keys = result_keys(layout, block)
    assert to_bytes_list(keys) == [str(k).encode() for k in block["r.k"].tolist()]
    assert partitions_for_keys(keys, 60).tolist() == [partition_for(str(k).encode(), 60) for k in block["r.k"]]


def test_hash_mode_keys_of_several_fields_join_them_with_commas() -> None:
    spec = {"fields": {"a": "str", "b": "bool", "c": "int", "ts": "int"}, "time_field": "ts",
            "key_fields": ["a", "b", "c"], "window": {"range_ms": 5}}
    layout = result_layout(job_of("hash", [{"name": "x", **spec}, {"name": "y", **spec}]))
    block = Block({"x.a": np.array(["é,", ""]), "x.b": np.array([True, False]), "x.c": np.array([-1, 2**63 - 1])})
    assert to_bytes_list(result_keys(layout, block)) == ["é,,true,-1".encode(), b",false,9223372036854775807"]


def test_ring_mode_keys_are_the_hex_ids() -> None:
    job = job_of("ring", [{"name": n, "fields": {"ts": "int"}, "time_field": "ts", "window": {"range_ms": 5}}
                          for n in "ab"])
    block = Block({"result_id_hi": np.array([0, 2**64 - 1], np.uint64),
                   "result_id_lo": np.array([255, 0], np.uint64)})
    assert to_bytes_list(result_keys(result_layout(job), block)) == [b"0" * 30 + b"ff", b"f" * 16 + b"0" * 16]


# ---------------------------------------------------------------- readers


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data(), st.sampled_from(FMTS))
def test_every_format_round_trips_through_its_reader(data: st.DataObject, fmt: str) -> None:
    layout = result_layout(data.draw(jobs(output="avro" if fmt == "avro" else "json")))
    block = data.draw(blocks(layout))
    values = encode_blocks(block) if fmt == "blocks" else ENCODERS[fmt](layout, block)
    decoded = decode_results(layout, fmt, values)
    assert decoded.rejects == []
    assert list(decoded.columns) == list(result_columns(layout))
    assert_columns_equal(decoded.columns, block, json_floats=fmt == "json")


JUNK = st.one_of(st.binary(max_size=60), st.none(), st.sampled_from([
    b"", b" ", b"{}", b"[]", b"null", b" null", b"{} null", b"true", b'{"result_id":"x"}', b"\n",
    b'{"a":1}\n{"b":2}', b'{"a":1} {"b":2}']))


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data(), st.sampled_from(FMTS))
def test_readers_reject_junk_by_position_and_keep_the_rest(data: st.DataObject, fmt: str) -> None:
    layout = result_layout(data.draw(jobs(output="avro" if fmt == "avro" else "json", max_streams=3)))
    block = data.draw(blocks(layout, max_rows=4))
    good = encode_blocks(block) if fmt == "blocks" else ENCODERS[fmt](layout, block)
    junk = data.draw(st.lists(JUNK, max_size=4))
    slots = data.draw(st.permutations([True] * len(good) + [False] * len(junk)))
    values, g, j = [], iter(good), iter(junk)
    for is_good in slots:
        values.append(next(g) if is_good else next(j))
    decoded = decode_results(layout, fmt, values)
    assert [r.index for r in decoded.rejects] == [i for i, is_good in enumerate(slots) if not is_good]
    assert all(r.reason == "malformed" and r.detail for r in decoded.rejects)
    assert_columns_equal(decoded.columns, block, json_floats=fmt == "json")


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data(), st.sampled_from(FMTS))
def test_damaged_records_never_raise(data: st.DataObject, fmt: str) -> None:
    layout, block = equijoin_block(3, seed=data.draw(st.integers(0, 100)))
    values = encode_blocks(block) if fmt == "blocks" else ENCODERS[fmt](layout, block)
    damaged = []
    for v in values:
        cut = data.draw(st.integers(0, len(v)))
        flip = data.draw(st.integers(0, max(len(v) - 1, 0)))
        mutated = bytearray(v[:cut] + data.draw(st.binary(max_size=4)) + v[cut:])
        if mutated and data.draw(st.booleans()):
            mutated[flip % len(mutated)] ^= data.draw(st.integers(1, 255))
        damaged.append(bytes(mutated))
    decoded = decode_results(layout, fmt, damaged)
    kept = len(decoded.columns["event_time"])
    rejected = [r.index for r in decoded.rejects]
    assert rejected == sorted(set(rejected)) and all(r.detail for r in decoded.rejects)
    # A value is kept whole or rejected whole: one result per JSON/Avro value, a block's rows per blocks value.
    rows_per_value = len(block) if fmt == "blocks" else 1
    assert kept == rows_per_value * (len(damaged) - len(rejected))


def test_four_zero_bytes_anywhere_in_a_block_never_lose_its_rows_silently() -> None:
    """Four zero bytes read as an old-style end of stream: the batches after them would be
    dropped without an error unless the stream must end where the record does (CI found it)."""
    layout, block = equijoin_block(3, seed=7)
    (value,) = encode_blocks(block)
    for cut in range(len(value) + 1):
        decoded = decode_results(layout, "blocks", [value[:cut] + b"\0\0\0\0" + value[cut:]])
        assert len(decoded.columns["event_time"]) == (0 if decoded.rejects else len(block)), cut


def _json_record(layout: ResultLayout) -> dict:
    _, block = equijoin_block(1)
    return expected_record(layout, block, 0, "json")


@pytest.mark.parametrize("change, reason", [
    (lambda r: r.pop("inputs"), "missing inputs.r.topic"),
    (lambda r: r["r"].pop("pad"), "missing r.pad"),
    (lambda r: r.update(result_id="ABC"), "result_id is not 32 hex digits"),
    (lambda r: r.update(result_id="0123456789ABCDEF0123456789abcdef"), "result_id is not 32 hex digits"),
    (lambda r: r["inputs"]["s"].update(topic="elsewhere"), "inputs.s.topic is not equijoin.s"),
    (lambda r: r["inputs"]["r"].update(partition=-1), "inputs.r.partition out of range"),
    (lambda r: r["inputs"]["r"].update(partition=2**31), "inputs.r.partition out of range"),
    (lambda r: r["inputs"]["r"].update(offset=-5), "inputs.r.offset out of range"),
    (lambda r: r.update(event_time="soon"), "not a result record"),
    (lambda r: r.update(event_time=2**64), "not a result record"),
])
def test_json_reader_names_what_is_wrong(change, reason: str) -> None:  # type: ignore[no-untyped-def]
    layout = result_layout(load(default_job_file()))
    good = json.dumps(_json_record(layout)).encode()
    bad = _json_record(layout)
    change(bad)
    decoded = decode_results(layout, "json", [good, json.dumps(bad).encode(), good])
    assert [(r.index, r.reason) for r in decoded.rejects] == [(1, "malformed")]
    assert reason in decoded.rejects[0].detail
    assert len(decoded.columns["event_time"]) == 2


def test_json_reader_takes_any_key_order_and_whitespace_and_checks_base64() -> None:
    job = job_of("hash", [{"name": n, "fields": {"k": "int", "ts": "int", "raw": "bytes"}, "time_field": "ts",
                           "key_fields": ["k"], "window": {"range_ms": 5}, "format": "blocks"} for n in "ab"])
    layout = result_layout(job)
    record = {"b": {"raw": "AAE=", "ts": 3, "k": 1}, "a": {"k": 1, "ts": 2, "raw": ""},
              "inputs": {"b": {"offset": 2, "index": 1, "partition": 0, "topic": "t-job.b"},
                         "a": {"topic": "t-job.a", "partition": 1, "offset": 4, "index": 0}},
              "produced_ms": 1, "event_time": 3, "result_id": "f" * 32}
    bad = json.loads(json.dumps(record))
    bad["b"]["raw"] = "AAE"
    decoded = decode_results(layout, "json", [json.dumps(record, indent=None, separators=(", ", " : ")).encode(),
                                              json.dumps(bad).encode()])
    assert [(r.index, r.detail) for r in decoded.rejects] == [(1, "b.raw is not base64")]
    cols = decoded.columns
    assert cols["b.raw"].tolist() == [b"\x00\x01"] and cols["a.raw"].tolist() == [b""]
    assert cols["b.offset"].tolist() == [(2 << BLOCK_SHIFT) | 1] and cols["a.offset"].tolist() == [4 << BLOCK_SHIFT]
    assert cols["result_id_hi"].tolist() == [2**64 - 1] and cols["b.ts"].tolist() == [3]


def test_avro_reader_rejects_truncated_and_overlong_values() -> None:
    layout, block = equijoin_block(3)
    values = encode_avro(layout, block)
    decoded = decode_results(layout, "avro", [values[0][:-3], values[1] + b"\x00", None, values[2]])
    assert [r.index for r in decoded.rejects] == [0, 1, 2]
    assert "bytes after the record" in decoded.rejects[1].detail
    assert_columns_equal(decoded.columns, block, rows=np.array([2]))


def test_blocks_reader_rejects_blocks_missing_a_column_or_holding_nulls() -> None:
    layout, block = equijoin_block(3)
    partial = encode_blocks(Block({k: v for k, v in block.columns.items() if k != "s.pad"}))
    table = pa.ipc.open_stream(encode_blocks(block)[0]).read_all()
    with_null = table.set_column(table.column_names.index("r.k"), "r.k", pa.array([1, None, 3], pa.int64()))
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, with_null.schema) as writer:
        writer.write_table(with_null)
    values = partial + encode_blocks(block) + [b"junk", sink.getvalue().to_pybytes()]
    decoded = decode_results(layout, "blocks", values)
    assert [r.index for r in decoded.rejects] == [0, 2, 3]
    assert "nulls in result columns ['r.k']" in decoded.rejects[2].detail
    assert_columns_equal(decoded.columns, block)


# ------------------------------------------------------------ schema, CLI, Helm


def test_results_schema_is_valid_avro_with_the_specs_names() -> None:
    job = job_of("ring", [{"name": "r", "fields": {"ts": "int", "img": "bytes", "y": "float"}, "time_field": "ts",
                           "window": {"range_ms": 5}, "format": "blocks"},
                          {"name": "s", "fields": {"ts": "int", "d": "bool"}, "time_field": "ts",
                           "window": {"range_ms": 5}}], output="avro", name="band-2")
    schema = results_avro_schema(result_layout(job))
    fastavro.parse_schema(schema)
    assert schema["namespace"] == "streamjoin.band_2" and schema["name"] == "Result"
    by_name = {f["name"]: f["type"] for f in schema["fields"]}
    assert list(by_name) == ["result_id", "event_time", "produced_ms", "inputs", "r", "s"]
    refs = {f["name"]: f["type"] for f in by_name["inputs"]["fields"]}
    assert [f["name"] for f in refs["r"]["fields"]] == ["topic", "partition", "offset", "index"]
    assert [f["name"] for f in refs["s"]["fields"]] == ["topic", "partition", "offset"]
    assert by_name["r"] == {"type": "record", "name": "r_fields",  # ring mode leaves bytes fields out
                            "fields": [{"name": "ts", "type": "long"}, {"name": "y", "type": "double"}]}


def test_members_are_required_unless_the_join_type_lets_a_result_lack_them() -> None:
    """Inner jobs, and layouts built by hand (the query router's), have no optional stream: their
    records keep plain ref and fields records (the outer join types: test_result_codec_outer.py)."""
    layout = result_layout(load(default_job_file()))
    assert [s.optional for s in layout.streams] == [False, False]
    assert result_format.StreamLayout("r", "t.r", False, (("ts", "int"),), "ts", ()).optional is False
    members = [*results_avro_schema(layout)["fields"][3]["type"]["fields"], *results_avro_schema(layout)["fields"][4:]]
    assert all(isinstance(f["type"], dict) for f in members)


def test_docs_schema_file_is_up_to_date() -> None:
    result = CliRunner().invoke(app, ["schema", "results", "--job", str(default_job_file())])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == results_avro_schema(result_layout(load(default_job_file())))
    assert AVSC.read_text() == result.stdout, "regenerate: streamjoin schema results > docs/reference/results-equijoin.avsc"


def _render(values: dict | None) -> dict[str, dict]:
    helm.disable_logging()
    with helm.Chart.load(CHART) as chart:
        files = chart.render(values, name="sj", namespace="streams", is_install=True)
    docs = [d for path, text in files.items() if not path.endswith("NOTES.txt") for d in yaml.safe_load_all(text) if d]
    return {d["metadata"]["name"]: d for d in docs if d.get("kind") == "ConfigMap"}


RING_VALUES = {"job": {"job": "band-x", "partitions": 4, "join": {"mode": "ring"}, "streams": [
    {"name": "r", "fields": {"x": "int", "z": "str", "ts": "int", "img": "bytes"}, "time_field": "ts",
     "window": {"range_ms": 10}, "format": "blocks"},
    {"name": "s", "fields": {"a": "float", "d": "bool", "ts": "int"}, "time_field": "ts",
     "window": {"range_ms": 10}}]}}
HASH_BYTES_VALUES = {"job": {"job": "img", "streams": [
    {"name": n, "fields": {"k": "str", "ts": "int", "img": "bytes"}, "time_field": "ts", "key_fields": ["k"],
     "window": {"rows": 3}} for n in ("left", "right")]}}


@pytest.mark.parametrize("values", [None, RING_VALUES, HASH_BYTES_VALUES], ids=["default", "ring", "hash-bytes"])
def test_helm_renders_the_results_schema_of_the_job_it_deploys(values: dict | None, tmp_path: Path) -> None:
    configmaps = _render(values)
    schema_map = configmaps["sj-streamjoin-results-schema"]
    job_map = configmaps["sj-streamjoin"]
    path = tmp_path / "job.yaml"
    path.write_text(job_map["data"]["job.yaml"])
    deployed = load(path)  # the job exactly as the chart's services read it
    assert json.loads(schema_map["data"]["results.avsc"]) == results_avro_schema(result_layout(deployed))


def test_json_reader_survives_a_bare_null_first() -> None:
    """pyarrow 26's JSON reader segfaults when a buffer's first document is `null`: it must never see one."""
    layout, block = equijoin_block(1)
    decoded = decode_results(layout, "json", [b"null", b" null", *encode_json(layout, block)])
    assert [(r.index, r.detail) for r in decoded.rejects] == [(0, "not a JSON object"), (1, "not a JSON object")]
    assert_columns_equal(decoded.columns, block)

