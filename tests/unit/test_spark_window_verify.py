"""Spark verify of tumbling and hopping window joins: the hash worker's own results (its batch
function, restarted from disk midway), written as JSON and Avro records, decode with their
window_start, pass the id check (which mixes the window start in), and compare exactly with
the window oracle keyed by refs and window_start; a record moved to another instance fails
both."""

from __future__ import annotations

import json

import pytest

from streamjoin.engine.block import concat
from streamjoin.schemas.result_encode import encode_avro, encode_json
from streamjoin.schemas.result_format import result_layout
from streamjoin.services.hash.processor import group_store, join_plan, run_cycle
from streamjoin.services.io.intake import routing_for
from streamjoin.services.io.templates import stream_templates
from streamjoin.services.spark.compare import actual_refs, compare
from streamjoin.services.spark.result_records import ID_OK, RECORD_OK, decode_results
from streamjoin.services.spark.window_oracle import expected_window_join
from streamjoin.settings import load
from streamjoin.state.store import Store
from tests.unit.test_outer_state import GROUP, _batches
from tests.unit.test_window_state import FLOOR, _buffers

pytestmark = pytest.mark.spark


CASES = [({"hopping_ms": 40, "slide_ms": 15}, "full", "json"), ({"tumbling_ms": 30}, "inner", "json"),
         ({"hopping_ms": 45, "slide_ms": 20}, "anti", "avro")]


def _job(tmp_path, window: dict, join_type: str, output: str):
    streams = [{"name": n, "fields": {"k": "int", "ts": "int"}, "time_field": "ts", "key_fields": ["k"],
                "window": window} for n in "rs"]
    return load(None, job="wj", streams=streams, join={"allowed_lateness_ms": 5, "type": join_type},
                worker={"state_dir": str(tmp_path), "memory_bytes": 1 << 30}, output={"format": output})


def _engine(job, tmp_path):
    """The worker's results of a random workload (none late: the batches' disorder is within the
    lateness), and the inputs as the oracle takes them."""
    plan = join_plan(job)
    store = group_store(job, plan, Store(tmp_path / "db"), stream_templates(job))
    batches, offsets, results, dead = _batches(3, 25), [0, 0], [], []
    inputs: list[list[tuple]] = [[], []]
    for n, batch in enumerate(batches + [[]]):
        if n == 12:  # a restart: the window, copies and marks, read back from disk
            store.rocksdb.close()
            store = group_store(job, plan, Store(tmp_path / "db"), stream_templates(job))
        for stream, key, ts in batch:  # offsets are handed out in arrival order, per stream
            inputs[stream].append((GROUP, len(inputs[stream]), key, ts, GROUP))
        (done,) = run_cycle(job, plan, store, _buffers(job, batch, offsets), [routing_for(job, job.partitions)] * 2,
                            now_ms=0, extra=[GROUP], floors={GROUP: FLOOR} if n == len(batches) else None)
        tx = store.rocksdb.transaction()
        store.stage(tx, GROUP, done.state, done.appended, done.marks)
        tx.commit()
        results.append(done.results)
        dead += done.dead
    store.rocksdb.close()
    assert not dead
    return concat(results), inputs


@pytest.mark.parametrize("window, join_type, output", CASES, ids=["hopping-full-json", "tumbling-inner-json",
                                                                 "hopping-anti-avro"])
def test_worker_results_verify_exactly_and_a_moved_one_does_not(spark, tmp_path, window: dict, join_type: str,
                                                                 output: str) -> None:
    job = _job(tmp_path, window, join_type, output)
    size, slide = job.window_instance
    block, inputs = _engine(job, tmp_path)
    layout = result_layout(job)
    values = (encode_json if output == "json" else encode_avro)(layout, block)
    assert len(values) > 10
    if output == "json":  # one result moved to the next instance, its end with it: a valid record, a wrong id
        moved = json.loads(values[0])
        moved["window_start"] += slide
        moved["window_end"] += slide
        values = [json.dumps(moved, separators=(",", ":")).encode(), *values[1:]]
    raw = spark.createDataFrame([(v,) for v in values], "value binary")
    decoded = decode_results(raw, job).cache()
    assert decoded.filter(~decoded[RECORD_OK]).count() == 0
    bad_ids = decoded.filter(~decoded[ID_OK]).count()
    frames = [spark.createDataFrame(rows, "partition int, offset long, key long, ts long, group int") for rows in inputs]
    marks = spark.createDataFrame([(GROUP, FLOOR)], "group int, watermark long")
    expected = expected_window_join(frames, size, slide, join_type, marks)
    diff = compare(expected, actual_refs(decoded, ["r", "s"], windowed=True), 2, windowed=True)
    if output == "json":
        assert bad_ids == 1 and diff["missing"] == 1 and diff["extra"] == 1
    else:
        assert bad_ids == 0 and diff == {"missing": 0, "extra": 0, "duplicates": 0, "expected": len(values)}
