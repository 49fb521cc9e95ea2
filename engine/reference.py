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
