"""Recovery (services/hash/recovery.py) on the embedded broker: a batch decided but
only partly written is completed exactly once; a broker slow to answer fetches does
not turn recovery's reads to the end of a partition into partial reads."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from confluent_kafka import TopicPartition

from streamjoin.launcher import committed_offsets, input_end_offsets, wait_drained
from streamjoin.services import metrics
from streamjoin.services.io import kafka
from streamjoin.services.hash.main import Worker
from streamjoin.services.io.deliveries import flush
from streamjoin.services.hash.processor import GroupBatch, run_cycle
from streamjoin.services.hash.recovery import recover_groups
from streamjoin.topology import topics
from tests.integration.conftest import make_job
from tests.integration.kafka_harness import check, produce, produced_refs
from tests.integration.fleet_harness import (feed_in_two_batches, lose_disk_and_rewind, metric, proxied_fleet,
                                             take_through)
from tests.integration.tcp_proxy import DelayingProxy
from tests.integration.test_hash_join import rows_out_of_order

pytestmark = pytest.mark.integration


def _counter(name: str, labels: dict[str, str] | None = None) -> float:
    """This process's value of a counter sample of services/metrics.py."""
    return metrics.REGISTRY.get_sample_value(name, labels or {}) or 0.0


def _one_cycle(worker: Worker, ends: dict[tuple[str, int], int]) -> list[GroupBatch]:
    """Take every input record up to `ends` into `worker` (all groups owned) and join them in one cycle."""
    _take_all(worker, ends)
    return run_cycle(worker.job, worker.plan, worker.store, worker.pending, worker.routings,
                     now_ms=int(time.time() * 1000))


def _take_all(worker: Worker, ends: dict[tuple[str, int], int]) -> None:
    """Take every input record up to `ends` into `worker`, which owns every group."""
    worker.groups = set(range(worker.job.partitions))
    worker.consumer.assign(worker._partitions(worker.groups))
    take_through(worker, ends)


def _job_with_input(broker, tmp_path: Path, rows: int, seed: int):  # type: ignore[no-untyped-def]
    """A 2-group job with `rows` rows written; (job, cluster, the inputs' end offsets)."""
    job = make_job(broker.bootstrap, tmp_path, [{"range_ms": 500}, {"range_ms": 500}], workers=1, partitions=2,
                   worker={"exactly_once": True})
    cluster = kafka.Cluster.of(job)
    topics.ensure(cluster.admin(), job)
    produce(job, broker.bootstrap, rows_out_of_order("rs", rows, 20, seed=seed))
    return job, cluster, input_end_offsets(job, broker.bootstrap)


def _die_after_writing_part(worker: Worker, batches: list[GroupBatch], partial: GroupBatch, keep: int) -> None:
    """What a worker that died mid-cycle leaves visible: every batch's commit record, the first
    `keep` results of `partial` and none of the other batches', and no input offsets."""
    producer = worker.emitter.producer
    producer.begin_transaction()
    for b in batches:
        worker.emitter.produce_commit(b)
    flush(producer, worker.emitter.deliveries)
    mask = np.zeros(len(partial.results), dtype=bool)
    mask[:keep] = True
    worker.emitter.results.write(partial.results.filter(mask), group=partial.group)
    producer.commit_transaction(30)  # committed, so visible on any broker, not only on Tansu
    worker.consumer.close()
    worker.store.rocksdb.close()


def test_replay_writes_the_missing_results_once_and_commits_the_offsets(broker, tmp_path: Path) -> None:
    """exactly_once: a batch whose commit record and part of whose results were written is
    replayed; the rest of its results go out in one transaction, each result is on the
    results topic once, and the input offsets are committed at the batch's boundary."""
    job, cluster, ends = _job_with_input(broker, tmp_path, 800, seed=11)

    dead = _started(Worker(job, cluster, "dead"))
    batches = _one_cycle(dead, ends)
    partial = max(batches, key=lambda b: len(b.results))
    keep = len(partial.results) // 2
    assert keep >= 2 and len(partial.results) - keep >= 2  # several present, several missing
    _die_after_writing_part(dead, batches, partial, keep)
    assert len(produced_refs(job, broker.bootstrap)) == keep

    replayed, recoveries = _counter("streamjoin_recovered_batches_total"), _counter("streamjoin_recoveries_total")
    alive = _started(Worker(job, cluster, "w0"))
    groups = list(range(job.partitions))
    try:
        recover_groups(job, cluster, alive.plan, alive.store, alive.emitter, alive.consumer, alive.routings, groups)
        assert all(alive.store.get(g).checkpoint.seq == 1 for g in groups)
    finally:
        alive.consumer.close()
        alive.store.rocksdb.close()
    assert _counter("streamjoin_recovered_batches_total") - replayed == len(batches)
    assert _counter("streamjoin_recoveries_total") - recoveries == 1

    refs = Counter(produced_refs(job, broker.bootstrap))
    assert len(refs) == sum(len(b.results) for b in batches) and max(refs.values()) == 1
    result = check(job, broker.bootstrap)
    assert result.exact and result.results == result.expected > 0, result
    boundary = {(t, p): o for b in batches for t, parts in b.end.items() for p, o in parts.items()}
    assert committed_offsets(job, broker.bootstrap, list(boundary)) == boundary == ends


def test_an_offset_read_back_behind_a_committed_batch_is_committed_again(broker, tmp_path: Path) -> None:
    """Tansu 0.6 under load sometimes answers an offset fetch with an offset older than the
    one a committed transaction carried, and a drained partition then shows lag for good.
    The worker's heartbeat compares the group's committed offsets of its idle partitions
    with what its batches committed and, found behind twice in a row, commits those again."""
    job, cluster, ends = _job_with_input(broker, tmp_path, 200, seed=13)
    worker = _started(Worker(job, cluster, "w0"))
    try:
        _take_all(worker, ends)
        worker._cycle()
        assert committed_offsets(job, broker.bootstrap, list(ends)) == ends
        (stale, end), *_ = ends.items()
        worker.consumer.commit(offsets=[TopicPartition(*stale, end // 2)], asynchronous=False)
        assert committed_offsets(job, broker.bootstrap, [stale]) == {stale: end // 2}
        lost = _counter("streamjoin_offsets_recommitted_total", {"reason": "lost"})
        worker._reconcile_offsets()  # found behind once: perhaps a transaction's markers still on their way
        assert committed_offsets(job, broker.bootstrap, [stale]) == {stale: end // 2}
        worker._reconcile_offsets()  # behind at the same offset a heartbeat later: committed again
        assert committed_offsets(job, broker.bootstrap, list(ends)) == ends
        assert _counter("streamjoin_offsets_recommitted_total", {"reason": "lost"}) - lost == 1
    finally:
        worker.consumer.close()
        worker.store.rocksdb.close()


def _started(worker: Worker) -> Worker:
    """A worker object ready to cycle in this process: routings read, producer's transactions begun."""
    worker.routings = worker._routings()
    worker.emitter.start()
    return worker


def test_recovery_through_slow_fetch_responses_stays_exact(tmp_path: Path) -> None:
    """Every Fetch response (what end_offsets and read_partitions wait on) held back 1.5 s
    while a worker whose disk is gone replays every batch: each read must reach its true
    end (a partial read of the results would rewrite results, one of the commits would
    skip batches), so the output stays exact and every batch is counted as replayed."""
    with proxied_fleet(tmp_path, DelayingProxy, partitions=2,
                       worker={"changelog": False}) as (b, proxy, job, fleet):  # replays every batch
        rows = rows_out_of_order("rs", 2000, 40, seed=12)
        batches = feed_in_two_batches(job, b.bootstrap, fleet, rows)
        assert len(batches) >= 2 * job.partitions

        lose_disk_and_rewind(job, b.bootstrap, fleet, "w0")
        proxy.delay_s = 1.5
        fleet.start_worker("w0")
        wait_drained(job, b.bootstrap, fleet, timeout=300)
        assert metric(fleet.metrics_ports["w0"], "streamjoin_recovered_batches_total") == len(batches)
        assert proxy.held > 0
        proxy.delay_s = 0.0
        result = check(job, b.bootstrap)
        assert result.exact, result
        assert result.expected > 300
