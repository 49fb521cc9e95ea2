"""Spark `sources` turns generated tuples into records the workers decode without a
reject and byte for byte; `verify` reads block records and dead letters into the very
tuples (offsets) the workers see."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest
from pyspark.sql.pandas.types import to_arrow_schema

from streamjoin.engine.block import OFF, PART
from streamjoin.schemas.results import H_OFFSET, H_PARTITION, H_REASON, H_TOPIC, dead_letter_headers
from streamjoin.services.spark.kafka_source import RECORD_SCHEMA
from streamjoin.services.spark.sources import block_values, generated_batch, generated_schema, records
from streamjoin.services.spark.input_records import (accepted_inputs, decode_ring_dead_letters, decode_tuples,
                                                     hash_inputs, mark_dead)
from streamjoin.services.workloads import generate
from streamjoin.topology.partitioner import partition_for
from streamjoin.settings import JobSettings, load
from tests.unit.ring_harness import decode

pytestmark = pytest.mark.spark

JOBS = {"equijoin": {}, "band3": {}, "images": {"workload": {"pixels": 50}}}


def _generated(job: JobSettings) -> list[dict[str, np.ndarray]]:
    return [generate(job, i, np.random.default_rng([1, i, 5]), 0, 1500, 200.0) for i in range(len(job.streams))]


def _generated_frame(spark, job: JobSettings, cols: list[dict[str, np.ndarray]]):
    schema = to_arrow_schema(generated_schema(job))
    return spark.createDataFrame(pa.Table.from_batches(
        [generated_batch(job, i, c, schema) for i, c in enumerate(cols)], schema=schema))


def _sorted_rows(cols: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Columns in one canonical row order (by every non-bytes column)."""
    order = np.lexsort([v for v in cols.values() if v.dtype.kind != "S"][::-1])
    return {k: v[order] for k, v in cols.items()}


def _raw(spark, rows: list[tuple]):
    """Kafka reader rows: topic, partition, offset, timestamp_ms, key, value, headers."""
    return spark.createDataFrame(rows, RECORD_SCHEMA)


@pytest.mark.parametrize("name", list(JOBS))
def test_records_decode_without_rejects_byte_for_byte(spark, name: str) -> None:
    job = load(f"streamjoin/jobs/{name}.yaml", **JOBS[name])
    generated = _generated(job)
    written = records(_generated_frame(spark, job, generated), job).collect()
    for spec, cols in zip(job.streams, generated):
        mine = [r for r in written if r.topic == job.topic_of(spec)]
        decoded = decode(spec, [r.value for r in mine], [0] * len(mine), range(len(mine)))
        assert decoded.rejects == []
        assert len(decoded.block) == len(cols[spec.time_field]) > 0
        if spec.format == "blocks":
            assert len(mine) < len(decoded.block), "many tuples per record"
        else:  # keyless streams: null keys, so Kafka spreads them over the partitions
            assert {r.key is None for r in mine} == {not spec.key_fields}
        got, want = _sorted_rows({f: decoded.block[f] for f in spec.fields}), _sorted_rows(cols)
        for f in spec.fields:
            assert got[f].dtype == want[f].dtype and got[f].tobytes() == want[f].tobytes(), (spec.name, f)
    if name == "equijoin":  # JSON tuples padded to tuple_bytes, keyed by their join key
        assert {len(r.value) for r in written} == {job.workload.tuple_bytes}
        assert all(r.key == str(json.loads(r.value)["k"]).encode() for r in written)


def test_verify_reads_block_records_as_the_worker_does(spark) -> None:
    job = load("streamjoin/jobs/images.yaml", workload={"pixels": 50})
    spec = job.streams[1]
    cols = generate(job, 1, np.random.default_rng(3), 0, 1000, 300.0)
    values = block_values(spec, pa.table({f: generated_batch(job, 1, cols, to_arrow_schema(
        generated_schema(job))).column(f"s1_{f}") for f in spec.fields}), budget=20_000)
    assert len(values) > 2, "a budget below the tuples' size cuts them into several records"
    values.append(b"not a block")
    offsets = [3 * i + 1 for i in range(len(values))]
    raw = _raw(spark, [("images.b", 2, o, 77, None, v, {}) for o, v in zip(offsets, values)])
    rows = decode_tuples(raw, spec).collect()
    worker = decode(spec, values, [2] * len(values), offsets)
    assert [r.reason for r in worker.rejects] == ["malformed"]
    ok = sorted((r.partition, r.offset, r.ts, r.v.id, r.v.img) for r in rows if r.ok)
    want = sorted(zip(worker.block[PART].tolist(), worker.block[OFF].tolist(), worker.block["ts"].tolist(),
                      worker.block["id"].tolist(), (bytes(v) for v in worker.block["img"])))
    assert ok == want and len(ok) == len(cols["ts"])
    bad = [r for r in rows if not r.ok]
    assert [(r.record_offset, r.ts) for r in bad] == [(offsets[-1], None)]


def test_ring_dead_letters_cover_exactly_their_tuples(spark) -> None:
    job = load("streamjoin/jobs/images.yaml", workload={"pixels": 4})
    spec = job.streams[0]
    ts = np.array([10, 10, 11, 12], np.int64)
    block = pa.table({"id": pa.array(np.arange(4)), "ts": pa.array(ts), "img": pa.array([b"abcdefghijkl"] * 4)})
    record = block_values(spec, block, budget=1 << 20)[0]
    late = block_values(spec, block.slice(0, 2), budget=1 << 20)[0]  # the worker dead-letters ts 10 only

    def dead(offset: int, reason: str, value: bytes) -> tuple:
        headers = {H_TOPIC: "images.a", H_PARTITION: "0", H_OFFSET: str(offset), H_REASON: reason}
        return ("images.dead-letter", 0, offset, 0, None, value, headers)

    inputs = _raw(spark, [("images.a", 0, 5, 1, None, record, {}), ("images.a", 0, 6, 1, None, record, {}),
                          ("images.a", 0, 7, 1, None, record, {})])
    letters = _raw(spark, [dead(5, "late", late), dead(6, "oversize", record), dead(9, "malformed", b"?")])
    marked = mark_dead(decode_tuples(inputs, spec), decode_ring_dead_letters(letters, job)).collect()
    reasons = {(r.record_offset, r.offset & 0xFFFFF): r.reason for r in marked}
    assert reasons == {(5, 0): "late", (5, 1): "late", (5, 2): None, (5, 3): None,
                       **{(6, i): "oversize" for i in range(4)}, **{(7, i): None for i in range(4)}}


def test_hash_dead_letters_exclude_their_inputs_whatever_the_reason(spark) -> None:
    streams = [{"name": n, "fields": {"k": "int", "ts": "int"}, "time_field": "ts", "key_fields": ["k"],
                "window": {"range_ms": 10}} for n in "rs"]
    job = load(None, job="dl", streams=streams)

    def letter(topic: str, offset: int, reason: str) -> tuple:
        headers = {k: v.decode() for k, v in dead_letter_headers(reason, "test", topic, 1, offset, group=1, seq=0)}
        return (job.dead_letter_topic, 1, offset, 0, None, b"{}", headers)

    inputs = [("dl.r", 1, o, 0, b"1", b'{"k": 1, "ts": 5}', {}) for o in range(4)] + [
        ("dl.r", 1, 4, 0, b"1", b'{"k": 1, "ts": oops', {}),  # malformed and never dead-lettered: lost
        ("dl.s", 1, 0, 0, b"1", b'{"k": 1, "ts": 6}', {})]
    letters = [letter("dl.r", 1, "misrouted"), letter("dl.r", 2, "late"), letter("dl.s", 0, "oversize")]
    decoded, dead = hash_inputs(_raw(spark, inputs + letters), job)
    reasons = {(r.topic, r.offset): (r.ok, r.reason) for d in decoded for r in d.collect()}
    assert {r.group for d in decoded for r in d.collect() if r.ok} == {partition_for(b"1", job.partitions)}
    assert reasons == {("dl.r", 0): (True, None), ("dl.r", 1): (True, "misrouted"), ("dl.r", 2): (True, "late"),
                       ("dl.r", 3): (True, None), ("dl.r", 4): (False, None), ("dl.s", 0): (True, "oversize")}
    assert [sorted(r.offset for r in accepted_inputs(d).collect()) for d in decoded] == [[0, 3], []]
    assert dead.count() == 3


def test_key_groups_are_where_kafka_puts_the_key_text(spark) -> None:
    """A tuple's group is the partition Kafka's default partitioner gives its canonical key
    text, wherever the record came in: a misrouted record is joined there too."""
    fields = {"k": "int", "c": "str", "b": "bool", "ts": "int"}
    streams = [{"name": n, "fields": fields, "time_field": "ts", "key_fields": ["k", "c", "b"],
                "window": {"range_ms": 10}} for n in "rs"]
    job = load(None, job="kg", partitions=7, streams=streams)
    keys = [(k, c, b) for k in (-3, 0, 12345678901) for c in ("", "x,y", "é") for b in (True, False)]
    values = [json.dumps({"k": k, "c": c, "b": b, "ts": 1}).encode() for k, c, b in keys]
    decoded, _ = hash_inputs(_raw(spark, [("kg.r", 0, o, 0, None, v, {}) for o, v in enumerate(values)]), job)
    got = {r.offset: r.group for r in decoded[0].collect()}
    want = {o: partition_for(f"{k},{c},{str(b).lower()}".encode(), 7) for o, (k, c, b) in enumerate(keys)}
    assert got == want and len(set(want.values())) > 1
