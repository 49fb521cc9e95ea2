"""Tumbling and hopping window joins as sliding-window joins over replicated tuples.

A window of size W sliding by S (S == W: tumbling; S < W: hopping) has one
instance [s, s + W) for every start s = k * S, k any integer; a tuple at time t
belongs to each instance with s <= t < s + W (floor division, so negative times
land where they should). A window join result is a combination of same-key
tuples all in one instance.

This module owns the rewrite that lets the sliding-window engine
(engine/window_join.py) run such a join unchanged: each tuple becomes one copy
per instance it belongs to, carrying the instance start in column WIN and a join
key mixed with it, so only copies of the same instance can meet; every stream's
window becomes RANGE W (two members of one instance are always less than W
apart, and copies of different instances never match); WIN joins the key fields
so the engine's key re-check compares it too, which makes a colliding mixed key
harmless.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from streamjoin.engine.block import KEY, TS, WIN, Block
from streamjoin.engine.result_ids import mix
from streamjoin.engine.window_join import JoinPlan

__all__ = ["WIN", "instances", "mix_key", "assign", "instance_plan"]


def instances(ts: np.ndarray, size_ms: int, slide_ms: int) -> tuple[np.ndarray, np.ndarray]:
    """Every (tuple, instance) pair of a window of `size_ms` sliding by `slide_ms`: the tuple's
    row index and the instance start, rows ascending, then starts ascending."""
    if not 0 < slide_ms <= size_ms:
        raise ValueError(f"a window needs 0 < slide <= size, got size {size_ms} and slide {slide_ms}")
    ts = np.asarray(ts, np.int64)
    copies = -(-size_ms // slide_ms)  # ceil(W / S): the most instances one tuple belongs to
    newest = (ts // slide_ms) * slide_ms  # the latest start at or before t
    # Column j is the start `copies - 1 - j` slides before the newest, so each row reads ascending.
    back = np.arange(copies - 1, -1, -1, dtype=np.int64) * slide_ms
    starts = newest[:, None] - back[None, :]
    inside = starts > ts[:, None] - size_ms  # t < s + W; s <= t holds by construction
    rows, _ = np.nonzero(inside)  # row-major: rows ascending, then columns (starts) ascending
    return rows.astype(np.int64), starts[inside]


def mix_key(keys: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """A 64-bit key for (join key, instance start): SplitMix64's finaliser of (the finalised key
    XOR the start). Equal pairs give equal keys. The key is finalised first because XOR with
    any fixed multiple of the start collides often on small keys and starts (a pair's key
    difference cancels a start difference): the finaliser is a bijection, so pairs sharing a
    key or a start never collide, and others as rarely as random 64-bit values; the engine
    re-checks the key fields and WIN, so a collision still never makes a result."""
    k = np.asarray(keys, np.int64).view(np.uint64)
    s = np.asarray(starts, np.int64).view(np.uint64)
    return mix(mix(k) ^ s).view(np.int64)


def assign(block: Block, size_ms: int, slide_ms: int) -> Block:
    """`block`'s rows, one copy per instance each belongs to, with WIN (the instance start) and
    KEY mixed with it; every other column as it was."""
    rows, starts = instances(block[TS], size_ms, slide_ms)
    copies = block.take(rows)
    return Block(dict(copies.columns) | {KEY: mix_key(copies[KEY], starts), WIN: starts})


def instance_plan(plan: JoinPlan, size_ms: int) -> JoinPlan:
    """`plan` rewritten for copies made by `assign`: every stream a RANGE `size_ms` window with
    WIN among its key fields, keys re-checked (they are mixed hashes now), and results naming
    their instance (`instance_ms`)."""
    streams = tuple(replace(s, range_ms=size_ms, rows=None, key_fields=s.key_fields + (WIN,)) for s in plan.streams)
    return replace(plan, streams=streams, exact_keys=False, instance_ms=size_ms)
