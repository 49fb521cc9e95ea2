"""Deterministic 128-bit result ids, computed over whole blocks from the
inputs' (topic, partition, offset) in stream order.

A 64-bit id collides within a month at a few thousand results per second
(birthday bound), and consumers deduplicate by it, so an id is two
independent 64-bit hashes of the same refs, `hi` and `lo`, each
    h = seed
    for each stream, in join order:
        h = f(h ^ t(topic)); h = f(h ^ partition); h = f(h ^ offset)
  hi: seed 0xcbf29ce484222325, t = FNV-1a 64,        f = SplitMix64's finaliser
  lo: seed 0x84222325cbf29ce4, t = FNV-1a 64 of "\\x01" + topic, f = MurmurHash3's fmix64 after
      adding 0xd6e8feb86659fd93
(all arithmetic mod 2**64). Anyone can recompute an id from a result's input
refs (the Spark verifier does). A tumbling or hopping window join's result also
names its window instance: after the streams, each half takes one more round with
the instance start s (int64 bits),  h = f(h ^ s),  so the same members in two
overlapping instances have two ids. Its text form is `hi` then `lo` as 32
lower-case hex digits (`result_id_hex`). A member a result lacks (outer, semi
and anti joins) has partition and offset ABSENT (-1), hashed the same way.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Sequence

import numpy as np

from streamjoin.engine import hash_kernels

RESULT_ID_HI, RESULT_ID_LO = "result_id_hi", "result_id_lo"  # block columns (uint64)
# The partition and offset of a member a null-padded result (outer, semi, anti joins) lacks:
# its id hashes them like any ref, so it differs from every combination's and is deterministic.
ABSENT = -1
EVENT_TIME, PRODUCED_MS = "event_time", "produced_ms"  # block columns (int64): T, and when it was produced
# Block columns (int64) of tumbling and hopping window joins' results: their instance [start, end).
WINDOW_START, WINDOW_END = "window_start", "window_end"
_UINT64 = np.uint64
_FNV_OFFSET = 0xCBF29CE484222325
_FNV_PRIME = 0x100000001B3
_LO_SEED = 0x84222325CBF29CE4
_HEX = np.frombuffer(b"0123456789abcdef", np.uint8)


@lru_cache(maxsize=4096)  # a job has a few topics; a per-byte Python loop per block would cost more than its hashes
def fnv1a64(text: str) -> np.uint64:
    h = _FNV_OFFSET
    for byte in text.encode():
        h = ((h ^ byte) * _FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
    return _UINT64(h)


# The finalisers' constants (add, shift, multiply, shift, multiply, shift), for the kernels and mix/fmix.
_MIX = np.array([0x9E3779B97F4A7C15, 30, 0xBF58476D1CE4E5B9, 27, 0x94D049BB133111EB, 31], _UINT64)
_FMIX = np.array([0xD6E8FEB86659FD93, 33, 0xFF51AFD7ED558CCD, 33, 0xC4CEB9FE1A85EC53, 33], _UINT64)


def _finalise(x: np.ndarray, constants: tuple[np.uint64, ...]) -> np.ndarray:
    add, shift1, mul1, shift2, mul2, shift3 = constants
    z = x + add
    z = (z ^ (z >> shift1)) * mul1
    z = (z ^ (z >> shift2)) * mul2
    return z ^ (z >> shift3)


def mix(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser."""
    with np.errstate(over="ignore"):
        return _finalise(x, _MIX)


def fmix(x: np.ndarray) -> np.ndarray:
    """MurmurHash3's fmix64, after adding a constant so that 0 does not map to 0."""
    with np.errstate(over="ignore"):
        return _finalise(x, _FMIX)


def _refs(columns: Sequence[np.ndarray], rows: int) -> np.ndarray:
    """Streams' partitions or offsets as one (streams, rows) uint64 array of their int64 bits."""
    refs = np.empty((len(columns), rows), np.int64)
    for stream, column in enumerate(columns):
        refs[stream] = column
    return refs.view(_UINT64)


def result_ids(topics: Sequence[str], partitions: Sequence[np.ndarray], offsets: Sequence[np.ndarray],
               window_start: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(hi, lo) uint64 halves of each result's id; `partitions[i]`, `offsets[i]` are stream i's refs;
    `window_start`: each result's instance start (window joins; None: a sliding-window join).
    Both halves are one numba loop each (engine/hash_kernels.id_half)."""
    rows = len(offsets[0]) if len(offsets) else 0
    parts, offs = _refs(partitions, rows), _refs(offsets, rows)
    hi_topics = np.array([fnv1a64(t) for t in topics], _UINT64)
    lo_topics = np.array([fnv1a64("\x01" + t) for t in topics], _UINT64)
    hi = hash_kernels.id_half(_UINT64(_FNV_OFFSET), hi_topics, _MIX, parts, offs)
    lo = hash_kernels.id_half(_UINT64(_LO_SEED), lo_topics, _FMIX, parts, offs)
    if window_start is None:
        return hi, lo
    start = np.asarray(window_start, np.int64).view(_UINT64)
    return mix(hi ^ start), fmix(lo ^ start)


def result_head(topics: Sequence[str], partitions: Sequence[np.ndarray], offsets: Sequence[np.ndarray],
                event_time: np.ndarray, now_ms: int, window_start: np.ndarray | None = None,
                window_ms: int = 0) -> dict[str, np.ndarray]:
    """The columns every result block starts with: id halves, event time T, produced_ms, and for
    a window join (`window_start` given; `window_ms` its instance size) the instance's start,
    which its id names too, and end."""
    hi, lo = result_ids(topics, partitions, offsets, window_start)
    head = {RESULT_ID_HI: hi, RESULT_ID_LO: lo, EVENT_TIME: np.asarray(event_time, np.int64),
            PRODUCED_MS: np.full(len(hi), now_ms, dtype=np.int64)}
    if window_start is None:
        return head
    start = np.asarray(window_start, np.int64)
    return head | {WINDOW_START: start, WINDOW_END: start + window_ms}


def result_id_hex(hi: np.ndarray, lo: np.ndarray) -> np.ndarray:
    """The ids as 32 lower-case hex digits each (NumPy bytes 'S32'), hi first."""
    both = np.stack([np.asarray(hi, _UINT64), np.asarray(lo, _UINT64)], axis=1).astype(">u8")
    nibbles = np.frombuffer(both.tobytes(), np.uint8).reshape(len(both), 16)
    digits = np.stack([_HEX[nibbles >> 4], _HEX[nibbles & 15]], axis=2).reshape(len(both), 32)
    return np.ascontiguousarray(digits).view("S32").reshape(len(both))


def parse_result_id_hex(text: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Inverse of `result_id_hex` for well-formed ids (32 hex digits each)."""
    raw = np.frombuffer(np.asarray(text, "S32").tobytes(), np.uint8).reshape(len(text), 32).astype(np.int64)
    values = np.where(raw >= ord("a"), raw - ord("a") + 10, raw - ord("0")).astype(_UINT64)
    weights = _UINT64(16) ** np.arange(15, -1, -1, dtype=_UINT64)
    with np.errstate(over="ignore"):
        hi = (values[:, :16] * weights).sum(axis=1, dtype=_UINT64)
        lo = (values[:, 16:] * weights).sum(axis=1, dtype=_UINT64)
    return hi, lo
