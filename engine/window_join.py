"""Symmetric windowed m-way equi-join over blocks, for one partition group.

Two emission disciplines, both exact and independent of arrival order:

* eager (all windows RANGE): a batch's new tuples are joined as they come with
  the delta formula  R = sum_i  D_i x (S_j + D_j)_{j<i} x (S_j)_{j>i},
  which counts every combination once (the same incremental formula the spill
  paper uses to merge generations of a spilled group);
* on watermark (any ROWS window): a count window is only final once no
  earlier tuple can still arrive, so combinations are emitted when the
  watermark passes their time T, with the newest tuple as the trigger.

Watermark of a group = min over streams of the newest event time seen, minus
the allowed lateness; streams the caller says are idle (join.idle_timeout_ms)
are left out of the min, and a floor (the watermark a replayed batch recorded)
reproduces a past idle decision exactly. A tuple older than the watermark at the start of its
batch, or than the watermark when it is read in the batch's canonical order (engine/lateness.py),
is late (dead-letter); state expires by watermark, never by the newest
time seen, because topics interleave arbitrarily.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from streamjoin.engine.block import KEY, OFF, PART, SYSTEM_COLUMNS, TS, WIN, Block, concat
from streamjoin.engine.lateness import NO_TIME, late_in_batch
from streamjoin.engine.outer import (DECIDED, NEWEST_ARRIVAL, MatchedRefs, block_ref_keys, first_rows, matched_refs,
                                     padded)
from streamjoin.engine.probe import TimeIndex, expand_ranges, key_ranges, sort_by_key_time
from streamjoin.engine.result_ids import result_head
from streamjoin.engine.runs import SortedRuns

# A probe's key runs are narrowed to the times a combination allows once they hold more than
# this many candidates per tuple probed and held (_partner_ranges).
_NARROW_AFTER = 4


@dataclass(frozen=True)
class StreamPlan:
    name: str
    topic: str
    range_ms: int | None
    rows: int | None
    payload: tuple[str, ...]  # fields copied into results
    key_fields: tuple[str, ...]


@dataclass(frozen=True)
class JoinPlan:
    streams: tuple[StreamPlan, ...]
    lateness_ms: int
    exact_keys: bool  # False: keys are hashes, so matches are re-checked on the key fields
    join_type: str = "inner"  # engine/outer.py: inner | left | right | full | semi | anti
    # Tumbling and hopping window joins: the instance size W; the streams hold copies of tuples,
    # one per instance (engine/window_instances.py), and results name their instance.
    instance_ms: int | None = None

    @property
    def on_watermark(self) -> bool:
        return any(s.rows is not None for s in self.streams)

    @property
    def decided(self) -> tuple[int, ...]:
        """The streams whose rows the join emits alone (engine/outer.py)."""
        return DECIDED[self.join_type]


@dataclass
class GroupWindow:
    """The window state of one partition group: per stream, sorted runs merged in tiers
    (engine/runs.py), so a batch costs what it brings, not what the window holds."""

    runs: list[SortedRuns]
    max_ts: list[int]
    watermark: int = NO_TIME
    matched: dict[int, MatchedRefs] = field(default_factory=dict)  # per decided stream (engine/outer.py)

    @property
    def state(self) -> list[Block]:
        """Per stream, the live tuples as one block sorted by (key, ts, off). Merges each
        stream's runs into one: for count windows, which need every tuple of a key in order."""
        return [r.merged() for r in self.runs]

    @property
    def nbytes(self) -> int:
        return sum(r.nbytes for r in self.runs)

    @property
    def tuples(self) -> int:
        return sum(len(r) for r in self.runs)

    def next_deadline(self, plan: "JoinPlan") -> int | None:
        """The lowest watermark at which a decided time-window row would expire (its ts + W),
        or None when no such row is live: what an all-idle group waits for (services/hash)."""
        deadlines = [oldest + plan.streams[i].range_ms for i in self.matched  # type: ignore[operator]
                     if plan.streams[i].range_ms is not None and (oldest := self.runs[i].oldest()) is not None]
        return min(deadlines, default=None)

    @property
    def awaiting(self) -> int:
        """Live rows of the decided streams that no result has held yet: each still waits for
        its first match or for its deadline."""
        return sum(len(self.runs[i]) - refs.live for i, refs in self.matched.items())


@dataclass
class BatchOutcome:
    results: Block
    late: list[Block]  # per stream, rejected as later than the allowed lateness
    watermark_before: int
    watermark_after: int
    accepted: list[Block] = field(default_factory=list)
    # Per decided stream: the refs (PART, OFF, TS; WIN in a window join) this batch's results held
    # for the first time, which the state layer stores so that a restored window knows them
    # (engine/outer.py).
    marks: dict[int, Block] = field(default_factory=dict)
    unmatched: int = 0  # null-padded rows emitted for rows proven unmatched
    # Per stream, every tuple judged on time: `accepted` and, where `divert` took some away
    # (a split hot key's tuples bound for other sub-groups: engine/hot_split.py), those too.
    on_time: list[Block] = field(default_factory=list)


def empty_window(plan: JoinPlan, templates: list[Block]) -> GroupWindow:
    return GroupWindow([SortedRuns(t.take(np.empty(0, np.int64))) for t in templates], [NO_TIME] * len(plan.streams),
                       matched={i: MatchedRefs() for i in plan.decided})


def process_batch(plan: JoinPlan, window: GroupWindow, deltas: list[Block], now_ms: int,
                  idle: frozenset[int] = frozenset(), floor: int = NO_TIME,
                  bound: tuple[int | None, int | None] | None = None,
                  divert: Callable[[list[Block]], list[Block]] | None = None) -> BatchOutcome:
    """Join one batch of new tuples into the group's window (mutates `window`).

    `deltas`: per stream, the new tuples (may be empty: a batch with none still advances the
    watermark when `idle` or `floor` say so); `idle`: streams left out of the watermark's min;
    `floor`: the watermark after the batch is at least this; `bound`: event times the streams'
    newest-time minimum may not pass, as if one more input stood at it: the one the batch's
    tuples are judged late with, and the one the watermark after it takes (None: no bound;
    the progress of the partitions that re-route to the group, services/hash/progress.py);
    `divert`: given the on-time tuples per stream, the ones this group's window joins and
    takes (a split hot key sends the others to its sub-groups: engine/hot_split.py). Lateness
    and the watermark are judged on every on-time tuple, diverted or not, so they are those of
    the unsplit group."""
    wm_before = window.watermark
    before, after = bound or (None, None)
    accepted, late = [], []
    # The bound is one more input that has seen up to it and reads nothing in this batch.
    extra = [] if before is None else [window.runs[0].template]
    judged = late_in_batch(deltas + extra, list(window.max_ts) + ([before] if extra else []), idle, plan.lateness_ms)
    for d, behind in zip(deltas, judged):
        timely = (d[TS] >= wm_before) & ~behind
        accepted.append(sort_by_key_time(d.filter(timely)))
        late.append(d.filter(~timely))
    on_time, accepted = accepted, divert(accepted) if divert is not None else accepted
    if plan.on_watermark:
        for i, d in enumerate(accepted):
            window.runs[i].add(d)
        _advance_watermark(plan, window, on_time, idle, floor, after)
        results = _emit_on_watermark(plan, window, wm_before, window.watermark, now_ms)
    else:
        results = _emit_eager(plan, window, accepted, now_ms)
        _advance_watermark(plan, window, on_time, idle, floor, after)
    if plan.join_type == "inner":
        expire(plan, window)
        return BatchOutcome(results, late, wm_before, window.watermark, accepted, on_time=on_time)
    marks, first = _record_matches(plan, window, results, now_ms)
    expired = expire(plan, window)
    unmatched = [_unmatched(plan, window, i, expired[i], now_ms) for i in plan.decided]
    emitted = {"semi": first, "anti": unmatched}.get(plan.join_type, [results, *unmatched])
    return BatchOutcome(concat(emitted) if emitted else results.take(np.empty(0, np.int64)), late, wm_before,
                        window.watermark, accepted, marks, sum(len(u) for u in unmatched), on_time)


def _record_matches(plan: JoinPlan, window: GroupWindow, results: Block,
                    now_ms: int) -> tuple[dict[int, Block], list[Block]]:
    """Note every decided row the batch's results hold. Returns, per decided stream, the rows
    matched for the first time (refs and times: the marks the state layer stores), and for a
    semi join their null-padded rows (a semi row is emitted on its first match)."""
    marks, first = {}, []
    for i in plan.decided:
        name = plan.streams[i].name
        refs = matched_refs(results, name)
        fresh = window.matched[i].add(block_ref_keys(refs), refs[TS])
        marks[i] = refs.filter(fresh)
        if plan.join_type == "semi":
            first.append(_padded(plan, window, i, first_rows(results, name, plan.streams[i].payload, fresh), now_ms))
    return marks, first


def _unmatched(plan: JoinPlan, window: GroupWindow, side: int, expired: Block, now_ms: int) -> Block:
    """The null-padded rows of `side`'s expired tuples that no result held; the matched ones
    leave the matched set (they are decided)."""
    refs = window.matched[side]
    keys = block_ref_keys(expired)
    held = refs.contains(keys)
    if plan.streams[side].range_ms is not None:
        refs.expired(int(held.sum()), window.runs[side].floor)
    else:
        refs.discard(keys[held])
    return _padded(plan, window, side, expired.filter(~held), now_ms)


def _padded(plan: JoinPlan, window: GroupWindow, side: int, rows: Block, now_ms: int) -> Block:
    return padded(tuple(s.name for s in plan.streams), tuple(s.topic for s in plan.streams),
                  [r.template for r in window.runs], [s.payload for s in plan.streams], side, rows, now_ms,
                  plan.instance_ms or 0)


def _advance_watermark(plan: JoinPlan, window: GroupWindow, accepted: list[Block], idle: frozenset[int],
                       floor: int, bound: int | None = None) -> None:
    for i, d in enumerate(accepted):
        if len(d):
            window.max_ts[i] = max(window.max_ts[i], int(d[TS].max()))
    live = [t for i, t in enumerate(window.max_ts) if i not in idle]
    low = min(live + ([bound] if bound is not None else [])) if live else NO_TIME
    if low > NO_TIME:  # every stream idle: the watermark holds
        window.watermark = max(window.watermark, low - plan.lateness_ms)
    window.watermark = max(window.watermark, floor)


def expire(plan: JoinPlan, window: GroupWindow) -> dict[int, Block]:
    """Drop tuples no future on-time tuple can join with. Returns, per decided stream, the
    tuples dropped (their rows are decided now: engine/outer.py)."""
    wm = window.watermark
    expired = {i: window.runs[i].template for i in plan.decided}
    if wm <= NO_TIME:
        return expired
    for i, (s, runs) in enumerate(zip(plan.streams, window.runs)):
        if s.range_ms is not None:
            floor = wm - s.range_ms + 1  # alive while ts + range_ms > wm
            if i in expired:
                expired[i] = runs.expiring(floor)
            runs.expire_before(floor)
            continue
        state = runs.merged()
        if not len(state):
            continue
        # A count-window tuple is dead once `rows` newer same-key tuples are final (ts < wm).
        idx = TimeIndex(state[KEY], state[TS], int(state[TS].min()), max(int(state[TS].max()), wm))
        _, final_end = idx.between(state[KEY], np.full(len(state), NO_TIME), np.full(len(state), wm - 1))
        alive = np.arange(len(state)) >= final_end - s.rows
        if not alive.all():
            runs.replace(state.filter(alive))
            if i in expired:
                expired[i] = state.filter(~alive)
    return expired


# ---------------------------------------------------------------- eager (RANGE)

def _emit_eager(plan: JoinPlan, window: GroupWindow, accepted: list[Block], now_ms: int) -> Block:
    parts = []
    for i, delta in enumerate(accepted):
        if len(delta):
            # Each other stream contributes only its tuples with the delta's keys, gathered
            # from every run: the probe below then works on blocks the size of its matches.
            sources = [window.runs[j].matching(delta[KEY]) if j != i else delta for j in range(len(plan.streams))]
            combos = probe_all(plan, sources, i)
            parts.append(assemble(plan, sources, combos, now_ms))
        # Inserting after probing realises the delta formula: later D_i see D_j (j < i).
        window.runs[i].add(delta)
    return concat(parts) if parts else assemble(plan, [r.template for r in window.runs], no_combos(plan), now_ms)


def probe_all(plan: JoinPlan, sources: list[Block], start: int) -> dict[int, np.ndarray]:
    """Every window-valid combination of `sources[start]` (each tuple once) with the other
    sources, as per-stream index arrays; every source sorted by (key, ts, off)."""
    combos = {start: np.arange(len(sources[start]), dtype=np.int64)}
    keys = sources[start][KEY]
    t_max = sources[start][TS].copy()
    for j in range(len(plan.streams)):
        if j == start:
            continue
        other = sources[j]
        lo, hi = _partner_ranges(plan, other, start, j, keys, sources[start][TS][combos[start]])
        owner, pos = expand_ranges(lo, hi)
        combos = {s: idx[owner] for s, idx in combos.items()}
        combos[j] = pos
        keys = keys[owner]
        t_max = np.maximum(t_max[owner], other[TS][pos])
        # T only grows as streams are added, so a violated window stays violated: prune now.
        keep = np.ones(len(pos), dtype=bool)
        for s, idx in combos.items():
            keep &= t_max - sources[s][TS][idx] < plan.streams[s].range_ms  # type: ignore[operator]
        combos = {s: idx[keep] for s, idx in combos.items()}
        keys, t_max = keys[keep], t_max[keep]
    return combos


def _partner_ranges(plan: JoinPlan, other: Block, start: int, j: int, keys: np.ndarray,
                    t_start: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[lo, hi) in `other` (stream j, sorted by (key, ts, off)) of each probe's candidate
    partners: its key's run, narrowed to the event times a valid combination allows when that
    run is long. Any combination holding the start tuple (time t) and a tuple of stream j (time
    u) has t - W_j < u < t + W_start (T, the newest time, is at least both), so tuples outside
    that band are never a result.

    Narrowing costs an index of `other` (a sort of its keys' ranks), so it is done only when the
    key runs hold many more tuples than the band can: a hot key whose run spans far more than a
    window, as in a backlog read in large batches, where the key runs' product would otherwise
    grow with the square of the key's tuples in the batch, not with its results."""
    lo, hi = key_ranges(other[KEY], keys)
    if len(other) < 2 or int((hi - lo).sum()) <= _NARROW_AFTER * (len(other) + len(keys)):
        return lo, hi
    ts = other[TS]
    try:
        index = TimeIndex(other[KEY], ts, int(ts.min()), int(ts.max()))
    except OverflowError:  # too many keys times too long a span to pack: the key runs whole
        return lo, hi
    return index.between(keys, t_start - plan.streams[j].range_ms + 1,  # type: ignore[operator]
                         t_start + plan.streams[start].range_ms - 1)  # type: ignore[operator]


# ---------------------------------------------------------- on watermark (ROWS)

def _emit_on_watermark(plan: JoinPlan, window: GroupWindow, wm_from: int, wm_to: int, now_ms: int) -> Block:
    state = window.state
    if wm_to <= wm_from or any(not len(b) for b in state):
        return assemble(plan, state, no_combos(plan), now_ms)
    indexes = [TimeIndex(b[KEY], b[TS], int(b[TS].min()), int(b[TS].max())) for b in state]
    parts = []
    for j, trig_stream in enumerate(state):
        ts = trig_stream[TS]
        trig = np.flatnonzero((ts >= wm_from) & (ts < wm_to))
        if len(trig):
            parts.append(assemble(plan, state, _combos_for_triggers(plan, state, indexes, j, trig), now_ms))
    return concat(parts) if parts else assemble(plan, state, no_combos(plan), now_ms)


def _combos_for_triggers(plan: JoinPlan, state: list[Block], indexes: list[TimeIndex], j: int,
                         trig: np.ndarray) -> dict[int, np.ndarray]:
    """All combinations whose newest member (by ts, then stream order) is a trigger tuple of stream j.
    `state`: per stream, the window as one block sorted by (key, ts, off)."""
    keys = state[j][KEY][trig]
    big_t = state[j][TS][trig]
    floor = np.full(len(trig), NO_TIME)
    ok = np.ones(len(trig), dtype=bool)
    own = plan.streams[j]
    if own.rows is not None:  # the trigger must itself be inside its own count window at T
        _, end_at_t = indexes[j].between(keys, big_t, big_t)
        ok &= end_at_t - trig - 1 < own.rows
    ranges: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for i, s in enumerate(plan.streams):
        if i == j:
            continue
        # Ties in ts go to the lower stream index, so exactly one member is "newest".
        upper = big_t if i < j else big_t - 1
        if s.range_ms is not None:
            lo, hi = indexes[i].between(keys, big_t - s.range_ms + 1, upper)
        else:
            first, end_at_t = indexes[i].between(keys, floor, big_t)
            _, end_upper = indexes[i].between(keys, floor, upper)
            lo, hi = np.maximum(first, end_at_t - s.rows), np.minimum(end_at_t, end_upper)
        ranges[i] = (lo, np.where(ok, np.maximum(hi, lo), lo))
    return _cartesian(j, trig, ranges)


def _cartesian(j: int, trig: np.ndarray, ranges: dict[int, tuple[np.ndarray, np.ndarray]]) -> dict[int, np.ndarray]:
    counts = {i: hi - lo for i, (lo, hi) in ranges.items()}
    total = np.ones(len(trig), dtype=np.int64)
    for c in counts.values():
        total *= c
    owner, local = expand_ranges(np.zeros(len(trig), np.int64), total)
    combos = {j: trig[owner]}
    stride = np.ones(len(owner), dtype=np.int64)
    for i in sorted(ranges, reverse=True):  # mixed-radix digits, last stream fastest
        lo, _ = ranges[i]
        c = counts[i][owner]
        combos[i] = lo[owner] + (local // stride) % np.maximum(c, 1)
        stride = stride * c
    return combos


# ------------------------------------------------------------------ results

def no_combos(plan: JoinPlan) -> dict[int, np.ndarray]:
    return {i: np.empty(0, np.int64) for i in range(len(plan.streams))}


def assemble(plan: JoinPlan, sources: list[Block], combos: dict[int, np.ndarray], now_ms: int) -> Block:
    if not plan.exact_keys and len(combos[0]):
        combos = _recheck_keys(plan, sources, combos)
    n = len(combos[0])
    cols: dict[str, np.ndarray] = {}
    parts, offs, times = [], [], []
    for i, s in enumerate(plan.streams):
        src, idx = sources[i], combos[i]
        parts.append(src[PART][idx])
        offs.append(src[OFF][idx])
        times.append(src[TS][idx])
        cols[f"{s.name}.partition"] = parts[-1]
        cols[f"{s.name}.offset"] = offs[-1]
        cols[f"{s.name}.ts"] = times[-1]
        for f in s.payload:
            cols[f"{s.name}.{f}"] = src[f][idx]
    cols[NEWEST_ARRIVAL] = np.max([sources[i]["_arr"][combos[i]] for i in range(len(plan.streams))], axis=0) \
        if n else np.empty(0, np.int64)
    # Members of a window join's result are copies of one instance: the first's WIN names it.
    start = sources[0][WIN][combos[0]] if plan.instance_ms is not None else None
    head = result_head([s.topic for s in plan.streams], parts, offs,
                       np.max(times, axis=0) if n else np.empty(0, np.int64), now_ms, start, plan.instance_ms or 0)
    return Block(head | cols)


def _recheck_keys(plan: JoinPlan, sources: list[Block], combos: dict[int, np.ndarray]) -> dict[int, np.ndarray]:
    """Hashed keys can collide: keep only combinations whose key fields really match."""
    keep = np.ones(len(combos[0]), dtype=bool)
    first = plan.streams[0]
    for i, s in enumerate(plan.streams[1:], start=1):
        for fa, fb in zip(first.key_fields, s.key_fields):
            keep &= sources[0][fa][combos[0]] == sources[i][fb][combos[i]]
    return {i: idx[keep] for i, idx in combos.items()}


def template(columns: dict[str, np.dtype]) -> Block:
    """An empty block with a stream's columns (system columns first)."""
    ordered = {k: columns[k] for k in SYSTEM_COLUMNS} | {k: v for k, v in columns.items() if k not in SYSTEM_COLUMNS}
    return Block({k: np.empty(0, dtype=v) for k, v in ordered.items()})
