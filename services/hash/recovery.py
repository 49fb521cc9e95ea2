"""Bringing a partition group's state up to what Kafka says was decided.

First, a group whose changelog is ahead of the local copy (or which has no
local copy: it moved here, or the disk is gone) is rebuilt from the changelog
(restore.py). RocksDB is written after a cycle's Kafka commit, so it can still
lag the commits topic by the batch(es) in flight when the worker died. The
group's commits partition is the source of truth: every batch writes a commit record
(its input boundary) before its results (cycle.py). Recovery reads the
group's commit records past the checkpoint and replays exactly those batches
from the input topics through the same code path; of each replayed batch it
writes the results the dead attempt did not (result ids are deterministic, so
the results partition says which are there), together with the batch's input
offsets. Dead letters already written by an attempt that never committed are
remembered, so they are not written twice.
"""

from __future__ import annotations

import time
from typing import Sequence

import numpy as np
import structlog
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from streamjoin.engine.block import Block
from streamjoin.engine.window_join import JoinPlan
from streamjoin.schemas.result_decode import decode_results
from streamjoin.schemas.result_format import result_layout
from streamjoin.schemas.results import RESULT_ID_HI, RESULT_ID_LO, BatchCommit, dead_letter_ref, decode_commit
from streamjoin.services import faults, metrics
from streamjoin.services.hash.cycle import record_positions
from streamjoin.services.hash.emit import Emitter
from streamjoin.services.hash.processor import SLOT_INPUT, run_cycle
from streamjoin.services.hash.restore import restore_groups
from streamjoin.services.io import kafka
from streamjoin.services.io.intake import RecordBuffer, Routing
from streamjoin.state.windowed import WindowedStore
from streamjoin.settings import JobSettings

log = structlog.get_logger("streamjoin.worker.recovery")


def recover_groups(job: JobSettings, cluster: kafka.Cluster, plan: JoinPlan, store: WindowedStore,
                   emitter: Emitter, consumer: Consumer, routings: Sequence[Routing],
                   groups: Sequence[int]) -> dict[int, set[tuple[str, int, int]]]:
    """Replay each group's batches committed but not checkpointed; return, per group, the dead
    letters already written past its checkpoint, (input topic, partition, offset) each.

    `consumer` is the worker's input consumer (its group metadata goes into the transaction
    that commits a replayed batch's offsets); `routings[i]` as for run_cycle. The commits,
    results and dead-letter partitions of all `groups` are each read in one pass, and the ends
    of the changelog, commits and dead-letter partitions found in one (nothing else writes
    them while this worker recovers its groups)."""
    probe = f"{job.consumer_group}-recovery"
    read_to_end = [job.commits_topic, job.dead_letter_topic] + ([job.changelog_topic] if job.worker.changelog else [])
    ends = kafka.end_offsets(cluster, [(topic, g) for topic in read_to_end for g in groups], probe)
    restored = restore_groups(job, cluster, store, groups, ends)
    if restored:
        faults.reach("receiver-restored")
    checkpoints = {g: store.get(g).checkpoint for g in groups}
    boundary = [tp for g in restored for tp in _offsets(checkpoints[g].end)]
    if boundary:  # the group's offsets say where its state is; batches replayed below move them on
        consumer.commit(offsets=boundary, asynchronous=False)
    commits = _commits_after(job, cluster, {g: (ck.commits_next, ck.seq) for g, ck in checkpoints.items()},
                             _of(ends, job.commits_topic))
    behind = [g for g in groups if commits[g]]
    present = _results_present(job, cluster, {g: checkpoints[g].results_next for g in behind})
    for g in behind:
        _replay(job, cluster, plan, store, emitter, consumer, routings, g, commits[g], *present[g])
    dead = _dead_letters_written(job, cluster, {g: store.get(g).checkpoint.dead_letter_next for g in groups},
                                 _of(ends, job.dead_letter_topic))
    metrics.RECOVERIES.inc()
    return dead


def _replay(job: JobSettings, cluster: kafka.Cluster, plan: JoinPlan, store: WindowedStore, emitter: Emitter,
            consumer: Consumer, routings: Sequence[Routing], group: int, commits: list[tuple[BatchCommit, int]],
            present: set[tuple[int, int]], results_end: int) -> None:
    """Replay `commits` (the group's batches past its checkpoint, with their offsets), writing the
    results missing from `present` (ids already in the results partition, which ends at `results_end`)."""
    state = store.get(group)
    for commit, commit_offset in commits:
        if commit.seq != state.checkpoint.seq + 1:
            raise RuntimeError(
                f"group {group}: the commits topic holds batch {commit.seq} but state is at {state.checkpoint.seq}; "
                "the state directory does not belong to this job's topics (wipe it or use a fresh job name)")
        buffers = _read_inputs(job, cluster, group, state.checkpoint.end, commit.end)
        # The original attempt's clock (records past join.max_future_ms are judged as they were) and
        # its recorded watermark as a floor (a batch an idle stream let advance replays exactly).
        now_ms = commit.now_ms if commit.now_ms is not None else int(time.time() * 1000)
        replayed = run_cycle(job, plan, store, buffers, routings, now_ms, extra=[group],
                             floors={group: commit.watermark}, generation_starts={group: commit.generation_start},
                             splits={group: commit.splits_applied})
        if [b.group for b in replayed] != [group] or replayed[0].end != commit.end:
            raise RuntimeError(f"group {group}: replay of batch {commit.seq} did not reach its recorded boundary")
        batch = replayed[0]
        missing = _not_in(batch.results, present)
        # Staged before the missing results are written, so results_next is where this batch's
        # results may begin: a later recovery reads them again rather than miss any.
        record_positions(batch.state, {"results_next": max(results_end, batch.state.checkpoint.results_next),
                                       "commits_next": commit_offset + 1})
        tx = store.rocksdb.transaction()
        store.stage(tx, group, batch.state, batch.appended, batch.marks)
        emitter.rewrite(missing, batch, consumer, _offsets(commit.end), tx)
        tx.commit()
        written = emitter.deliveries.newest.get((job.results_topic, group))
        results_end = max(results_end, written + 1 if written is not None else 0)
        metrics.RECOVERED_BATCHES.inc()
        log.info("replayed a batch", group=group, batch=batch.seq, missing_results=len(missing),
                 results=len(batch.results))


def _of(ends: dict[tuple[str, int], int], topic: str) -> dict[int, int]:
    """`topic`'s partitions' ends out of `ends` (topic, partition) -> end."""
    return {p: end for (t, p), end in ends.items() if t == topic}


def _commits_after(job: JobSettings, cluster: kafka.Cluster, since: dict[int, tuple[int, int]],
                   ends: dict[int, int]) -> dict[int, list[tuple[BatchCommit, int]]]:
    """Per group, its batch commits past its checkpoint (`since[g]` = (commits offset, batch
    applied)), with their offsets, in batch order."""
    found: dict[int, dict[int, tuple[BatchCommit, int]]] = {g: {} for g in since}
    starts = {g: offset for g, (offset, _) in since.items()}
    for m in kafka.read_partitions(cluster, job.commits_topic, starts, f"{job.consumer_group}-recovery", ends=ends):
        commit = decode_commit(m.value())
        g = m.partition()
        if isinstance(commit, BatchCommit) and commit.group == g and commit.seq > since[g][1]:
            found[g].setdefault(commit.seq, (commit, m.offset()))  # a retried write of the same commit: first wins
    return {g: [batches[s] for s in sorted(batches)] for g, batches in found.items()}


def _results_present(job: JobSettings, cluster: kafka.Cluster,
                     starts: dict[int, int]) -> dict[int, tuple[set[tuple[int, int]], int]]:
    """Per group: ids of the results in its results partition from `starts[g]` on, and the offset after them."""
    records = kafka.read_partitions(cluster, job.results_topic, starts, f"{job.consumer_group}-recovery")
    layout = result_layout(job)
    out = {}
    for g, start in starts.items():
        mine = [m for m in records if m.partition() == g]
        decoded = decode_results(layout, job.output.format, [m.value() for m in mine])
        ids = set(zip(decoded.columns[RESULT_ID_HI].tolist(), decoded.columns[RESULT_ID_LO].tolist()))
        out[g] = (ids, mine[-1].offset() + 1 if mine else start)
    return out


def _not_in(results: Block, present: set[tuple[int, int]]) -> Block:
    """The results whose ids are not among `present` (recovery only: a batch at most)."""
    keep = [(hi, lo) not in present for hi, lo in zip(results[RESULT_ID_HI].tolist(), results[RESULT_ID_LO].tolist())]
    return results.filter(np.asarray(keep, dtype=bool)) if len(results) else results


def _offsets(end: dict[str, dict[int, int]]) -> list[TopicPartition]:
    return [TopicPartition(topic, p, o) for topic, parts in end.items() for p, o in parts.items()]


def _read_inputs(job: JobSettings, cluster: kafka.Cluster, group: int, start: dict[str, dict[int, int]],
                 end: dict[str, dict[int, int]]) -> dict[int, RecordBuffer]:
    """The records of one batch: every input partition from the checkpoint's boundary up to the batch's."""
    stream_of = {job.topic_of(s): i for i, s in enumerate(job.streams)}
    forwarded = {job.by_key_topic(s): i for i, s in enumerate(job.streams)}
    slot_input = {job.split_topic: SLOT_INPUT}  # a slot's input: what its group sent it
    # A partition the checkpoint has not read yet starts where the job starts it (join.start_offsets).
    start = {topic: {p: start.get(topic, {}).get(p, job.start_offset(topic, p)) for p in parts}
             for topic, parts in end.items()}
    wanted = {(topic, p): hi for topic, parts in end.items() for p, hi in parts.items()
              if hi > start[topic][p]}
    buffers: dict[int, RecordBuffer] = {}
    c = cluster.consumer(f"{job.consumer_group}-recovery")
    try:
        c.assign([TopicPartition(t, p, start[t][p] or OFFSET_BEGINNING) for t, p in wanted])
        remaining = set(wanted)
        while remaining:
            for m in c.consume(10_000, 1.0):
                if m.error() is not None or m.offset() >= wanted[(m.topic(), m.partition())]:
                    continue
                if m.topic() in stream_of:
                    buffers.setdefault(stream_of[m.topic()], RecordBuffer()).add(m, group)
                elif m.topic() in slot_input:
                    buffers.setdefault(SLOT_INPUT, RecordBuffer()).add(m, group)
                else:
                    buffers.setdefault(forwarded[m.topic()], RecordBuffer()).add_forwarded(m)
            # Position, not the last offset seen: transaction markers occupy offsets no reader sees.
            for tp in c.position([TopicPartition(t, p) for t, p in remaining]):
                if tp.offset >= wanted[(tp.topic, tp.partition)]:
                    remaining.discard((tp.topic, tp.partition))
        # The live batch's boundary may lie past a commit marker after its last record (its
        # positions were the consumer's: RecordBuffer.advance); every record before it is read here,
        # so the replayed batch ends where the recorded one did, not one short of the marker.
        for buf in buffers.values():
            buf.advance(wanted)
        return buffers
    finally:
        c.close()


def _dead_letters_written(job: JobSettings, cluster: kafka.Cluster, starts: dict[int, int],
                          ends: dict[int, int]) -> dict[int, set[tuple[str, int, int]]]:
    out: dict[int, set[tuple[str, int, int]]] = {g: set() for g in starts}
    for m in kafka.read_partitions(cluster, job.dead_letter_topic, starts, f"{job.consumer_group}-recovery",
                                   ends=ends):
        ref = dead_letter_ref(m.headers())
        if ref is not None:
            out[m.partition()].add(ref)
    return out
