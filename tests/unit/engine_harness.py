"""Drives the engine over a scripted arrival sequence, for tests and the
benchmark floor: tuples arrive in a given cross-stream order, cut into
batches at given points; the harness returns emitted and late refs."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from streamjoin.engine.block import system_block
from streamjoin.engine.reference import RefTuple, RefWindow, TupleRef
from streamjoin.engine.window_join import NO_TIME, JoinPlan, StreamPlan, empty_window, process_batch


@dataclass(frozen=True)
class Arrival:
    stream: int
    key: int
    ts: int
    offset: int


def plan_for(windows: list[RefWindow], lateness: int, join_type: str = "inner") -> JoinPlan:
    streams = tuple(
        StreamPlan(f"s{i}", f"t{i}", w.range_ms, w.rows, ("v",), ("k",)) for i, w in enumerate(windows)
    )
    return JoinPlan(streams, lateness, exact_keys=True, join_type=join_type)


def _block(arrivals: list[Arrival]):
    key = np.array([a.key for a in arrivals], dtype=np.int64)
    ts = np.array([a.ts for a in arrivals], dtype=np.int64)
    off = np.array([a.offset for a in arrivals], dtype=np.int64)
    return system_block(key, ts, np.zeros(len(arrivals)), off, ts, {"v": off * 10})


def run(windows: list[RefWindow], lateness: int, arrivals: list[Arrival], cuts: list[int], join_type: str = "inner",
        flush_to: int | None = None):
    """Feed `arrivals` cut at `cuts`; `flush_to`: then one batch without tuples whose watermark
    floor is this (as an idle timeout moves it), so rows still open get decided."""
    plan = plan_for(windows, lateness, join_type)
    m = len(windows)
    window = empty_window(plan, [_block([]) for _ in range(m)])
    emitted: list[tuple[TupleRef, ...]] = []
    late: set[TupleRef] = set()
    bounds = sorted({0, len(arrivals), *[c for c in cuts if 0 < c < len(arrivals)]})
    steps = [(arrivals[a:b], NO_TIME) for a, b in zip(bounds, bounds[1:])]
    if flush_to is not None:
        steps.append(([], flush_to))
    for batch, floor in steps:
        deltas = [_block([x for x in batch if x.stream == i]) for i in range(m)]
        out = process_batch(plan, window, deltas, now_ms=0, floor=floor)
        res = out.results
        cols = [(res[f"s{i}.partition"], res[f"s{i}.offset"]) for i in range(m)]
        for r in range(len(res)):
            emitted.append(tuple((f"t{i}", int(cols[i][0][r]), int(cols[i][1][r])) for i in range(m)))
        for i, lb in enumerate(out.late):
            late |= {(f"t{i}", 0, int(o)) for o in lb["_off"]}
    return emitted, late, window.watermark


def reference_streams(arrivals: list[Arrival], m: int, exclude: set[TupleRef]) -> list[list[RefTuple]]:
    streams: list[list[RefTuple]] = [[] for _ in range(m)]
    for a in arrivals:
        ref = (f"t{a.stream}", 0, a.offset)
        if ref not in exclude:
            streams[a.stream].append(RefTuple(ref, a.key, a.ts))
    return streams
