"""Plain-Python reference join: the executable statement of the join contract.

Deliberately naive (nested loops over every combination) so that it is easy
to believe; the vectorised engine, the Spark verifier and the property tests
are all judged against it. It is also the benchmark floor.

Contract, for m streams joined on equal keys:
  a combination (s_1..s_m), one tuple per stream, all with the same key, with
  T = max_i ts(s_i), is a result when every s_i is inside its window at T:
    RANGE W_i:  T - ts(s_i) < W_i
    ROWS  N_i:  fewer than N_i tuples u of stream i with the same key have
                ts(u) <= T and (ts(u), offset(u)) > (ts(s_i), offset(s_i))
  Tuples are ordered within a stream by (ts, partition, offset); keys live in
  one partition per stream, so per key this is (ts, offset).
Count-window results are final only once the watermark of their partition
group has passed T; `final_watermark` bounds them (None = everything is final).
A result's group is its key's: `group_of` its first member (by default the
member's partition, which is its group when the inputs are co-partitioned).
Tumbling and hopping window joins (`reference_window_join`) state their own
contract: combinations within one window instance, per instance.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Callable, Hashable, Mapping, Sequence

TupleRef = tuple[str, int, int]  # (topic, partition, offset): a tuple's identity


@dataclass(frozen=True)
class RefTuple:
    ref: TupleRef
    key: Hashable
    ts: int


@dataclass(frozen=True)
class RefWindow:
    range_ms: int | None = None
    rows: int | None = None


def _inside(window: RefWindow, t: RefTuple, same_key_stream: Sequence[RefTuple], big_t: int) -> bool:
    if window.range_ms is not None:
        return big_t - t.ts < window.range_ms
    assert window.rows is not None
    newer = sum(
        1
        for u in same_key_stream
        if u.ts <= big_t and (u.ts, u.ref[2]) > (t.ts, t.ref[2])
    )
    return newer < window.rows


def reference_join(
    streams: Sequence[Sequence[RefTuple]],
    windows: Sequence[RefWindow],
    final_watermark: Mapping[int, int] | None = None,
    group_of: Callable[[RefTuple], int] = lambda t: t.ref[1],
) -> set[tuple[TupleRef, ...]]:
    """All results, each as the tuple of its inputs' refs in stream order.

    `final_watermark` maps group -> watermark; when given, results whose
    time T is not below their group's watermark are not yet final and are
    left out (used for count windows, which emit on the watermark). `group_of`
    names a tuple's group.
    """
    by_key: list[dict[Hashable, list[RefTuple]]] = []
    for stream in streams:
        groups: dict[Hashable, list[RefTuple]] = {}
        for t in stream:
            groups.setdefault(t.key, []).append(t)
        by_key.append(groups)
    keys = set.intersection(*(set(g) for g in by_key)) if by_key else set()
    out: set[tuple[TupleRef, ...]] = set()
    for key in keys:
        per_stream = [g[key] for g in by_key]
        for combo in itertools.product(*per_stream):
            big_t = max(t.ts for t in combo)
            if final_watermark is not None and big_t >= final_watermark.get(group_of(combo[0]), big_t):
                continue
            if all(_inside(w, t, s, big_t) for w, t, s in zip(windows, combo, per_stream)):
                out.add(tuple(t.ref for t in combo))
    return out


# ------------------------------------------------- outer, semi and anti joins (2-way)

ABSENT_REF = -1  # partition and offset of the member a null-padded result lacks (engine.result_ids.ABSENT)
JOIN_TYPES = ("inner", "left", "right", "full", "semi", "anti")
DECIDED = {"inner": (), "left": (0,), "semi": (0,), "anti": (0,), "right": (1,), "full": (0, 1)}


def _absent(ref: TupleRef) -> TupleRef:
    return (ref[0], ABSENT_REF, ABSENT_REF)


def decided(window: RefWindow, t: RefTuple, same_key_stream: Sequence[RefTuple], watermark: int | None) -> bool:
    """Whether the watermark proves no partner can still join `t`: a RANGE tuple once
    watermark >= ts + W; a ROWS tuple once the N-th newer same-key tuple (in (ts, offset) order)
    has ts < watermark. `watermark` None: nothing is decided (its group never ran a batch)."""
    if watermark is None:
        return False
    if window.range_ms is not None:
        return watermark >= t.ts + window.range_ms
    newer = sorted(u.ts for u in same_key_stream if (u.ts, u.ref[2]) > (t.ts, t.ref[2]))
    assert window.rows is not None
    return len(newer) >= window.rows and newer[window.rows - 1] < watermark


def reference_outer_join(
    streams: Sequence[Sequence[RefTuple]],
    windows: Sequence[RefWindow],
    join_type: str,
    topics: Sequence[str],
    watermark: Mapping[int, int],
    group_of: Callable[[RefTuple], int] = lambda t: t.ref[1],
) -> set[tuple[TupleRef, ...]]:
    """The results of a 2-way join of any type, each as (ref of stream 0, ref of stream 1);
    a member a row lacks is (its stream's topic, ABSENT_REF, ABSENT_REF).

    inner: the combinations of `reference_join` (count windows: those final, T below their
    group's watermark; time windows: all). left/right/full: those, and each row of the first /
    second / both streams that is `decided` by its group's watermark and in no combination.
    semi: each row of the first stream in a final combination. anti: each decided row of the
    first stream in no combination. `watermark`: group -> the group's final watermark;
    `topics`: the streams' topics (for the absent member's ref)."""
    assert len(streams) == 2 and join_type in JOIN_TYPES
    eager = all(w.range_ms is not None for w in windows)
    combos = reference_join(streams, windows)
    final = combos if eager else reference_join(streams, windows, watermark, group_of)
    if join_type == "semi":
        matched = {c[0] for c in final}
        return {(ref, _absent((topics[1], 0, 0))) for ref in matched}
    out = set() if join_type == "anti" else set(final)
    for side in DECIDED[join_type]:
        matched = {c[side] for c in combos}
        same_key: dict[Hashable, list[RefTuple]] = {}
        for t in streams[side]:
            same_key.setdefault(t.key, []).append(t)
        for t in streams[side]:
            if t.ref in matched or not decided(windows[side], t, same_key[t.key], watermark.get(group_of(t))):
                continue
            other = _absent((topics[1 - side], 0, 0))
            out.add((t.ref, other) if side == 0 else (other, t.ref))
    return out


# ------------------------------------------------- tumbling and hopping window joins

def window_starts(ts: int, size_ms: int, slide_ms: int) -> list[int]:
    """The starts s = k * slide of the instances [s, s + size) holding time `ts`, ascending."""
    start, out = (ts // slide_ms) * slide_ms, []
    while start > ts - size_ms:
        out.append(start)
        start -= slide_ms
    return out[::-1]


def reference_window_join(
    streams: Sequence[Sequence[RefTuple]],
    size_ms: int,
    slide_ms: int,
    join_type: str,
    topics: Sequence[str],
    watermark: Mapping[int, int] | None = None,
    group_of: Callable[[RefTuple], int] = lambda t: t.ref[1],
) -> set[tuple[int | TupleRef, ...]]:
    """The results of a tumbling (slide == size) or hopping (slide < size) window join, each
    as (instance start, ref of stream 0, ref of stream 1, ...); a member a row lacks is
    (its stream's topic, ABSENT_REF, ABSENT_REF).

    Instances are [s, s + size) for s every multiple of `slide_ms`; a tuple is in each one
    holding its time. inner (any number of streams): every combination of same-key tuples,
    one per stream, all in one instance, once per instance holding them all. left/right/full
    (2 streams): those, and per instance each row of the first / second / both streams with
    no partner in it, once its group's watermark decides it (watermark >= ts + size: the rule
    of the sliding window the engine runs, not the instance's end). semi: each row of the
    first stream once per instance in which it has a partner; anti: each decided row of the
    first stream once per instance in which it has none. `watermark`: group -> its final
    watermark, a group without one deciding nothing (None: every row decided)."""
    assert join_type in JOIN_TYPES and (join_type == "inner" or len(streams) == 2)
    cells: list[dict[tuple[Hashable, int], list[RefTuple]]] = []  # per stream: (key, start) -> tuples
    for stream in streams:
        cell: dict[tuple[Hashable, int], list[RefTuple]] = {}
        for t in stream:
            for start in window_starts(t.ts, size_ms, slide_ms):
                cell.setdefault((t.key, start), []).append(t)
        cells.append(cell)
    shared = set.intersection(*(set(c) for c in cells)) if cells else set()
    out: set[tuple[int | TupleRef, ...]] = set()
    if join_type not in ("semi", "anti"):
        for key, start in shared:
            for combo in itertools.product(*(c[(key, start)] for c in cells)):
                out.add((start, *(t.ref for t in combo)))
    for side in DECIDED[join_type]:
        other = _absent((topics[1 - side], 0, 0))
        for cell, members in cells[side].items():
            # semi: the rows with a partner in the instance (at once: eager); the others: those without.
            if (cell in shared) != (join_type == "semi"):
                continue
            for t in members:
                if join_type == "semi" or _window_decided(t, size_ms, watermark, group_of):
                    out.add((cell[1], t.ref, other) if side == 0 else (cell[1], other, t.ref))
    return out


def _window_decided(t: RefTuple, size_ms: int, watermark: Mapping[int, int] | None,
                    group_of: Callable[[RefTuple], int]) -> bool:
    """Whether a copy of `t` alone in its instance is decided: no watermark given, or its
    group's is at least ts + size (a group without one decides nothing)."""
    if watermark is None:
        return True
    wm = watermark.get(group_of(t))
    return wm is not None and wm >= t.ts + size_ms


# ------------------------------------------------------------- as-of joins (stream to table)

@dataclass(frozen=True)
class RefVersion:
    """A table version: its identity, key, event time, and whether it is a tombstone."""

    ref: TupleRef
    key: Hashable
    ts: int
    deleted: bool = False


def reference_asof_join(stream: Sequence[RefTuple], versions: Sequence[RefVersion], join_type: str,
                        table_topic: str, final_table_watermark: int) -> set[tuple[TupleRef, TupleRef]]:
    """The as-of join's contract: each stream tuple whose time is below the table's final
    watermark (the others still wait), with the version of its key with the greatest
    (ts, offset) at or before its time. No such version, or a tombstone: no result for
    `inner`, the tuple with (table_topic, ABSENT_REF, ABSENT_REF) for `left`."""
    out: set[tuple[TupleRef, TupleRef]] = set()
    for t in stream:
        if t.ts >= final_table_watermark:
            continue
        best = max((v for v in versions if v.key == t.key and v.ts <= t.ts), key=lambda v: (v.ts, v.ref[2]),
                   default=None)
        if best is not None and not best.deleted:
            out.add((t.ref, best.ref))
        elif join_type == "left":
            out.add((t.ref, _absent((table_topic, 0, 0))))
    return out


# ------------------------------------------------------------- ring mode (theta)

@dataclass(frozen=True)
class ThetaTuple:
    """A tuple of ring mode: identity, event time and the fields predicates read."""

    ref: TupleRef
    ts: int
    fields: Mapping[str, object]


def theta_order(stream: int, t: ThetaTuple) -> tuple[int, int, int, int]:
    """The global order ring mode releases tuples in: (ts, stream, partition, offset)."""
    return (t.ts, stream, t.ref[1], t.ref[2])


def reference_theta_join(
    streams: Sequence[Sequence[ThetaTuple]],
    windows: Sequence[RefWindow],
    pair_predicate: Callable[[int, ThetaTuple, int, ThetaTuple], bool],
) -> set[tuple[TupleRef, ...]]:
    """Ring mode's contract: every combination (one tuple per stream) whose
    newest member in the global order (`theta_order`) is the trigger t, with
    T = ts(t), every member s_i inside its window at t, and the predicate true
    on every pair of members:
      RANGE W_i:  T - ts(s_i) < W_i
      ROWS  N_i:  fewer than N_i tuples u of stream i lie after s_i and not
                  after t in the global order (count windows are per stream).
    `pair_predicate(i, a, j, b)` is the AND of the terms between streams i < j.
    """
    m = len(streams)
    ordered = [sorted(s, key=lambda t, i=i: theta_order(i, t)) for i, s in enumerate(streams)]
    out: set[tuple[TupleRef, ...]] = set()

    def inside(i: int, t: ThetaTuple, trigger: tuple[int, int, int, int]) -> bool:
        w = windows[i]
        if w.range_ms is not None:
            return trigger[0] - t.ts < w.range_ms
        newer = sum(1 for u in ordered[i] if theta_order(i, t) < theta_order(i, u) <= trigger)
        return newer < (w.rows or 0)

    def grow(combo: list[ThetaTuple]) -> None:
        i = len(combo)
        if i == m:
            trigger = max(theta_order(k, t) for k, t in enumerate(combo))
            if all(inside(k, t, trigger) for k, t in enumerate(combo)):
                out.add(tuple(t.ref for t in combo))
            return
        for t in ordered[i]:
            big_t = max([t.ts] + [c.ts for c in combo])
            # T only grows as members are added: a member already outside its time window stays outside.
            if any(windows[k].range_ms is not None and big_t - c.ts >= windows[k].range_ms  # type: ignore[operator]
                   for k, c in enumerate(combo + [t])):
                continue
            if all(pair_predicate(k, combo[k], i, t) for k in range(i)):
                grow(combo + [t])

    grow([])
    return out
