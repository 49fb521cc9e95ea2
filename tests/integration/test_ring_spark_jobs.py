"""The Spark jobs in ring mode on the embedded broker: `run_sources` writes the 3-way
band workload (JSON records without keys) and the image workload (Arrow blocks),
every record decodes through the worker's codecs without a reject; the test then
writes a results topic computed with reference_theta_join (JSON results for band3,
Arrow blocks for images) and the round releases a ring head commits, and
`run_verify` must accept it, respect dead letters and the release watermark, and
catch a loss and a duplicate."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import pytest

from streamjoin.engine.block import OFF, PART, Block
from streamjoin.engine.predicates import compile_terms
from streamjoin.engine.reference import RefWindow, ThetaTuple, TupleRef, reference_theta_join
from streamjoin.schemas.codecs import BLOCK_SHIFT, encode_block
from streamjoin.schemas.results import dead_letter_headers
from streamjoin.services import broker as embedded
from streamjoin.services.io import kafka
from streamjoin.services.spark.kafka_source import NAME as KAFKA
from streamjoin.services.spark.sources import run_sources
from streamjoin.services.spark.verify import run_verify
from streamjoin.settings import JobSettings, load
from streamjoin.topology import topics
from tests.unit.result_writer import Result as ResultRecord
from tests.unit.result_writer import encode, round_release
from tests.unit.ring_harness import decode, pair_predicate

pytestmark = [pytest.mark.spark, pytest.mark.integration]

Result = tuple[TupleRef, ...]


@dataclass
class Written:
    job: JobSettings
    sources: dict
    records: dict[str, list]  # topic -> Kafka rows
    tuples: list[list[ThetaTuple]]  # per stream, as the workers decode them


@pytest.fixture(scope="module")
def bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    broker = embedded.start(log_path=tmp_path_factory.mktemp("broker") / "broker.log")
    try:
        yield broker.bootstrap
    finally:
        broker.stop()


def write_workload(spark, bootstrap: str, job_file: str, name: str, seconds: float, **overrides: object) -> Written:
    job = load(job_file, job=name, bootstrap=bootstrap, **overrides)
    topics.ensure(kafka.Cluster(bootstrap).admin(), job)
    report = run_sources(job, kafka.Cluster(bootstrap), seconds=seconds, show_progress=False)
    rows = (spark.read.format(KAFKA).option("bootstrap", bootstrap).option("topics", ",".join(job.input_topics))
            .load().select("topic", "partition", "offset", "key", "value").collect())
    records = {t: [r for r in rows if r.topic == t] for t in job.input_topics}
    tuples = []
    for spec in job.streams:
        mine = records[job.topic_of(spec)]
        decoded = decode(spec, [r.value for r in mine], [r.partition for r in mine], [r.offset for r in mine])
        assert decoded.rejects == [], decoded.rejects[:3]
        b = decoded.block
        tuples.append([ThetaTuple((job.topic_of(spec), int(p), int(o)), int(ts), {f: _value(b[f], k) for f in spec.fields})
                       for k, (p, o, ts) in enumerate(zip(b[PART], b[OFF], b[spec.time_field]))])
    return Written(job, report, records, tuples)


def _value(column: np.ndarray, k: int) -> object:
    """Row k's value; bytes whole (a NumPy 'S' element drops trailing NUL bytes)."""
    return column[k:k + 1].tobytes() if column.dtype.kind == "S" else column[k]


@pytest.fixture(scope="module")
def band3(spark, bootstrap: str) -> Written:
    return write_workload(spark, bootstrap, "streamjoin/jobs/band3.yaml", "band3it", seconds=3)


@pytest.fixture(scope="module")
def images(spark, bootstrap: str) -> Written:
    return write_workload(spark, bootstrap, "streamjoin/jobs/images.yaml", "imagesit", seconds=2,
                          workload={"pixels": 500, "rate": 200}, output={"format": "blocks"})


def expected(w: Written, release: int, dead: set[TupleRef]) -> list[Result]:
    """reference_theta_join over the accepted tuples: released and not dead-lettered."""
    job = w.job
    accepted = [[t for t in s if t.ts < release and t.ref not in dead] for s in w.tuples]
    terms = compile_terms([s.name for s in job.streams], list(job.join.predicate), job.join.udfs)
    windows = [RefWindow(s.window.range_ms, s.window.rows) for s in job.streams]
    return sorted(reference_theta_join(accepted, windows, pair_predicate(terms)))


def write_results(job: JobSettings, bootstrap: str, results: list[Result], ts: dict[TupleRef, int],
                  release: int) -> None:
    """Two rounds as a ring head writes them: each round's results in the job's output
    format, then its release on the commits topic; verify must take the highest release."""
    p = kafka.Cluster(bootstrap).producer()
    now = int(time.time() * 1000)
    half = len(results) // 2
    for n, (chunk, wm) in enumerate(((results[:half], release - 100), (results[half:], release))):
        for value in encode(job, [ResultRecord(r, max(ts[ref] for ref in r), now) for r in chunk]):
            p.produce(job.results_topic, partition=0, value=value)
        p.produce(job.commits_topic, partition=0, key=b"head", value=round_release(wm, n))
    assert p.flush(30) == 0


def write_dead_letter(job: JobSettings, bootstrap: str, ref: TupleRef, value: bytes) -> None:
    p = kafka.Cluster(bootstrap).producer()
    p.produce(job.dead_letter_topic, partition=ref[1], value=value,
              headers=dead_letter_headers("late", "test", ref[0], ref[1], ref[2], group=ref[1], seq=0))
    assert p.flush(30) == 0


def test_band3_workload_as_unkeyed_json(band3: Written) -> None:
    job = band3.job
    assert {s.name: len(t) for s, t in zip(job.streams, band3.tuples)} == band3.sources["records"]
    for spec in job.streams:
        rows = band3.records[job.topic_of(spec)]
        # No key: the producer's partitioner spreads them (sticky per batch, so not asserted here).
        assert all(r.key is None for r in rows)
        assert 40 < band3.sources["rate"][spec.name] < 250, band3.sources


def test_images_workload_as_blocks(images: Written) -> None:
    job = images.job
    assert {s.name: len(t) for s, t in zip(job.streams, images.tuples)} == images.sources["records"]
    for spec, tuples in zip(job.streams, images.tuples):
        assert len(images.records[job.topic_of(spec)]) < len(tuples) and len(tuples) > 100, "many per record"
        assert {len(t.fields["img"]) for t in tuples} <= {1500}


def test_verify_ring_json_inputs(band3: Written, bootstrap: str) -> None:
    job = band3.job
    first = min(t.ts for s in band3.tuples for t in s)
    release = first + 800  # later tuples are not released yet: nothing is expected of them
    dead = min(r[1] for r in expected(band3, release, set()))  # an s tuple with results
    write_dead_letter(job, bootstrap, dead, b"{}")
    results = expected(band3, release, {dead})
    assert len(results) > 20, "the workload should join"
    ts = {t.ref: t.ts for s in band3.tuples for t in s}
    write_results(job, bootstrap, results, ts, release)
    report = run_verify(job, kafka.Cluster(bootstrap))
    assert report["verified"], report
    assert report["expected"] == report["results"] == len(results)
    assert report["release_watermark"] == release
    assert report["dead_letter"] == {"count": 1, "by_reason": {"late": 1}, "records": 1}
    assert report["unreleased"] == sum(t.ts >= release for s in band3.tuples for t in s)
    assert report["delay_ms"]["p50"] is not None

    # The same inputs under another job name (own results and dead letters): lose one, repeat one.
    bad = job.model_copy(update={"job": "band3it-bad", "streams": [s.model_copy(update={"topic": job.topic_of(s)})
                                                                      for s in job.streams]})
    topics.ensure(kafka.Cluster(bootstrap).admin(), bad)
    write_dead_letter(bad, bootstrap, dead, b"{}")
    write_results(bad, bootstrap, results[1:] + results[-1:], ts, release)
    report = run_verify(bad, kafka.Cluster(bootstrap))
    assert not report["verified"]
    assert (report["missing"], report["extra"], report["duplicates"]) == (1, 0, 1), report


def test_verify_ring_block_inputs(images: Written, bootstrap: str) -> None:
    job = images.job
    first = min(t.ts for s in images.tuples for t in s)
    release = first + 350
    # A worker dead-letters a block record's late tuples as one block of just those,
    # named by the record's offset: here those of one record with one event time.
    by_ref = {t.ref: t for t in images.tuples[1]}
    late = by_ref[min(r[1] for r in expected(images, release, set()))]  # a b tuple with results
    record = (late.ref[0], late.ref[1], late.ref[2] >> BLOCK_SHIFT)
    dead = sorted(t.ref for t in images.tuples[1]
                  if (t.ref[0], t.ref[1], t.ref[2] >> BLOCK_SHIFT) == record and t.ts == late.ts)
    block = Block({f: np.array([by_ref[r].fields[f] for r in dead]) for f in job.streams[1].fields})
    write_dead_letter(job, bootstrap, record, encode_block(block))
    results = expected(images, release, set(dead))
    assert len(results) > 20, "the workload should join"
    ts = {t.ref: t.ts for s in images.tuples for t in s}
    write_results(job, bootstrap, results, ts, release)
    report = run_verify(job, kafka.Cluster(bootstrap))
    assert report["verified"], report
    assert report["expected"] == report["results"] == len(results)
    assert report["dead_letter"]["count"] == len(dead)
