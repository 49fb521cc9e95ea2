"""Clean-up of a spilled generation (deferred spill, after the spill paper,
section 4.2).

A group pushed to disk in deferred mode leaves its window behind as a
*generation*; new tuples start a new one in memory and are joined only with
it. Each combination whose members all come from one generation was produced
at run time; the others are missing. The paper merges generations with the
incremental view-maintenance formula (its equation 1): taking generation j as
the increment D and the later generations as the base S,

    R_j = sum_i  D_i x (S_l + D_l)_{l<i} x (S_l)_{l>i}

counts every combination with at least one member in j and none older than j
exactly once; dropping the all-j ones leaves the missing results whose oldest
generation is j. Generation j is cleaned once no tuple can still arrive that
joins it (the watermark has passed its newest tuple plus the longest window),
oldest generation first, so every combination that spans generations is
produced exactly once, by the clean-up of its oldest member's generation,
with the same result id it would have had at run time.
"""

from __future__ import annotations

import numpy as np

from streamjoin.engine.block import Block, concat
from streamjoin.engine.probe import sort_by_key_time
from streamjoin.engine.window_join import JoinPlan, assemble, no_combos, probe_all


def generation_of(block_seqs: np.ndarray, starts: list[int]) -> np.ndarray:
    """The generation index of each tuple: `block_seqs` the batch each came in, `starts` the
    first batch of each generation, ascending (a batch before the first counts as generation 0)."""
    return np.maximum(np.searchsorted(np.asarray(starts, np.int64), block_seqs, side="right") - 1, 0)


def cleanup_results(plan: JoinPlan, streams: list[Block], generations: list[np.ndarray], generation: int,
                    now_ms: int) -> Block:
    """The results missing because generation `generation` was spilled (RANGE windows only).

    `streams`: per stream, every stored tuple of generation `generation` and of the later ones
    that may still join it (expired ones included); `generations`: per stream, each tuple's
    generation index; `now_ms`: stamped on the results as their production time."""
    tagged = [Block(dict(b.columns) | {GENERATION: g.astype(np.int64)}) for b, g in zip(streams, generations)]
    delta = [sort_by_key_time(b.filter(b[GENERATION] == generation)) for b in tagged]
    later = [sort_by_key_time(b.filter(b[GENERATION] > generation)) for b in tagged]
    both = [sort_by_key_time(b.filter(b[GENERATION] >= generation)) for b in tagged]
    parts = []
    for i in range(len(plan.streams)):
        if not len(delta[i]):
            continue
        sources = [delta[i] if l == i else both[l] if l < i else later[l] for l in range(len(plan.streams))]
        combos = probe_all(plan, sources, i)
        spans = np.zeros(len(combos[i]), dtype=bool)  # some member is not of the cleaned generation
        for l, idx in combos.items():
            spans |= sources[l][GENERATION][idx] != generation
        parts.append(assemble(plan, sources, {l: idx[spans] for l, idx in combos.items()}, now_ms))
    return concat(parts) if parts else assemble(plan, tagged, no_combos(plan), now_ms)


GENERATION = "_gen"  # column: the generation a tuple belongs to (only inside a clean-up)
