"""The scale-out bench's backlog (bench/backlog.py) and its `--scale` option: the
records decode with the workers' JSON codec into the drawn values, are as long as the workload
says and byte for byte what the sources' encoder writes for those values; every record's
partition is Kafka's default partitioner on its key; each partition's event times ascend; the
backlog is a function of the seed; producers own contiguous partition slices; a drain's figures
span the first commit to the last; equal id sets have equal fingerprints; bad --scale values
exit 2 before anything starts."""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

from streamjoin.bench import backlog, scale
from streamjoin.cli import app
from streamjoin.job_files import default_job_file
from streamjoin.schemas.codecs import DECODERS
from streamjoin.services import workloads
from streamjoin.settings import JobSettings, StreamSpec, WindowSpec, load
from streamjoin.topology.partitioner import partition_for

PLAN = backlog.BacklogPlan(tuples=40_000, event_ms=40_000, producers=3, chunk_tuples=4_000)
START_MS = 1_700_000_000_000
runner = CliRunner()


def equijoin_job(seed: int = 7, partitions: int = 12) -> JobSettings:
    job = load(default_job_file())
    return job.model_copy(update={"partitions": partitions,
                                  "workload": job.workload.model_copy(update={"random_state": seed, "domain": 1 << 14})})


def drawn(job: JobSettings) -> list[backlog.Chunk]:
    return list(backlog.chunks(job, PLAN, START_MS))


def records(job: JobSettings, chunk: backlog.Chunk) -> tuple[list[bytes], list[bytes]]:
    spec = job.streams[chunk.stream]
    cols = backlog.tuple_columns(spec, chunk.ts, chunk.key)
    values = backlog.json_values(spec, cols, job.workload.tuple_bytes).cast("binary").to_pylist()
    return values, backlog.record_keys(spec, cols).to_pylist()


def decode(spec: StreamSpec, values: list[bytes]):  # type: ignore[no-untyped-def]
    n = len(values)
    return DECODERS["json"](spec, values, np.zeros(n, np.int32), np.arange(n, dtype=np.int64), np.zeros(n, np.int64))


def test_records_decode_into_the_drawn_values_at_the_workload_length() -> None:
    job = equijoin_job()
    for chunk in drawn(job)[:4]:
        spec = job.streams[chunk.stream]
        values, _ = records(job, chunk)
        decoded = decode(spec, values)
        assert not decoded.rejects
        assert np.array_equal(decoded.block["k"], chunk.key) and np.array_equal(decoded.block["ts"], chunk.ts)
        assert set(np.unique(decoded.block["pad"]).tolist()) <= {"x" * n for n in range(64)}
        assert {len(v) for v in values} == {job.workload.tuple_bytes}


def test_records_are_what_the_sources_encoder_writes_for_those_values() -> None:
    """A stream whose padded string is not last, with a string key and a bool: the encoding of the
    decoded columns by services/workloads.py (the sources' compact JSON) is the same bytes."""
    spec = StreamSpec(name="q", fields={"id": "str", "note": "str", "odd": "bool", "ts": "int", "tag": "str"},
                      time_field="ts", key_fields=["id"], window=WindowSpec(range_ms=1000))
    ts, key = np.arange(500, dtype=np.int64) + START_MS, np.arange(500, dtype=np.int64) ** 3
    values = backlog.json_values(spec, backlog.tuple_columns(spec, ts, key), 80).cast("binary").to_pylist()
    block = decode(spec, values).block
    assert block["id"].tolist() == [str(k) for k in key] and np.array_equal(block["odd"], key % 2 == 1)
    assert set(block["tag"].tolist()) == {""} and {len(v) for v in values} == {80}
    cols = {f: block[f] for f in spec.fields}
    assert workloads.json_values(spec, cols).tolist() == values
    assert np.array_equal(workloads.json_lengths(spec, cols), [80] * 500)


def test_each_record_lands_where_kafkas_default_partitioner_puts_its_key() -> None:
    job = equijoin_job()
    for chunk in drawn(job)[:2]:
        _, keys = records(job, chunk)
        assert keys[:3] == [str(k).encode() for k in chunk.key[:3]]
        assert chunk.partition.tolist() == [partition_for(k, job.partitions) for k in keys]


def test_each_partition_holds_its_tuples_in_event_time_order_over_the_whole_span() -> None:
    job = equijoin_job()
    chunks = drawn(job)
    for stream in range(len(job.streams)):
        mine = [c for c in chunks if c.stream == stream]
        ts, part = np.concatenate([c.ts for c in mine]), np.concatenate([c.partition for c in mine])
        assert START_MS <= ts.min() and ts.max() < START_MS + PLAN.event_ms
        for p in range(job.partitions):
            assert np.all(np.diff(ts[part == p]) >= 0), (stream, p)
        assert abs(len(ts) - PLAN.tuples / 2) < 0.05 * PLAN.tuples / 2  # Poisson around the planned count


def test_the_backlog_is_a_function_of_the_seed() -> None:
    first, again, other = drawn(equijoin_job(7)), drawn(equijoin_job(7)), drawn(equijoin_job(8))
    assert all(np.array_equal(a.key, b.key) and np.array_equal(a.ts, b.ts) for a, b in zip(first, again))
    assert not np.array_equal(first[0].key[:100], other[0].key[:100])


def test_producers_own_contiguous_partition_slices() -> None:
    owner = backlog.owners(np.arange(60), 60, 8)
    assert owner.tolist() == sorted(owner.tolist()) and set(owner.tolist()) == set(range(8))


def test_a_drain_is_timed_and_charged_from_its_first_commit_to_its_last() -> None:
    samples = [scale.Sample(0.0, 0, 1.0, 0.1, 5.0), scale.Sample(2.0, 0, 3.0, 0.2, 5.5),
               scale.Sample(2.5, 1_000, 3.5, 0.2, 6.0), scale.Sample(4.5, 201_000, 5.5, 0.3, 7.0)]
    figures = scale.drain_figures(samples)
    assert figures["inputs"] == 201_000 and figures["drained_tuples"] == 200_000 and figures["drain_seconds"] == 2.0
    assert figures["tuples_per_s"] == 100_000
    cpu = figures["cpu"]
    assert cpu["workers_s"] == 2.0 and cpu["broker_s"] == 1.0 and cpu["workers_since_start_s"] == 5.5
    assert cpu["workers_us_per_tuple"] == pytest.approx(10.0) and cpu["broker_us_per_tuple"] == pytest.approx(5.0)
    assert cpu["workers_cores_busy"] == 1.0 and cpu["broker_cores_busy"] == 0.5


def test_a_drain_done_within_one_sample_is_timed_from_the_sample_before() -> None:
    figures = scale.drain_figures([scale.Sample(0.0, 0, 1.0, 0.1, None), scale.Sample(0.5, 10, 2.0, 0.1, None)])
    assert figures["drained_tuples"] == 10 and figures["tuples_per_s"] == 20
    assert figures["cpu"]["broker_s"] is None and figures["cpu"]["broker_us_per_tuple"] is None


def test_fingerprints_are_equal_for_equal_sets_and_count_duplicates() -> None:
    ids = np.array([[3, 1], [1, 2], [2, 9]], np.uint64)
    shuffled = ids[[2, 0, 1]]
    assert scale.fingerprint(scale.sorted_ids(ids)) == scale.fingerprint(scale.sorted_ids(shuffled))
    doubled = scale.fingerprint(scale.sorted_ids(np.concatenate([ids, ids[:1]])))
    assert doubled["duplicates"] == 1 and doubled["results"] == 4
    assert doubled["sha256"] != scale.fingerprint(scale.sorted_ids(ids))["sha256"]


@pytest.mark.parametrize("text,counts", [("1,2,4,8,12", (1, 2, 4, 8, 12)), (" 4, 1,2,2", (1, 2, 4)), ("60", (60,))])
def test_scale_parses_to_distinct_ascending_worker_counts(text: str, counts: tuple[int, ...]) -> None:
    assert scale.parse_workers(text, 60) == counts


@pytest.mark.parametrize("args,words", [(["bench", "band", "--scale", "1,2"], "--scale is for `bench equijoin` only"),
                                        (["bench", "spill", "--scale", "2"], "--scale is for `bench equijoin` only"),
                                        (["bench", "equijoin", "--scale", "0,2"], "1..60"),
                                        (["bench", "equijoin", "--scale", "61"], "1..60"),
                                        (["bench", "equijoin", "--quick", "--scale", "1,13"], "1..12"),
                                        (["bench", "equijoin", "--scale", "1;2"], "--scale takes worker counts"),
                                        (["bench", "equijoin", "--scale", "1,,2"], "--scale takes worker counts"),
                                        (["bench", "equijoin", "--scale", "two"], "--scale takes worker counts"),
                                        (["bench", "equijoin", "--scale", ""], "--scale takes worker counts")])
def test_bench_cli_rejects_bad_scale_before_starting(args: list[str], words: str) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert words in " ".join(result.output.split())
