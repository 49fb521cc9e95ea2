"""Result records of tumbling and hopping window joins (schemas/result_encode.py,
result_decode.py): window_start and window_end after event_time in JSON and Avro (the
published schema says so), as columns in blocks; every reader gives them back, with null
padded members too; a record whose end is not its start plus the instance size, or that
lacks them, is a reject; sliding-window jobs' records have neither."""

from __future__ import annotations

import io
import json

import fastavro
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamjoin.engine.block import Block
from streamjoin.engine.result_ids import ABSENT, WINDOW_END, WINDOW_START
from streamjoin.schemas.result_decode import decode_results
from streamjoin.schemas.result_encode import encode_avro, encode_json
from streamjoin.schemas.result_format import ResultLayout, result_columns, result_layout, results_avro_schema
from streamjoin.settings import JobSettings
from tests.profiles import examples
from tests.unit.test_result_codec import FMTS, assert_columns_equal
from tests.unit.test_result_codec_outer import JOIN_TYPES, encoded, expected_outer_record, outer_blocks

pytestmark = pytest.mark.unit

SIZE = 1000


def window_job(join_type: str, output: str = "json", window: dict | None = None) -> JobSettings:
    specs = [{"name": n, "fields": {"k": "int", "ts": "int"}, "time_field": "ts", "key_fields": ["k"],
              "window": window or {"hopping_ms": SIZE, "slide_ms": 250}, "format": f}
             for n, f in zip("rs", ("json", "blocks"))]
    return JobSettings(job="wj", streams=specs, join={"mode": "hash", "type": join_type}, output={"format": output})


def with_windows(block: Block, starts: list[int]) -> Block:
    start = np.array(starts, np.int64)
    return Block(dict(block.columns) | {WINDOW_START: start, WINDOW_END: start + SIZE})


def expected_window_record(layout: ResultLayout, block: Block, row: int, fmt: str) -> dict:
    """The spec's record: event_time, then window_start and window_end, then the rest."""
    record = expected_outer_record(layout, block, row, fmt)
    out = {k: record[k] for k in ("result_id", "event_time")}
    out |= {WINDOW_START: int(block[WINDOW_START][row]), WINDOW_END: int(block[WINDOW_END][row])}
    return out | {k: v for k, v in record.items() if k not in out}


@st.composite
def window_blocks(draw: st.DrawFn, layout: ResultLayout) -> Block:
    block = draw(outer_blocks(layout))
    starts = draw(st.lists(st.integers(-(2**62), 2**62) | st.integers(-2000, 2000), min_size=len(block),
                           max_size=len(block)))
    return with_windows(block, starts)


def test_layout_schema_and_columns_name_the_window() -> None:
    layout = result_layout(window_job("full", "avro"))
    assert layout.window_ms == SIZE
    assert list(result_columns(layout))[:6] == ["result_id_hi", "result_id_lo", "event_time", WINDOW_START,
                                                WINDOW_END, "produced_ms"]
    names = [f["name"] for f in results_avro_schema(layout)["fields"]]
    assert names[:5] == ["result_id", "event_time", WINDOW_START, WINDOW_END, "produced_ms"]
    tumbling = result_layout(window_job("inner", window={"tumbling_ms": 700}))
    assert tumbling.window_ms == 700
    sliding = JobSettings(job="sj", streams=[{"name": n, "fields": {"k": "int", "ts": "int"}, "time_field": "ts",
                                              "key_fields": ["k"], "window": {"range_ms": 5}} for n in "rs"])
    plain = result_layout(sliding)
    assert plain.window_ms is None and WINDOW_START not in result_columns(plain)
    assert WINDOW_START not in [f["name"] for f in results_avro_schema(plain)["fields"]]


def test_json_spells_the_window_after_event_time() -> None:
    layout = result_layout(window_job("left"))
    block = Block({"result_id_hi": np.array([1], np.uint64), "result_id_lo": np.array([3], np.uint64),
                   "event_time": np.array([7]), WINDOW_START: np.array([-250]), WINDOW_END: np.array([750]),
                   "produced_ms": np.array([9]), "r.partition": np.array([3], np.int32), "r.offset": np.array([11]),
                   "r.ts": np.array([7]), "r.k": np.array([-4]), "s.partition": np.array([ABSENT], np.int32),
                   "s.offset": np.array([ABSENT]), "s.ts": np.array([0]), "s.k": np.array([0])})
    assert encode_json(layout, block) == [
        b'{"result_id":"00000000000000010000000000000003","event_time":7,"window_start":-250,"window_end":750,'
        b'"produced_ms":9,"inputs":{"r":{"topic":"wj.r","partition":3,"offset":11},"s":null},'
        b'"r":{"k":-4,"ts":7},"s":null}']


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data(), st.sampled_from(JOIN_TYPES))
def test_json_and_avro_are_what_the_spec_and_fastavro_write(data: st.DataObject, join_type: str) -> None:
    layout = result_layout(window_job(join_type, "avro"))
    block = data.draw(window_blocks(layout))
    want = [json.dumps(expected_window_record(layout, block, i, "json"), separators=(",", ":"),
                       ensure_ascii=False).encode() for i in range(len(block))]
    assert encode_json(layout, block) == want
    schema = fastavro.parse_schema(results_avro_schema(layout))
    for i, value in enumerate(encode_avro(layout, block)):
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, schema, expected_window_record(layout, block, i, "avro"))
        assert value == buf.getvalue()


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data(), st.sampled_from(FMTS), st.sampled_from(JOIN_TYPES))
def test_window_results_round_trip_through_every_reader(data: st.DataObject, fmt: str, join_type: str) -> None:
    layout = result_layout(window_job(join_type, "avro" if fmt == "avro" else "json"))
    block = data.draw(window_blocks(layout))
    got = decode_results(layout, fmt, encoded(layout, fmt, block))  # type: ignore[arg-type]
    assert not got.rejects
    assert list(got.columns) == list(result_columns(layout))
    assert_columns_equal(got.columns, block)


@pytest.mark.parametrize("fmt", FMTS)
def test_a_window_end_that_is_not_start_plus_size_is_a_reject(fmt: str) -> None:
    layout = result_layout(window_job("inner", "avro" if fmt == "avro" else "json"))
    block = with_windows(_one_row(layout), [0])
    bad = Block(dict(block.columns) | {WINDOW_END: np.array([SIZE + 1])})
    values = encoded(layout, fmt, block) + encoded(layout, fmt, bad)
    got = decode_results(layout, fmt, values)  # type: ignore[arg-type]
    assert [(r.index, r.reason) for r in got.rejects] == [(1, "malformed")]
    assert f"window_start + {SIZE}" in got.rejects[0].detail
    assert got.columns[WINDOW_START].tolist() == [0]


def test_a_json_record_without_its_window_is_a_reject() -> None:
    layout = result_layout(window_job("inner"))
    value = json.loads(encode_json(layout, with_windows(_one_row(layout), [500]))[0])
    del value[WINDOW_END]
    got = decode_results(layout, "json", [json.dumps(value).encode()])
    assert len(got.rejects) == 1 and WINDOW_END in got.rejects[0].detail


def _one_row(layout: ResultLayout) -> Block:
    cols = {"result_id_hi": np.array([1], np.uint64), "result_id_lo": np.array([2], np.uint64),
            "event_time": np.array([5]), "produced_ms": np.array([6])}
    for n, s in enumerate(layout.streams):
        cols |= {f"{s.name}.partition": np.array([n], np.int32), f"{s.name}.offset": np.array([n + 1]),
                 f"{s.name}.ts": np.array([5]), f"{s.name}.k": np.array([1])}
    return Block(cols)
