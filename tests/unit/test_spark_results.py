"""`verify` reads result records in every output.format into the refs they were written
from, recomputes their 128-bit ids, counts (never crashes on) records that do not decode
or carry a wrong id, and takes watermarks from the commits topic."""

from __future__ import annotations

import json

from typing import Callable

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from streamjoin.engine.block import Block
from streamjoin.schemas.codecs import BLOCK_SHIFT
from streamjoin.schemas.result_encode import encode_avro, encode_blocks
from streamjoin.schemas.result_format import result_layout
from streamjoin.schemas.results import RESULT_ID_HI, RESULT_ID_LO, ref_columns
from streamjoin.services.spark.kafka_source import RECORD_SCHEMA
from streamjoin.services.spark.result_records import (ID_OK, RECORD_OK, RESULT_ID, decode_results, final_watermarks,
                                                      release_watermark)
from streamjoin.settings import JobSettings, load
from tests.unit.result_writer import Result, batch_commit, encode, result_block, result_id, round_release
from tests.profiles import examples

pytestmark = pytest.mark.spark

FORMATS = ["json", "avro", "blocks"]
EXTRA_TYPES = ["int", "float", "str", "bool", "bytes"]


def make_job(output: str, formats: list[str], extra: list[dict[str, str]], name: str = "res-job") -> JobSettings:
    """Hash mode (results carry every field, bytes too), one int key, streams a, b, ... in `formats`."""
    streams = [{"name": "abcd"[i], "format": f, "fields": {"k": "int", "ts": "int", **x}, "time_field": "ts",
                "key_fields": ["k"], "window": {"range_ms": 1000}} for i, (f, x) in enumerate(zip(formats, extra))]
    return load(None, job=name, streams=streams, output={"format": output})


def raw_rows(spark, topic: str, values: list[bytes | None]):
    """Kafka reader rows (RECORD_SCHEMA) holding `values` at offsets 0, 1, ..."""
    return spark.createDataFrame([(topic, 0, o, 0, None, v, {}) for o, v in enumerate(values)], RECORD_SCHEMA)


def decoded(spark, job: JobSettings, values: list[bytes | None]) -> list:
    return decode_results(raw_rows(spark, job.results_topic, values), job).collect()


def refs_of(job: JobSettings, row) -> tuple:
    return tuple((job.topic_of(s), row[ref_columns(s.name)[0]], row[ref_columns(s.name)[1]]) for s in job.streams)


# ---------------------------------------------------------------- round trips

_FIELD_VALUES = {
    "int": st.integers(-(1 << 63), (1 << 63) - 1),
    "float": st.floats(allow_nan=True, allow_infinity=True),
    # Quotes, backslashes, control characters, any Unicode a UTF-8 text can hold (no lone surrogates).
    "str": st.text(st.characters(exclude_categories=["Cs"]), max_size=8),
    "bool": st.booleans(),
    "bytes": st.binary(max_size=8),
}


@st.composite
def jobs_and_results(draw, output: str) -> tuple[JobSettings, list[Result]]:
    m = draw(st.integers(2, 3))
    formats = draw(st.lists(st.sampled_from(["json", "blocks"]), min_size=m, max_size=m))
    names = st.sampled_from(["x", "y", "z"])
    extra = [draw(st.dictionaries(names, st.sampled_from(EXTRA_TYPES), max_size=2)) for _ in range(m)]
    job = make_job(output, formats, extra)

    def ref(i: int) -> st.SearchStrategy:
        topic = job.topic_of(job.streams[i])
        offsets = (st.builds(lambda rec, idx: (rec << BLOCK_SHIFT) | idx, st.integers(0, (1 << 40) - 1),
                             st.integers(0, (1 << BLOCK_SHIFT) - 1)) if formats[i] == "blocks"
                   else st.integers(0, (1 << 62)))
        return st.tuples(st.just(topic), st.integers(0, 999), offsets)

    def values(i: int) -> st.SearchStrategy:
        return st.fixed_dictionaries({n: _FIELD_VALUES[t] for n, t in job.streams[i].fields.items()})

    result = st.builds(Result, st.tuples(*[ref(i) for i in range(m)]), st.integers(0, 1 << 45),
                       st.integers(0, 1 << 45),
                       st.fixed_dictionaries({s.name: values(i) for i, s in enumerate(job.streams)}))
    return job, draw(st.lists(result, min_size=1, max_size=12))


@pytest.mark.parametrize("output", FORMATS)
# Every example is a Spark job: no shrinking (minutes of them); a failure shows its example as drawn.
@settings(max_examples=examples(6), deadline=None, suppress_health_check=[HealthCheck.too_slow],
          phases=[Phase.explicit, Phase.reuse, Phase.generate])
@given(data=st.data())
def test_results_decode_to_the_refs_they_were_written_from(spark, output: str, data: st.DataObject) -> None:
    job, results = data.draw(jobs_and_results(output))
    rows = decoded(spark, job, encode(job, results))
    assert all(r[RECORD_OK] and r[ID_OK] for r in rows)
    got = sorted((refs_of(job, r), r.event_time, r.produced_ms, r[RESULT_ID]) for r in rows)
    want = sorted((r.refs, r.event_time, r.produced_ms, result_id(job, r)) for r in results)
    assert got == want


# ---------------------------------------------------------------- malformed records

JOB = make_job("json", ["json", "blocks"], [{"pad": "str"}, {}])
GOOD = [Result((("res-job.a", 1, 7), ("res-job.b", 2, (5 << BLOCK_SHIFT) | 3)), 100, 150),
        Result((("res-job.a", 0, 9), ("res-job.b", 3, 0)), 120, 160)]


def _as(output: str) -> JobSettings:
    return JOB.model_copy(update={"output": JOB.output.model_copy(update={"format": output})})


def _json_edit(r: Result, edit) -> bytes:
    record = json.loads(encode(JOB, [r])[0])
    edit(record)
    return json.dumps(record).encode()


def _with_ids_of(job: JobSettings, results: list[Result], others: list[Result]) -> Block:
    """A result block of `results` whose ids are those of `others`."""
    block, theirs = result_block(job, results), result_block(job, others)
    return Block(dict(block.columns) | {c: theirs[c] for c in (RESULT_ID_HI, RESULT_ID_LO)})


def test_malformed_json_results_are_counted(spark) -> None:
    def set_ref(stream: str, **values) -> Callable[[dict], None]:
        return lambda j: j["inputs"][stream].update(values)

    values = encode(JOB, GOOD) + [
        b"not json", None, b"[1, 2]", b'{"result_id": "00"',
        _json_edit(GOOD[0], lambda j: j.update(result_id=result_id(JOB, GOOD[1]))),  # another result's id
        _json_edit(GOOD[0], lambda j: j.update(result_id=result_id(JOB, GOOD[0]).upper())),  # not lower-case hex
        _json_edit(GOOD[0], lambda j: j["inputs"].pop("b")),  # a ref missing
        _json_edit(GOOD[0], lambda j: j["inputs"]["b"].pop("index")),  # a blocks ref without its index
        _json_edit(GOOD[0], set_ref("b", index=1 << BLOCK_SHIFT)),  # index out of range
        _json_edit(GOOD[0], set_ref("a", partition="1")),  # mistyped
        _json_edit(GOOD[0], set_ref("a", topic="elsewhere")),  # not our source topic
    ]
    rows = decoded(spark, JOB, values)
    verdicts = [(r[RECORD_OK], r[ID_OK]) for r in rows]
    assert verdicts.count((True, True)) == 2
    assert verdicts.count((True, False)) == 3, "wrong id, upper-case id, foreign topic"
    assert verdicts.count((False, False)) == len(values) - 5, "one row per record that does not decode"


def test_malformed_avro_results_are_counted(spark) -> None:
    job = _as("avro")
    good = encode(job, GOOD)
    layout = result_layout(job)
    wrong_id = encode_avro(layout, _with_ids_of(job, GOOD[:1], GOOD[1:]))[0]
    not_hex = good[0][:1] + b"x" * 32 + good[0][33:]  # a 32-byte id string follows its 1-byte length
    values = good + [b"", b"\x00\x01garbage", good[0][:-3], good[0] + b"\x00", None, wrong_id, not_hex]
    rows = decoded(spark, job, values)
    verdicts = [(r[RECORD_OK], r[ID_OK]) for r in rows]
    assert verdicts.count((True, True)) == 2
    assert verdicts.count((True, False)) == 1, "another result's id"
    assert verdicts.count((False, False)) == 6, "empty, garbage, truncated, trailing bytes, null, not hex"


def test_malformed_result_blocks_are_counted(spark) -> None:
    job = _as("blocks")
    block = result_block(job, GOOD)
    missing_column = Block({c: v for c, v in block.columns.items() if c != "b.offset"})
    good = encode_blocks(block)
    values = good + [b"not arrow", None, good[0][:40], *encode_blocks(missing_column),
                     *encode_blocks(_with_ids_of(job, GOOD, GOOD[::-1]))]  # ids swapped
    rows = decoded(spark, job, values)
    verdicts = [(r[RECORD_OK], r[ID_OK]) for r in rows]
    assert verdicts.count((True, True)) == 2
    assert verdicts.count((True, False)) == 2, "the block with swapped ids"
    assert verdicts.count((False, False)) == 4, "not arrow, null, truncated, a column missing"


# ---------------------------------------------------------------- watermarks from commits


def test_group_watermarks_are_the_highest_batch_commit(spark) -> None:
    values = [batch_commit(0, 50), batch_commit(0, 70, seq=1), batch_commit(0, 60, seq=2), batch_commit(3, 5),
              round_release(999), b"not a commit", None]
    rows = final_watermarks(raw_rows(spark, JOB.commits_topic, values)).collect()
    assert {r.group: r.watermark for r in rows} == {0: 70, 3: 5}


def test_release_watermark_is_the_highest_round(spark) -> None:
    commits = raw_rows(spark, JOB.commits_topic, [round_release(10), round_release(40, 1), round_release(30, 2),
                                                  batch_commit(0, 999), b"{}"])
    assert release_watermark(commits) == 40
    assert release_watermark(raw_rows(spark, JOB.commits_topic, [batch_commit(0, 999)])) is None
