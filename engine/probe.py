"""Vectorised probing of key-sorted window state.

State of one stream in one partition group is kept sorted by (key, ts, off),
so a probe is two `searchsorted`s and matches are contiguous ranges; no probe
scans more than the matching keys (this is what the cluster join paper's
extendible-hash mini-groups buy, with a sorted run instead of buckets).
"""

from __future__ import annotations

import numpy as np

from streamjoin.engine.block import KEY, OFF, TS, Block


def sort_by_key_time(block: Block) -> Block:
    order = np.lexsort((block[OFF], block[TS], block[KEY]))
    return block.take(order)


def distinct(values: np.ndarray) -> np.ndarray:
    """The distinct values, ascending. A probe's keys usually come sorted (a batch is sorted by
    key before it probes), and then one comparison of neighbours finds them: `np.unique` would
    hash or sort them again (measured: a tenth of a hash worker's loop).

    values: a 1-d array of a type NumPy can order."""
    if len(values) < 2 or not (values[1:] >= values[:-1]).all():
        return np.unique(values)
    first = np.empty(len(values), dtype=bool)
    first[0] = True
    np.not_equal(values[1:], values[:-1], out=first[1:])
    return values[first]


def key_ranges(sorted_keys: np.ndarray, probe_keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[lo, hi) of each probe key's run in `sorted_keys`."""
    return (np.searchsorted(sorted_keys, probe_keys, side="left"),
            np.searchsorted(sorted_keys, probe_keys, side="right"))


def expand_ranges(lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For ranges [lo_i, hi_i): (i repeated per element, the element positions)."""
    counts = np.maximum(hi - lo, 0)
    total = int(counts.sum())
    owner = np.repeat(np.arange(len(lo), dtype=np.int64), counts)
    starts = np.cumsum(counts) - counts
    positions = lo[owner] + (np.arange(total, dtype=np.int64) - starts[owner])
    return owner, positions


class TimeIndex:
    """Finds, per (key, time) query, positions in state sorted by (key, ts, off).

    Keys are replaced by their dense rank so (rank, ts) packs into one int64
    and a single searchsorted answers "first position with key k and ts >= t".
    """

    def __init__(self, sorted_keys: np.ndarray, sorted_ts: np.ndarray, t_min: int, t_max: int) -> None:
        self.t_min = int(t_min)
        self.span = int(t_max) - self.t_min + 3
        self.keys = distinct(sorted_keys)
        if len(self.keys) * self.span >= 1 << 62:
            raise OverflowError("key count x time span too large to pack; lower the window or split groups")
        rank = np.searchsorted(self.keys, sorted_keys)
        self.packed = rank.astype(np.int64) * self.span + (sorted_ts - self.t_min + 1)

    def _pack(self, keys: np.ndarray, ts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        rank = np.searchsorted(self.keys, keys)
        present = (rank < len(self.keys)) & (self.keys[np.minimum(rank, len(self.keys) - 1)] == keys)
        clipped = np.clip(ts - self.t_min + 1, 0, self.span - 1)
        return rank.astype(np.int64) * self.span + clipped, present

    def between(self, keys: np.ndarray, t_from: np.ndarray, t_to: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """[lo, hi) of the tuples with this key and t_from <= ts <= t_to (empty if none)."""
        p_from, present = self._pack(keys, t_from)
        p_to, _ = self._pack(keys, t_to)
        lo = np.searchsorted(self.packed, p_from, side="left")
        hi = np.searchsorted(self.packed, p_to, side="right")
        return lo, np.where(present & (hi > lo), hi, lo)
