"""One partition group's batch: decoded blocks in, window joined, results and
dead letters out, checkpoint advanced. The same function serves live
processing and recovery replay, which is what makes replay exact."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from streamjoin.engine.block import OFF, PART, Block
from streamjoin.engine.window_join import JoinPlan, StreamPlan, process_batch
from streamjoin.schemas.codecs import BLOCK_SHIFT, encode_block, keys_are_exact
from streamjoin.services.worker.intake import DeadRecord, GroupSlice, RecordBuffer, decode_by_group
from streamjoin.state.windowed import BLOCK_SEQ, GroupState, WindowedStore
from streamjoin.settings import JobSettings


@dataclass
class GroupBatch:
    group: int
    seq: int
    results: Block
    dead: list[DeadRecord]
    end: dict[str, int]
    watermark: int
    appended: list[Block]
    state: GroupState


def join_plan(job: JobSettings) -> JoinPlan:
    streams = tuple(
        StreamPlan(s.name, job.topic_of(s), s.window.range_ms, s.window.rows, tuple(s.fields), tuple(s.key_fields))
        for s in job.streams
    )
    return JoinPlan(streams, job.join.allowed_lateness_ms, exact_keys=keys_are_exact(job.streams[0]))


def run_cycle(job: JobSettings, plan: JoinPlan, store: WindowedStore, buffers: dict[int, RecordBuffer],
              now_ms: int) -> list[GroupBatch]:
    """Every group with records in `buffers` (per stream), in group order."""
    slices: dict[int, dict[int, GroupSlice]] = {}
    for i, buf in buffers.items():
        if len(buf):
            for g, sl in decode_by_group(job, i, buf).items():
                slices.setdefault(g, {})[i] = sl
    return [run_group_batch(job, plan, store, g, slices[g], buffers, now_ms) for g in sorted(slices)]


def run_group_batch(job: JobSettings, plan: JoinPlan, store: WindowedStore, group: int,
                    slices: dict[int, GroupSlice], buffers: dict[int, RecordBuffer], now_ms: int) -> GroupBatch:
    state = store.get(group)
    seq = state.checkpoint.seq + 1
    deltas = [_tag(slices[i].block if i in slices else store.templates[i], seq) for i in range(len(job.streams))]
    outcome = process_batch(plan, state.window, deltas, now_ms)
    dead = [d for sl in slices.values() for d in sl.dead]
    for i, late in enumerate(outcome.late):
        if len(late):
            dead += late_records(job, i, buffers[i], late, outcome.watermark_before)
    end = dict(state.checkpoint.end) | {job.streams[i].name: sl.end for i, sl in slices.items()}
    state.checkpoint = state.checkpoint.model_copy(update={
        "seq": seq, "end": end, "max_ts": list(state.window.max_ts), "watermark": state.window.watermark,
    })
    return GroupBatch(group, seq, outcome.results, dead, end, state.window.watermark, outcome.accepted, state)


def _tag(block: Block, seq: int) -> Block:
    return Block(dict(block.columns) | {BLOCK_SEQ: np.full(len(block), seq, np.int64)})


def late_records(job: JobSettings, stream: int, buf: RecordBuffer, late: Block, watermark: int) -> list[DeadRecord]:
    spec = job.streams[stream]
    detail = f"event time older than the watermark {watermark} (allowed lateness {job.join.allowed_lateness_ms} ms)"
    if spec.format != "blocks":
        at = buf.record_index(late[PART], late[OFF])
        return [DeadRecord(stream, buf.partitions[i], buf.offsets[i], buf.keys[i], buf.values[i], "late", detail)
                for i in at]
    # A block record carries many tuples: dead-letter just its late ones, as a block.
    record_offsets = late[OFF] >> BLOCK_SHIFT
    out = []
    for rec in np.unique(record_offsets):
        rows = late.filter(record_offsets == rec)
        i = int(buf.record_index(rows[PART][:1], np.array([rec]))[0])
        value = encode_block(Block({f: rows[f] for f in spec.fields}))
        out.append(DeadRecord(stream, buf.partitions[i], int(rec), buf.keys[i], value, "late", detail))
    return out
