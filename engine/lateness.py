"""Which tuples of a batch are late, in an order that does not depend on batch size.

A group's watermark moves between batches, so judging a batch only by the watermark at its
start lets a record far behind every other through whenever it shares a batch with the
records that moved time on: a job started on a backlog reads a group's whole input in one
batch, where nothing would be late. So each tuple is judged by the watermark at the moment
it is read in a canonical order of the batch: its (stream, source partition) sequences,
each in offset order, merged by head event time (Kafka Streams picks the partition with the
lowest head timestamp the same way). The order depends only on what the batch holds, so a
replayed batch decides the same. In it, a tuple is late when it is older than the minimum
over the non-idle streams of the newest event time read before it, minus the allowed
lateness: a record is late only when it is that far behind its own source partition's
earlier records and every other stream has moved on as far.
"""

from __future__ import annotations

import numpy as np

from streamjoin.engine.block import OFF, PART, TS, Block
from streamjoin.engine.jit import kernel

NO_TIME = np.iinfo(np.int64).min // 4  # "no watermark yet"; headroom so arithmetic cannot wrap


def late_in_batch(deltas: list[Block], newest: list[int], idle: frozenset[int], lateness_ms: int) -> list[np.ndarray]:
    """Per stream, a mask of `deltas[i]`'s tuples read after time moved past them.

    deltas: per stream, the batch's tuples (any order); newest: per stream, the newest event
    time accepted before this batch (NO_TIME: none); idle: streams left out of the minimum."""
    live = [i for i in range(len(deltas)) if i not in idle]
    masks = [np.zeros(len(d), bool) for d in deltas]
    if not live:
        return masks
    # The watermark after the whole batch bounds every tuple's: a batch none of whose tuples
    # is behind it (the usual case, in order) needs no merge.
    tops = [max(newest[i], int(d[TS].max()) if len(d) else NO_TIME) for i, d in enumerate(deltas)]
    bound = min(tops[i] for i in live)
    if bound <= NO_TIME or not any(len(d) and int(d[TS].min()) < bound - lateness_ms for d in deltas):
        return masks
    stream = np.concatenate([np.full(len(d), i, np.int64) for i, d in enumerate(deltas)])
    part = np.concatenate([d[PART].astype(np.int64) for d in deltas])
    off = np.concatenate([d[OFF] for d in deltas])
    ts = np.concatenate([d[TS] for d in deltas])
    order = np.lexsort((off, part, stream))  # each (stream, partition) sequence in offset order
    s, p = stream[order], part[order]
    starts = np.flatnonzero(np.r_[True, (s[1:] != s[:-1]) | (p[1:] != p[:-1])])
    late_sorted = _merge_late(ts[order], s, starts, np.asarray(newest, np.int64),
                              np.array([i in idle for i in range(len(deltas))]), lateness_ms)
    late = np.empty(len(ts), bool)
    late[order] = late_sorted
    bounds = np.cumsum([0] + [len(d) for d in deltas])
    return [late[bounds[i]:bounds[i + 1]] for i in range(len(deltas))]


@kernel
def _merge_late(ts: np.ndarray, stream: np.ndarray, starts: np.ndarray, newest: np.ndarray, idle: np.ndarray,
                lateness_ms: int) -> np.ndarray:
    """Merge the sequences (ts[starts[k]:starts[k+1]], each of one stream) by head event time,
    lowest first (ties: the earlier sequence), and flag each tuple older than the watermark
    when it is read."""
    n, k = len(ts), len(starts)
    ends = np.empty(k, np.int64)
    ends[:-1] = starts[1:]
    ends[-1] = n
    head = starts.copy()
    top = newest.copy()
    late = np.zeros(n, np.bool_)
    for _ in range(n):
        pick = -1
        for q in range(k):
            if head[q] < ends[q] and (pick < 0 or ts[head[q]] < ts[head[pick]]):
                pick = q
        at = head[pick]
        head[pick] += 1
        low = np.iinfo(np.int64).max
        for i in range(len(top)):
            if not idle[i] and top[i] < low:
                low = top[i]
        if low > NO_TIME and ts[at] < low - lateness_ms:
            late[at] = True
        elif ts[at] > top[stream[at]]:
            top[stream[at]] = ts[at]
    return late
