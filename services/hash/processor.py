"""One partition group's batch: decoded blocks in, window joined, results,
dead letters and forwards out, checkpoint advanced. The same function serves
live processing and recovery replay, which is what makes replay exact.

A tumbling or hopping window join runs on copies (engine/window_instances.py):
each stream's decoded tuples become one copy per window instance before the
join, so the window, its stored blocks and the changelog hold copies, and a
restored window is copies as it was. What is about the source records stays
per record: dead letters, the tuples counted in and the hot-key summaries.

A group with a split hot key (services/hash/split.py) sends part of its on-time tuples to its
slots; a slot (a group numbered from `partitions` on) joins what its group sent it
(`run_slot_batch`), read from `<job>.split` under the buffers' key SLOT_INPUT."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Collection, Mapping, Sequence

import time

import numpy as np

from streamjoin.engine.asof import AsOfPlan, process_asof_window
from streamjoin.engine.block import OFF, PART, Block, concat
from streamjoin.engine.cleanup import cleanup_results, generation_of
from streamjoin.engine.outer import DECIDED, ref_keys
from streamjoin.engine.result_ids import ABSENT, EVENT_TIME, PRODUCED_MS
from streamjoin.engine.window_instances import assign, instance_plan
from streamjoin.engine.window_join import NO_TIME, JoinPlan, StreamPlan, process_batch
from streamjoin.schemas.codecs import encode_block, keys_are_exact
from streamjoin.schemas.control import HotSplit
from streamjoin.schemas.split_records import SplitRecord, decode_split
from streamjoin.services.hash.progress import BatchProgress, batch_progress
from streamjoin.services.hash.split import group_splits, segment_deltas, slot_segments, unstored
from streamjoin.services.io.dead_letters import DeadRecord, late_records
from streamjoin.services.io.intake import Forward, GroupSlice, RecordBuffer, Routing, decode_by_group
from streamjoin.services.io.progress_notes import ProgressNote
from streamjoin.state.checkpoint import merge_positions
from streamjoin.state.store import Store
from streamjoin.state.versioned import VersionedStore
from streamjoin.state.windowed import BLOCK_SEQ, GroupState, WindowedStore
from streamjoin.settings import JobSettings

SLOT_INPUT = -1  # the key, beside the streams' indexes, of the slots' records (<job>.split) among a cycle's buffers


@dataclass
class GroupBatch:
    group: int
    seq: int
    results: Block
    dead: list[DeadRecord]
    forwards: list[Forward]
    end: dict[str, dict[int, int]]  # input topic -> partition -> next offset after the batch
    watermark: int
    appended: list[Block]  # per stream, what the window took (a window join's copies): stored with the batch
    state: GroupState
    duplicates: int  # forwarded records skipped as copies of ones taken before
    now_ms: int  # the wall clock the batch was decided at (recorded in its commit, so replay decides the same)
    cleanup: "Cleanup | None" = None  # deferred spill: the generations this batch cleaned up
    read_back: bool = False  # probe spill: the group's window was pushed and read back for this batch
    marks: dict[int, Block] = field(default_factory=dict)  # outer/semi/anti: rows first matched (BatchOutcome)
    unmatched: int = 0  # outer/anti: null-padded rows of rows proven unmatched
    notes: list[ProgressNote] = field(default_factory=list)  # join.repartition_watermarks: written after forwards
    # Per stream, the source tuples the window took, once each (a window join's copies are not
    # counted apart): tuple counts and hot keys. None: `appended`, which holds them once each.
    taken: list[Block] | None = None
    # Split hot keys (services/hash/split.py): (slot, record) sent after the batch, and the
    # splits and merges it applied (its commit records them).
    split_out: list[tuple[int, SplitRecord]] = field(default_factory=list)
    splits_applied: list[HotSplit] = field(default_factory=list)

    @property
    def tuples_taken(self) -> list[Block]:
        return self.taken if self.taken is not None else self.appended


@dataclass(frozen=True)
class Cleanup:
    """What a batch's clean-up passes did: `generations` cleaned, `results` produced (they are
    part of the batch's results), `seconds` spent."""

    generations: int
    results: int
    seconds: float


@dataclass(frozen=True)
class CleanedUp:
    """A batch's clean-up passes (`clean_up`): their `results`, what was `done`, and the
    spilled `generations` left for the batch's checkpoint."""

    results: Block
    done: Cleanup
    generations: list[list[int]]


def join_plan(job: JobSettings) -> JoinPlan | AsOfPlan:
    """The join a group runs: a window join (tumbling and hopping ones on copies per instance:
    engine/window_instances.py), or an as-of join (join.table)."""
    streams = tuple(
        StreamPlan(s.name, job.topic_of(s), s.window.range_ms if s.window else None,
                   s.window.rows if s.window else None, tuple(s.fields), tuple(s.key_fields))
        for s in job.streams
    )
    t = job.table_index
    if t is not None:
        lateness = job.join.allowed_lateness_ms
        return AsOfPlan(streams[1 - t], streams[t], lateness, lateness, job.join.type)  # type: ignore[arg-type]
    plan = JoinPlan(streams, job.join.allowed_lateness_ms, exact_keys=keys_are_exact(job.streams[0]),
                    join_type=job.join.type)
    instance = job.window_instance
    return plan if instance is None else instance_plan(plan, instance[0])


def group_store(job: JobSettings, plan: JoinPlan | AsOfPlan, rocksdb: Store, templates: list[Block]) -> WindowedStore:
    """The store of a worker's groups: windows (of copies, with their WIN column, in a window
    join), or an as-of join's versions. `templates`: per stream, an empty block as decoded."""
    memory, changelog, spill = job.worker.memory_bytes, job.worker.changelog, job.worker.spill
    if isinstance(plan, AsOfPlan):
        return VersionedStore(rocksdb, plan, job.table_index or 0, templates, memory, changelog, spill)
    instance = job.window_instance
    if instance is not None:
        templates = [assign(t, *instance) for t in templates]
    return WindowedStore(rocksdb, plan, templates, memory, changelog=changelog, spill=spill)


def unmatched_delays_ms(job: JobSettings, results: Block) -> np.ndarray:
    """Per null-padded row of an unmatched row (outer and anti joins, time windows): its
    emission time minus its deadline, the row's event time + window + allowed lateness."""
    if job.join.type in ("inner", "semi") or job.join.table is not None:  # as-of: no deadline in time
        return np.empty(0, np.int64)
    delays = []
    for i in DECIDED[job.join.type]:
        window = job.streams[i].window.span_ms  # a window join's copy: its instance size
        other = job.streams[1 - i].name
        if window is not None and len(results):
            alone = results[f"{other}.partition"] == ABSENT
            deadline = results[EVENT_TIME][alone] + window + job.join.allowed_lateness_ms
            delays.append(results[PRODUCED_MS][alone] - deadline)
    return np.concatenate(delays) if delays else np.empty(0, np.int64)


def run_cycle(job: JobSettings, plan: JoinPlan, store: WindowedStore, buffers: dict[int, RecordBuffer],
              routings: Sequence[Routing], now_ms: int, idle: Mapping[int, frozenset[int]] | None = None,
              extra: Collection[int] = (), floors: Mapping[int, int] | None = None,
              generation_starts: Mapping[int, int] | None = None,
              splits: Mapping[int, Sequence[HotSplit]] | None = None) -> list[GroupBatch]:
    """Every group with records in `buffers` (per stream), and every group in `extra` (a batch
    without records: an idle stream lets its watermark move), in group order.

    `routings[i]` says how stream i's tuples reach their groups; `idle[g]`, the streams of
    group g left out of its watermark (join.idle_timeout_ms); `floors[g]`, a watermark group g's
    batch reaches at least (recovery replays a batch's recorded watermark with it);
    `generation_starts[g]`, the first batch of the generation group g's batch was decided in
    (recovery replays a recorded push with it); `splits[g]`, the split hot keys of group g
    (the coordinator's, live; the batch's recorded ones, in a replay). A slot's records are
    `buffers[SLOT_INPUT]`."""
    groups = sorted({g for buf in buffers.values() for g in buf.positions} | set(extra))
    in_memory = store.hot_groups()
    read_back = {g for g in groups if g not in in_memory and g in store.activity}  # pushed since it was seen
    states = {g: store.get(g) for g in groups}
    slices: dict[int, dict[int, GroupSlice]] = {}
    for i, buf in buffers.items():
        if i != SLOT_INPUT and (len(buf) or buf.notes):
            name = job.streams[i].name
            routed = {g: s.checkpoint.routed.get(name, {}) for g, s in states.items()}
            for g, sl in decode_by_group(job, i, buf, routings[i], routed, now_ms).items():
                slices.setdefault(g, {})[i] = sl
    idle, floors, starts, splits = idle or {}, floors or {}, generation_starts or {}, splits or {}
    slot_input = buffers.get(SLOT_INPUT) or RecordBuffer()
    slots = set(slot_input.positions) | {g for g in extra if g in job.slots}
    batches = [run_slot_batch(job, plan, store, states[g], g, slot_input, now_ms) if g in slots else
               run_group_batch(job, plan, store, states[g], g, slices.get(g, {}), buffers, now_ms,
                               idle.get(g, frozenset()), floors.get(g, NO_TIME), starts.get(g, 0), routings,
                               splits.get(g, ()))
               for g in sorted(set(slices) | set(extra) | slots)]
    for b in batches:
        b.read_back = b.group in read_back
    return batches


def run_group_batch(job: JobSettings, plan: JoinPlan, store: WindowedStore, state: GroupState, group: int,
                    slices: dict[int, GroupSlice], buffers: dict[int, RecordBuffer], now_ms: int,
                    idle: frozenset[int] = frozenset(), floor: int = NO_TIME,
                    generation_start: int = 0, routings: Sequence[Routing] = (),
                    splits: Sequence[HotSplit] = ()) -> GroupBatch:
    """One batch of `group`: `slices` its decoded tuples per stream (none: an idle-driven
    batch); `idle` and `floor` as for process_batch; `generation_start`: this batch starts a
    new generation when it says so (a replayed push; a live push is `state.push_pending`);
    `routings`: how each stream reaches its groups (join.repartition_watermarks reads them);
    `splits`: the group's split hot keys to apply (services/hash/split.py)."""
    seq = state.checkpoint.seq + 1
    if store.deferred and (state.push_pending or generation_start == seq > state.checkpoint.generation_start):
        store.close_generation(state, seq)
    decoded = [slices[i].block if i in slices else store.templates[i] for i in range(len(job.streams))]
    instance = job.window_instance
    # Tagged after `assign`: the stored blocks hold the copies, so a restored window needs nothing new.
    deltas = [_tag(assign(d, *instance) if instance else d, seq) for d in decoded]
    progress = _progress(job, routings, state, group, slices, idle, now_ms)
    split = None if isinstance(plan, AsOfPlan) else group_splits(plan, state.window, state.checkpoint, splits)
    if isinstance(plan, AsOfPlan):
        outcome = process_asof_window(state.window, deltas, now_ms)  # type: ignore[arg-type]
    else:
        outcome = process_batch(plan, state.window, deltas, now_ms, idle, floor, progress.bound if progress else None,
                                split.divert if split else None)
    cleanup = clean_up(plan, store, state, group, outcome.accepted, now_ms) if state.checkpoint.generations else None
    results = concat([outcome.results, cleanup.results]) if cleanup else outcome.results
    dead = [d for sl in slices.values() for d in sl.dead]
    for i, late in enumerate(outcome.late):
        if len(late):
            # A late tuple's copies share its time, so all are late: one dead letter per record.
            once = late if instance is None else late.take(np.unique(ref_keys(late[PART], late[OFF]),
                                                                     return_index=True)[1])
            dead += late_records(job, i, group, buffers[i], once, outcome.watermark_before)
    end = state.checkpoint.end
    for sl in slices.values():
        end = merge_positions(end, sl.end)
    clocks = {"heard_ms": _heard(state.checkpoint.heard_ms, len(job.streams), slices, now_ms)} \
        if job.join.idle_timeout_ms else {}
    routed = dict(state.checkpoint.routed) | {job.streams[i].name: sl.routed for i, sl in slices.items() if sl.routed}
    cleaned = {"generations": cleanup.generations} if cleanup else {}
    # The batch's one checkpoint write: recovery's replay comes through here too, so it records the same.
    state.checkpoint = state.checkpoint.model_copy(update={
        "seq": seq, "end": end, "routed": routed, "max_ts": list(state.window.max_ts),
        "watermark": state.window.watermark, **(progress.checkpoint if progress else {}), **clocks, **cleaned,
        **(split.checkpoint() if split else {}),
    })
    return GroupBatch(group, seq, results, dead, [f for sl in slices.values() for f in sl.forwards], end,
                      state.window.watermark, outcome.accepted, state, sum(sl.duplicates for sl in slices.values()),
                      now_ms, cleanup.done if cleanup else None, marks=outcome.marks, unmatched=outcome.unmatched,
                      notes=progress.notes if progress else [],
                      taken=_taken(decoded, outcome.on_time) if instance else outcome.on_time if split else None,
                      split_out=split.records(group, seq, outcome.watermark_before, outcome.watermark_after)
                      if split else [], splits_applied=split.applied if split else [])


def run_slot_batch(job: JobSettings, plan: JoinPlan, store: WindowedStore, state: GroupState, group: int,
                   buf: RecordBuffer, now_ms: int) -> GroupBatch:
    """One batch of slot `group`: the records its group sent it in `buf` (`<job>.split`),
    taken once each in order (services/hash/split.py), joined with every stream idle and the
    group's watermark as the floor; a record that is not one is dead-lettered, with why."""
    seq = state.checkpoint.seq + 1
    templates = [unstored(t) for t in store.templates]
    rows = np.flatnonzero(buf.groups == group).tolist()
    decoded = [decode_split(buf.values[i], buf.headers[i], templates) for i in rows]
    taken = [(i, d) for i, d in zip(rows, decoded) if isinstance(d, SplitRecord)]
    segments, slot, skipped, refused = slot_segments(state.checkpoint.slot, [d for _, d in taken])
    why = [(i, d) for i, d in zip(rows, decoded) if isinstance(d, str)] + \
          [(i, reason) for (i, _), reason in zip(taken, refused) if reason]
    dead = [_split_dead(job, buf, i, "malformed", detail) for i, detail in why]
    every = frozenset(range(len(plan.streams)))
    results, marks, unmatched = [], {}, 0
    appended = [t.take(np.empty(0, np.int64)) for t in store.templates]
    if not segments:  # every record skipped or refused: nothing joins, nothing moves
        results.append(process_batch(plan, state.window, appended, now_ms, every).results)
    for segment in segments:
        if segment.starts:
            store.drop_window(state, seq)
        outcome = process_batch(plan, state.window, segment_deltas(segment, store.templates, seq), now_ms, every,
                                segment.watermark)
        results.append(outcome.results)
        unmatched += outcome.unmatched
        late = concat([unstored(b) for b in outcome.late if len(b)])
        if len(late):  # a slot's watermark is its group's: a tuple its group sent is never behind it
            dead.append(_split_dead(job, buf, rows[0], "late", f"{len(late)} tuples behind the slot's watermark",
                                    encode_block(late)))
        appended, marks = outcome.accepted, outcome.marks
        if segment.ends:
            store.drop_window(state, seq)
            appended, marks = [t.take(np.empty(0, np.int64)) for t in store.templates], {}
    state.checkpoint = state.checkpoint.model_copy(update={
        "seq": seq, "end": merge_positions(state.checkpoint.end, buf.positions.get(group, {})),
        "max_ts": list(state.window.max_ts), "watermark": state.window.watermark, "slot": slot})
    return GroupBatch(group, seq, concat(results), dead, [], state.checkpoint.end, state.window.watermark, appended,
                      state, skipped, now_ms, marks=marks, unmatched=unmatched, taken=[])


def _split_dead(job: JobSettings, buf: RecordBuffer, i: int, reason: str, detail: str,
                value: bytes | None = None) -> DeadRecord:
    """Record i of a slot's `buf` (or `value`, some of its tuples) as a dead letter."""
    group, partition, offset = buf.identity(i)
    return DeadRecord(0, group, partition, offset, buf.keys[i], buf.values[i] if value is None else value, reason,
                      detail, job.split_topic)


def _taken(decoded: list[Block], accepted: list[Block]) -> list[Block]:
    """Per stream, the decoded tuples whose copies the window took (all of a tuple's or none)."""
    return [d.filter(np.isin(ref_keys(d[PART], d[OFF]), ref_keys(a[PART], a[OFF]))) for d, a in zip(decoded, accepted)]


def _heard(before: list[int], streams: int, slices: dict[int, GroupSlice], now_ms: int) -> list[int]:
    """The checkpoint's idle clocks after a batch at `now_ms` that read `slices`: each stream
    the batch heard from at `now_ms`, the others as they were. From the batch's own `now_ms`,
    so a replayed batch records what the original did."""
    heard = (list(before) + [NO_TIME] * streams)[:streams]
    for i, sl in slices.items():
        if sl.heard:
            heard[i] = now_ms
    return heard


def _progress(job: JobSettings, routings: Sequence[Routing], state: GroupState, group: int,
              slices: dict[int, GroupSlice], idle: frozenset[int], now_ms: int) -> BatchProgress | None:
    """What the batch reads and tells of the source partitions' progress
    (services/hash/progress.py); None when the job does not carry watermarks across the
    repartition (join.repartition_watermarks off)."""
    if not (job.join.repartition_watermarks and routings):
        return None
    return batch_progress(job, [r.source_partitions for r in routings], state.checkpoint, group,
                          {i: sl.read for i, sl in slices.items()}, {i: sl.notes for i, sl in slices.items()}, idle,
                          now_ms)


def clean_up(plan: JoinPlan, store: WindowedStore, state: GroupState, group: int, accepted: list[Block],
             now_ms: int) -> CleanedUp | None:
    """Deferred spill: clean up, oldest first, every spilled generation no tuple can join any
    more (the watermark has passed its newest tuple plus the longest window: a later tuple
    is late); the batch's checkpoint drops it (its blocks are deleted when the batch is
    staged). `accepted`: the batch's new tuples, which may still join it. Returns the results,
    what was done and the generations left, or None when no generation is due."""
    started = time.perf_counter()
    longest = max(s.range_ms or 0 for s in plan.streams)
    parts: list[Block] = []
    ckpt = state.checkpoint
    left = ckpt.generations
    while left and left[0][1] + longest <= state.window.watermark:
        first = left[0][0]
        streams = [concat([stored, new]) for stored, new in zip(store.stored_blocks(group, state, first), accepted)]
        starts = [start for start, _ in left] + [ckpt.generation_start]
        generations = [generation_of(block[BLOCK_SEQ], starts) for block in streams]
        parts.append(cleanup_results(plan, streams, generations, 0, now_ms))
        left = left[1:]
    if not parts:
        return None
    results = concat(parts)
    return CleanedUp(results, Cleanup(len(parts), len(results), time.perf_counter() - started), left)


def _tag(block: Block, seq: int) -> Block:
    return Block(dict(block.columns) | {BLOCK_SEQ: np.full(len(block), seq, np.int64)})
