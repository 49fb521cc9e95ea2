"""Bringing a partition group's state up to what Kafka says was emitted.

RocksDB is written after a cycle's Kafka commit, so at start it can lag the
results topic by the batch(es) in flight when the worker died. The results
partition is the source of truth: every batch record carries its input
boundary. Recovery reads the group's results records past the checkpoint and
replays exactly those batches from the input topics through the same code
path, emitting nothing that is already there. Dead letters already written by
an attempt that never committed are remembered, so they are not written twice.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from streamjoin.engine.window_join import JoinPlan
from streamjoin.schemas.results import H_OFFSET, H_TOPIC, BatchHeader, decode_headers
from streamjoin.services import kafka, metrics
from streamjoin.services.worker.intake import RecordBuffer
from streamjoin.services.worker.output import Emitter
from streamjoin.services.worker.processor import run_cycle
from streamjoin.state.windowed import WindowedStore
from streamjoin.settings import JobSettings

log = logging.getLogger("streamjoin.worker.recovery")


@dataclass
class EmittedBatch:
    header: BatchHeader
    chunks: set[int] = field(default_factory=set)
    last_offset: int = -1


@dataclass
class Recovered:
    dead_letters_written: set[tuple[str, int]]
    replayed: int  # batches replayed; their input offsets may never have been committed


def recover_group(job: JobSettings, cluster: kafka.Cluster, plan: JoinPlan, store: WindowedStore, emitter: Emitter,
                  group: int) -> Recovered:
    """Replay batches emitted but not checkpointed; report dead letters already written."""
    state = store.get(group)
    ck = state.checkpoint
    emitted = _emitted_batches(job, cluster, group, ck.results_next, ck.seq)
    for batch in emitted:
        if batch.header.seq != state.checkpoint.seq + 1:
            raise RuntimeError(
                f"group {group}: results hold batch {batch.header.seq} but state is at {state.checkpoint.seq}; "
                "the state directory does not belong to this results topic (wipe it or use a fresh job name)"
            )
        buffers = _read_inputs(job, cluster, group, state.checkpoint.end, batch.header.end)
        replayed = run_cycle(job, plan, store, buffers, now_ms=0)
        if [b.group for b in replayed] != [group] or replayed[0].end != batch.header.end:
            raise RuntimeError(f"group {group}: replay of batch {batch.header.seq} did not reach its recorded boundary")
        gb = replayed[0]
        missing = set(range(batch.header.chunks)) - batch.chunks
        if missing:  # an attempt died between chunks: write the rest, same content
            emitter.produce_results(gb, only_chunks=missing)
            emitter.producer.flush(30)
        gb.state.checkpoint = gb.state.checkpoint.model_copy(update={"results_next": batch.last_offset + 1})
        tx = store.store.transaction()
        store.stage(tx, group, gb.state, gb.appended)
        tx.commit()
        metrics.RECOVERED_BATCHES.inc()
        log.info("group %d: replayed batch %d (%d results already emitted)", group, gb.seq, len(gb.results))
    written = _dead_letters_written(job, cluster, group, store.get(group).checkpoint.dead_letter_next)
    return Recovered(written, len(emitted))


def _emitted_batches(job: JobSettings, cluster: kafka.Cluster, group: int, start: int,
                     applied_seq: int) -> list[EmittedBatch]:
    batches: dict[int, EmittedBatch] = {}
    for m in kafka.read_partition(cluster, job.results_topic, group, start, f"{job.consumer_group}-recovery"):
        h = BatchHeader.decode(m.headers())
        if h.seq <= applied_seq:
            continue
        b = batches.setdefault(h.seq, EmittedBatch(h))
        b.chunks.add(h.chunk)
        b.last_offset = max(b.last_offset, m.offset())
    return [batches[s] for s in sorted(batches)]


def _read_inputs(job: JobSettings, cluster: kafka.Cluster, group: int, start: dict[str, int],
                 end: dict[str, int]) -> dict[int, RecordBuffer]:
    """The records of one batch: from the checkpoint's boundary up to the batch's."""
    buffers: dict[int, RecordBuffer] = {}
    c = cluster.consumer(f"{job.consumer_group}-recovery")
    try:
        wanted = {}
        for i, s in enumerate(job.streams):
            lo, hi = start.get(s.name, 0), end.get(s.name, 0)
            if hi > lo:
                wanted[(job.topic_of(s), group)] = (i, hi)
                buffers[i] = RecordBuffer()
        c.assign([TopicPartition(t, p, start.get(job.streams[i].name, OFFSET_BEGINNING) or OFFSET_BEGINNING)
                  for (t, p), (i, _) in wanted.items()])
        remaining = set(wanted)
        while remaining:
            for m in c.consume(10_000, 1.0):
                i, hi = wanted[(m.topic(), m.partition())]
                if m.error() is None and m.offset() < hi:
                    buffers[i].add(m)
            # Position, not the last offset seen: transaction markers occupy offsets no reader sees.
            for tp in c.position([TopicPartition(t, p) for t, p in remaining]):
                if tp.offset >= wanted[(tp.topic, tp.partition)][1]:
                    remaining.discard((tp.topic, tp.partition))
        return buffers
    finally:
        c.close()


def _dead_letters_written(job: JobSettings, cluster: kafka.Cluster, group: int, start: int) -> set[tuple[str, int]]:
    out = set()
    for m in kafka.read_partition(cluster, job.dead_letter_topic, group, start, f"{job.consumer_group}-recovery"):
        h = decode_headers(m.headers())
        out.add((h[H_TOPIC], int(h[H_OFFSET])))
    return out
