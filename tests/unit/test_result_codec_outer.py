"""Result records of outer, semi and anti joins (schemas/result_encode.py, result_decode.py): a
result lacking an optional stream's member writes null for its ref and its fields (JSON),
the null branch of both unions (Avro) or partition and offset -1 (blocks); every format
reads it back as the engine's block; a null where the job allows none, or half a null
member, is a reject, never an exception; the Spark verifier checks such results' ids."""

from __future__ import annotations

import copy
import io
import json
from typing import Any, Callable

import fastavro
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamjoin.engine.block import Block
from streamjoin.engine.result_ids import ABSENT
from streamjoin.schemas.codecs import BLOCK_SHIFT
from streamjoin.schemas.columns import to_bytes_list
from streamjoin.schemas.result_decode import decode_results
from streamjoin.schemas.result_encode import encode_avro, encode_blocks, encode_json, result_keys
from streamjoin.schemas.result_format import ResultLayout, result_columns, result_layout, results_avro_schema
from streamjoin.settings import JobSettings
from tests.unit.test_result_codec import FMTS, VALUES, assert_columns_equal, blocks, expected_record
from tests.profiles import examples

JOIN_TYPES = ["inner", "left", "right", "full", "semi", "anti"]
OPTIONAL = {"inner": (False, False), "left": (False, True), "right": (True, False), "full": (True, True),
            "semi": (False, True), "anti": (False, True)}
FILLER = {"int": 0, "float": 0.0, "str": "", "bool": False, "bytes": b""}
ENCODERS = {"json": encode_json, "avro": encode_avro}


def outer_job(join_type: str, output: str = "json", formats: tuple[str, str] = ("json", "blocks"),
              extra: tuple[dict, dict] = ({}, {}), key_type: str = "int") -> JobSettings:
    """A hash-mode job of streams r and s on key k, joined by `join_type`."""
    specs = [{"name": n, "fields": {"k": key_type, "ts": "int", **x}, "time_field": "ts", "key_fields": ["k"],
              "window": {"range_ms": 10}, "format": f} for n, f, x in zip("rs", formats, extra)]
    return JobSettings(job="oj", streams=specs, join={"mode": "hash", "type": join_type}, output={"format": output})


@st.composite
def outer_jobs(draw: st.DrawFn, output: str = "json") -> JobSettings:
    """Two-stream hash jobs of any join type, input formats and extra fields."""
    extra = tuple(draw(st.dictionaries(st.sampled_from(["a", "b_2", "x"]), st.sampled_from(list(VALUES)), max_size=3))
                  for _ in range(2))
    formats = tuple(draw(st.sampled_from(["json", "blocks"])) for _ in range(2))
    return outer_job(draw(st.sampled_from(JOIN_TYPES)), output, formats, extra,  # type: ignore[arg-type]
                     draw(st.sampled_from(["int", "str", "bool"])))


def with_absent(layout: ResultLayout, block: Block, lacking: list[int | None]) -> Block:
    """`block` with, per row, the member of stream `lacking[row]` absent as the engine marks it
    (partition and offset ABSENT, ts and fields filler); None: the row has every member."""
    cols = {k: v.copy() for k, v in block.columns.items()}
    for i, s in enumerate(layout.streams):
        rows = np.array([x == i for x in lacking], bool)
        cols[f"{s.name}.partition"][rows] = ABSENT
        cols[f"{s.name}.offset"][rows] = ABSENT
        cols[f"{s.name}.ts"][rows] = 0
        for f, t in s.fields:
            cols[f"{s.name}.{f}"][rows] = FILLER[t]
    return Block(cols)


@st.composite
def outer_blocks(draw: st.DrawFn, layout: ResultLayout) -> Block:
    """A result block whose rows each lack at most one member, of an optional stream."""
    block = draw(blocks(layout))
    choices = [None, *(i for i, s in enumerate(layout.streams) if s.optional)]
    return with_absent(layout, block, [draw(st.sampled_from(choices)) for _ in range(len(block))])


def plain_block(layout: ResultLayout, n: int, seed: int = 0) -> Block:
    """A result block of `n` rows with every member present, from a seeded generator."""
    rng = np.random.default_rng(seed)
    draws = {"int": lambda: rng.integers(-(2**62), 2**62, n), "float": lambda: rng.normal(size=n),
             "str": lambda: np.array([f"t{v}é" for v in rng.integers(0, 99, n)]),
             "bool": lambda: rng.integers(0, 2, n).astype(bool),
             "bytes": lambda: np.array([bytes([v, 1]) for v in rng.integers(1, 255, n)], "S")}
    cols = {"result_id_hi": rng.integers(0, 2**63, n).astype(np.uint64),
            "result_id_lo": rng.integers(0, 2**63, n).astype(np.uint64),
            "event_time": rng.integers(0, 2**40, n), "produced_ms": rng.integers(0, 2**40, n)}
    for s in layout.streams:
        cols[f"{s.name}.partition"] = rng.integers(0, 100, n).astype(np.int32)
        cols[f"{s.name}.offset"] = rng.integers(0, 2**40, n) << (BLOCK_SHIFT if s.blocks else 0)
        cols |= {f"{s.name}.{f}": draws[t]() for f, t in s.fields}
        cols[f"{s.name}.ts"] = cols[f"{s.name}.{s.time_field}"]
    return Block(cols | {"newest_arrival_ms": np.zeros(n, np.int64)})


def expected_outer_record(layout: ResultLayout, block: Block, row: int, fmt: str) -> dict:
    """The record the spec describes for one row: an absent member's ref and fields are None."""
    record = expected_record(layout, block, row, fmt)
    for s in layout.streams:
        if block[f"{s.name}.partition"][row] == ABSENT:
            record["inputs"][s.name] = record[s.name] = None
    return record


def encoded(layout: ResultLayout, fmt: str, block: Block) -> list[bytes]:
    return encode_blocks(block) if fmt == "blocks" else ENCODERS[fmt](layout, block)


# ------------------------------------------------------------------ encoders


def test_layout_marks_the_streams_a_result_may_lack() -> None:
    for join_type, optional in OPTIONAL.items():
        assert tuple(s.optional for s in result_layout(outer_job(join_type)).streams) == optional, join_type


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_json_values_are_what_json_dumps_writes_with_null_members(data: st.DataObject) -> None:
    layout = result_layout(data.draw(outer_jobs()))
    block = data.draw(outer_blocks(layout))
    want = [json.dumps(expected_outer_record(layout, block, i, "json"), separators=(",", ":"), ensure_ascii=False,
                       allow_nan=False).encode() for i in range(len(block))]
    assert encode_json(layout, block) == want


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_avro_values_are_what_fastavro_writes_with_the_published_schema(data: st.DataObject) -> None:
    layout = result_layout(data.draw(outer_jobs(output="avro")))
    block = data.draw(outer_blocks(layout))
    schema = fastavro.parse_schema(results_avro_schema(layout))
    values = encode_avro(layout, block)
    for i, value in enumerate(values):
        record = expected_outer_record(layout, block, i, "avro")
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, schema, record)
        assert value == buf.getvalue()
        read = fastavro.schemaless_reader(io.BytesIO(value), schema)
        assert [read["inputs"][s.name] is None for s in layout.streams] == \
            [record[s.name] is None for s in layout.streams]


def test_json_spells_a_null_padded_row_exactly() -> None:
    layout = result_layout(outer_job("left", extra=({"x": "float"}, {"x": "str"})))
    block = Block({"result_id_hi": np.array([1, 2], np.uint64), "result_id_lo": np.array([3, 4], np.uint64),
                   "event_time": np.array([7, 8]), "produced_ms": np.array([9, 9]),
                   "r.partition": np.array([3, 4], np.int32), "r.offset": np.array([11, 12]),
                   "r.ts": np.array([5, 8]), "r.k": np.array([-4, 2]), "r.x": np.array([1.0, 2.5]),
                   "s.partition": np.array([ABSENT, 1], np.int32), "s.offset": np.array([ABSENT, 6 << BLOCK_SHIFT]),
                   "s.ts": np.array([0, 7]), "s.k": np.array([0, 2]), "s.x": np.array(["", "é"])})
    assert encode_json(layout, block) == [
        b'{"result_id":"00000000000000010000000000000003","event_time":7,"produced_ms":9,'
        b'"inputs":{"r":{"topic":"oj.r","partition":3,"offset":11},"s":null},"r":{"k":-4,"ts":5,"x":1.0},"s":null}',
        '{"result_id":"00000000000000020000000000000004","event_time":8,"produced_ms":9,'
        '"inputs":{"r":{"topic":"oj.r","partition":4,"offset":12},"s":{"topic":"oj.s","partition":1,"offset":6,'
        '"index":0}},"r":{"k":2,"ts":8,"x":2.5},"s":{"k":2,"ts":7,"x":"é"}}'.encode()]


def test_avro_writes_the_union_branch_before_each_optional_member() -> None:
    layout = result_layout(outer_job("right", output="avro", formats=("json", "json")))
    block = Block({"result_id_hi": np.zeros(1, np.uint64), "result_id_lo": np.zeros(1, np.uint64),
                   "event_time": np.array([1]), "produced_ms": np.array([2]),
                   "r.partition": np.array([ABSENT], np.int32), "r.offset": np.array([ABSENT]),
                   "r.ts": np.array([0]), "r.k": np.array([0]),
                   "s.partition": np.array([3], np.int32), "s.offset": np.array([4]), "s.ts": np.array([5]),
                   "s.k": np.array([6])})
    head = b"\x40" + b"0" * 32 + b"\x02\x04"  # id (length 32), event_time 1, produced_ms 2: zigzag varints
    # inputs: r the null branch, s its record (topic, partition 3, offset 4); then r null, s's k 6 and ts 5
    assert encode_avro(layout, block) == [head + b"\x00" + b"\x08oj.s\x06\x08" + b"\x00" + b"\x0c\x0a"]
    schema = results_avro_schema(layout)
    members = [*schema["fields"][3]["type"]["fields"], *schema["fields"][4:]]
    assert [(f["name"], isinstance(f["type"], list) and f["type"][0] == "null") for f in members] == [
        ("r", True), ("s", False), ("r", True), ("s", False)]


def test_inner_jobs_keep_plain_records() -> None:
    schema = results_avro_schema(result_layout(outer_job("inner", output="avro")))
    assert all(isinstance(f["type"], dict) for f in schema["fields"][3:])
    assert all(isinstance(f["type"], dict) for f in schema["fields"][3]["type"]["fields"])


# ------------------------------------------------------------------- keys


@pytest.mark.parametrize("join_type", ["right", "full"])
def test_a_result_lacking_the_first_member_is_keyed_by_the_seconds_key(join_type: str) -> None:
    layout = result_layout(outer_job(join_type, key_type="str"))
    block = Block({"r.partition": np.array([0, ABSENT, 2], np.int32), "r.k": np.array(["a", "", "c"]),
                   "s.partition": np.array([0, 1, ABSENT], np.int32), "s.k": np.array(["a", "b,é", ""])})
    assert to_bytes_list(result_keys(layout, block)) == [b"a", "b,é".encode(), b"c"]


# ---------------------------------------------------------------- readers


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data(), st.sampled_from(FMTS))
def test_null_padded_results_round_trip_through_every_reader(data: st.DataObject, fmt: str) -> None:
    layout = result_layout(data.draw(outer_jobs(output="avro" if fmt == "avro" else "json")))
    block = data.draw(outer_blocks(layout))
    decoded = decode_results(layout, fmt, encoded(layout, fmt, block))
    assert decoded.rejects == []
    assert list(decoded.columns) == list(result_columns(layout))
    assert_columns_equal(decoded.columns, block, json_floats=fmt == "json")


@pytest.mark.parametrize("join_type", JOIN_TYPES)
@pytest.mark.parametrize("fmt", FMTS)
def test_every_join_type_and_format_reads_back_absent_members(join_type: str, fmt: str) -> None:
    layout = result_layout(outer_job(join_type, output=fmt, extra=({"x": "float", "b": "bytes"}, {"t": "str"})))
    choices = [None, *(i for i, s in enumerate(layout.streams) if s.optional)]
    lacking = [choices[row % len(choices)] for row in range(6)]
    block = with_absent(layout, plain_block(layout, 6), lacking)
    decoded = decode_results(layout, fmt, encoded(layout, fmt, block))
    assert decoded.rejects == []
    assert_columns_equal(decoded.columns, block, json_floats=fmt == "json")
    for i, s in enumerate(layout.streams):
        absent = np.array([x == i for x in lacking], bool)
        assert (decoded.columns[f"{s.name}.partition"][absent] == ABSENT).all()
        assert (decoded.columns[f"{s.name}.offset"][absent] == ABSENT).all()


def _record(layout: ResultLayout, lacking: int | None = None, fmt: str = "json") -> dict:
    """One record of `layout` ready for json.dumps or fastavro (fmt), lacking stream `lacking`'s member."""
    block = with_absent(layout, plain_block(layout, 1), [lacking])
    return expected_outer_record(layout, block, 0, fmt)


def _nulled(*paths: str) -> Callable[[dict], None]:
    """An edit setting each path ("inputs.s", "s") of a record to None."""
    def edit(record: dict) -> None:
        for path in paths:
            *parents, leaf = path.split(".")
            target = record
            for p in parents:
                target = target[p]
            target[leaf] = None
    return edit


@pytest.mark.parametrize("join_type, lacking, edit, reason", [
    ("left", None, _nulled("inputs.r", "r"), "missing inputs.r.topic"),  # r is not optional
    ("left", None, _nulled("inputs.s"), "inputs.s and s: one is null, the other not"),
    ("left", None, _nulled("s"), "inputs.s and s: one is null, the other not"),
    ("right", 0, lambda r: r["inputs"].update(r={"topic": "oj.r", "partition": 1, "offset": 2}), "one is null"),
    ("full", 0, _nulled("inputs.s", "s"), "the result lacks more than one member"),
    ("full", None, lambda r: r["inputs"]["s"].update(partition=-1, offset=-1), "inputs.s.partition out of range"),
    ("semi", None, lambda r: r["inputs"].update(s={}), "missing inputs.s.topic"),
    ("anti", 1, lambda r: r.pop("r"), "missing r.k"),
])
def test_json_reader_rejects_nulls_the_job_does_not_allow(join_type: str, lacking: int | None,
                                                          edit: Callable[[dict], None], reason: str) -> None:
    layout = result_layout(outer_job(join_type))
    good = json.dumps(_record(layout, lacking)).encode()
    bad = _record(layout, lacking)
    edit(bad)
    decoded = decode_results(layout, "json", [good, json.dumps(bad).encode(), good])
    assert [(r.index, r.reason) for r in decoded.rejects] == [(1, "malformed")]
    assert reason in decoded.rejects[0].detail
    assert len(decoded.columns["event_time"]) == 2


def _loose_schema(layout: ResultLayout) -> dict:
    """The published schema with every member a union with null, to write records it forbids."""
    schema = copy.deepcopy(results_avro_schema(layout))
    for f in [*schema["fields"][3]["type"]["fields"], *schema["fields"][4:]]:
        f["type"] = f["type"] if isinstance(f["type"], list) else ["null", f["type"]]
    return schema


def test_avro_reader_rejects_nulls_the_job_does_not_allow() -> None:
    layout = result_layout(outer_job("full", output="avro"))
    published = fastavro.parse_schema(results_avro_schema(layout))

    def written(record: dict, schema: Any = published) -> bytes:
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, schema, record)
        return buf.getvalue()

    good = _record(layout, 1, "avro")
    half = copy.deepcopy(good)
    half["inputs"]["r"] = None  # r's fields stay
    both = copy.deepcopy(good)
    both["inputs"]["r"] = both["r"] = None
    values = [written(good), written(half), written(both)]
    decoded = decode_results(layout, "avro", values)
    assert [(r.index, r.detail) for r in decoded.rejects] == [
        (1, "inputs.r and r: one is null, the other not"), (2, "the result lacks more than one member")]

    left = result_layout(outer_job("left", output="avro"))
    record = _record(left, fmt="avro")
    record["inputs"]["r"] = record["r"] = None  # r is no union in the left join's schema
    decoded = decode_results(left, "avro", [written(record, fastavro.parse_schema(_loose_schema(left)))])
    assert [r.index for r in decoded.rejects] == [0]


def test_blocks_reader_takes_minus_one_refs_of_optional_streams_only() -> None:
    layout = result_layout(outer_job("left"))
    block = with_absent(layout, plain_block(layout, 3), [None, 1, None])

    def edited(row: int, **values: int) -> list[bytes]:
        """The block's record with `values` (column name with "_" for ".") set in one row."""
        cols = {k: v.copy() for k, v in block.columns.items()}
        for name, value in values.items():
            cols[name.replace("_", ".")][row] = value
        return encode_blocks(Block(cols))

    values = [*encode_blocks(block), *edited(0, r_partition=ABSENT, r_offset=ABSENT), *edited(1, s_offset=5),
              *edited(0, s_partition=-2)]
    decoded = decode_results(layout, "blocks", values)
    assert [(r.index, r.detail) for r in decoded.rejects] == [
        (1, "r.partition or r.offset negative (not optional)"), (2, "s.partition or s.offset negative"),
        (3, "s.partition or s.offset negative")]
    assert_columns_equal(decoded.columns, block)

    full = result_layout(outer_job("full"))
    both = with_absent(full, block, [None, 0, None])
    both.columns["s.partition"][1] = both.columns["s.offset"][1] = ABSENT
    assert [r.detail for r in decode_results(full, "blocks", encode_blocks(both)).rejects] == [
        "a result lacks more than one member"]


# ------------------------------------------------------------------- fuzz

MEMBER_PATHS = ["inputs.r", "inputs.s", "r", "s"]


@settings(max_examples=examples(80), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data(), st.sampled_from(["json", "avro"]))
def test_nulled_members_decode_exactly_when_they_form_one_absent_member(data: st.DataObject, fmt: str) -> None:
    """Any set of members nulled in a record: it reads back iff the nulls are none, or the ref and
    fields of one optional stream and nothing else."""
    job = data.draw(outer_jobs(output=fmt))
    layout = result_layout(job)
    record = _record(layout, fmt=fmt)
    nulled = data.draw(st.sets(st.sampled_from(MEMBER_PATHS)))
    _nulled(*nulled)(record)
    if fmt == "json":
        value = json.dumps(record).encode()
    else:  # the published schema where it can write the nulls, else bytes it forbids
        optional = {p for s in layout.streams if s.optional for p in (f"inputs.{s.name}", s.name)}
        schema = results_avro_schema(layout) if nulled <= optional else _loose_schema(layout)
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, fastavro.parse_schema(schema), record)
        value = buf.getvalue()
    decoded = decode_results(layout, fmt, [value])
    fine = not nulled or any(nulled == {f"inputs.{s.name}", s.name} for s in layout.streams if s.optional)
    if fine:
        assert decoded.rejects == [], (nulled, decoded.rejects)
    else:
        assert [r.index for r in decoded.rejects] == [0], nulled


@settings(max_examples=examples(80), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data(), st.sampled_from(FMTS))
def test_damaged_null_padded_records_never_raise(data: st.DataObject, fmt: str) -> None:
    layout = result_layout(data.draw(outer_jobs(output="avro" if fmt == "avro" else "json")))
    block = data.draw(outer_blocks(layout))
    damaged = []
    for v in encoded(layout, fmt, block):
        cut = data.draw(st.integers(0, len(v)))
        mutated = bytearray(v[:cut] + data.draw(st.sampled_from([b"", b"null", b"\x00", b"\x02", b"-1", b"{}"]))
                            + data.draw(st.binary(max_size=3)) + v[cut + data.draw(st.integers(0, 6)):])
        if mutated and data.draw(st.booleans()):
            mutated[data.draw(st.integers(0, len(mutated) - 1))] ^= data.draw(st.integers(1, 255))
        damaged.append(bytes(mutated))
    decoded = decode_results(layout, fmt, damaged)
    rejected = [r.index for r in decoded.rejects]
    assert rejected == sorted(set(rejected)) and all(r.reason == "malformed" and r.detail for r in decoded.rejects)
    rows_per_value = len(block) if fmt == "blocks" else 1
    assert len(decoded.columns["event_time"]) == rows_per_value * (len(damaged) - len(rejected))
    for s in layout.streams:  # what decodes is a result: refs in range, or an optional member absent
        part, off = decoded.columns[f"{s.name}.partition"], decoded.columns[f"{s.name}.offset"]
        absent = (part == ABSENT) & (off == ABSENT)
        assert ((part >= 0) & (off >= 0) | (absent & s.optional)).all()


# ------------------------------------------------------------ Spark verifier


def _verified(spark, job: JobSettings, values: list[bytes]) -> list:  # type: ignore[no-untyped-def]
    """The Spark verifier's rows of result record values."""
    from streamjoin.services.spark.kafka_source import RECORD_SCHEMA
    from streamjoin.services.spark.result_records import decode_results as verify

    raw = spark.createDataFrame([(job.results_topic, 0, o, 0, None, v, {}) for o, v in enumerate(values)],
                                RECORD_SCHEMA)
    return verify(raw, job).collect()


@pytest.mark.spark
@pytest.mark.parametrize("output", FMTS)
def test_spark_verifier_checks_ids_of_null_padded_results(spark, output: str) -> None:  # type: ignore[no-untyped-def]
    from streamjoin.schemas.results import ref_columns
    from streamjoin.services.spark.result_records import ID_OK, RECORD_OK, RESULT_ID
    from tests.unit.result_writer import Result, encode, result_id

    job = outer_job("full", output=output)
    results = [Result((("oj.r", 1, 7), ("oj.s", 2, (5 << BLOCK_SHIFT) | 3)), 100, 150),
               Result((("oj.r", 0, 9), ("oj.s", ABSENT, ABSENT)), 120, 160, {"r": {"k": 4}}),
               Result((("oj.r", ABSENT, ABSENT), ("oj.s", 3, 0)), 130, 170, {"s": {"k": 5}})]
    rows = _verified(spark, job, encode(job, results))
    assert all(r[RECORD_OK] and r[ID_OK] for r in rows)
    got = sorted((tuple((job.topic_of(s), r[ref_columns(s.name)[0]], r[ref_columns(s.name)[1]])
                        for s in job.streams), r[RESULT_ID]) for r in rows)
    assert got == sorted((r.refs, result_id(job, r)) for r in results)


@pytest.mark.spark
def test_spark_verifier_fails_json_nulls_the_job_does_not_allow(spark) -> None:  # type: ignore[no-untyped-def]
    from streamjoin.services.spark.result_records import ID_OK, RECORD_OK
    from tests.unit.result_writer import Result, encode

    job = outer_job("left")
    padded = Result((("oj.r", 0, 9), ("oj.s", ABSENT, ABSENT)), 120, 160)
    whole = Result((("oj.r", 0, 9), ("oj.s", 1, 3 << BLOCK_SHIFT)), 120, 160)
    edits = [(whole, _nulled("inputs.r", "r")),  # r is not optional
             (whole, _nulled("inputs.s")), (padded, lambda r: r.update(s={"k": 1, "ts": 2})),  # half a member
             (whole, lambda r: r["inputs"]["s"].update(partition=-1, offset=-1))]  # -1 stated, not absent
    values = encode(job, [padded])
    for result, edit in edits:
        record = json.loads(encode(job, [result])[0])
        edit(record)
        values.append(json.dumps(record).encode())
    verdicts = [(r[RECORD_OK], r[ID_OK]) for r in _verified(spark, job, values)]
    assert verdicts == [(True, True)] + [(False, False)] * len(edits)


@pytest.mark.parametrize("table_first", [False, True])
def test_an_asof_left_joins_table_member_is_the_optional_one(table_first: bool) -> None:
    """An as-of left join (join.table) lacks only the table's member, whichever place the job
    gives the table: its Avro ref and fields take the null branch, the stream's never do."""
    specs = [{"name": n, "fields": {"k": "int", "ts": "int"}, "time_field": "ts", "key_fields": ["k"]} for n in "os"]
    table = "o" if table_first else "s"
    job = JobSettings(job="aj", streams=specs, join={"table": table, "type": "left"}, output={"format": "avro"})
    layout = result_layout(job)
    assert [s.optional for s in layout.streams] == [table_first, not table_first]
    members = {f["name"]: f["type"] for f in results_avro_schema(layout)["fields"]}
    assert ("null" in json.dumps(members[table])) and ("null" not in json.dumps(members["s" if table_first else "o"]))
    inner = JobSettings(job="aj", streams=specs, join={"table": table, "type": "inner"}, output={"format": "avro"})
    assert not any(s.optional for s in result_layout(inner).streams)
