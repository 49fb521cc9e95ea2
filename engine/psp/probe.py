"""Vectorised theta probing: a block of partial results (or fresh triggers)
against one node's slice of the next stream in their join order.

Candidates come from whichever index is tighter: the window itself (a slice
sorted by global sequence makes each row's window a contiguous range) or a
sorted copy on an equality/band term's field (a range per row). Remaining
conditions filter the candidate pairs; UDF terms run last, on survivors only.
Nothing loops over tuples in Python; rows are cut into chunks so a probe never
materialises more than `MAX_PAIRS` candidate pairs at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from engine.block import TS, Block, concat
from engine.predicates import Term, UdfFailure, terms_between
from engine.probe import expand_ranges
from engine.psp.plan import RingPlan, count_column, prefixed
from engine.psp.slices import G, SSEQ

T_COL = "_T"  # the trigger's event time: the result's time T
MAX_PAIRS = 1 << 21


@dataclass
class ProbeFailures:
    """Rows whose UDF evaluation failed (their pairs count as no match), with
    the stream of their trigger, whose records the dead-letter topic gets."""

    entries: list[tuple[int, Block, str]] = field(default_factory=list)

    def add(self, trigger: int, rows: Block, detail: str) -> None:
        if len(rows):
            self.entries.append((trigger, rows, detail))


OrderOf = Callable[[str], np.ndarray]


def extend(plan: RingPlan, rows: Block, trigger: int, members: frozenset[int], j: int, state: Block,
           failures: ProbeFailures, order_of: OrderOf | None = None) -> Block:
    """Every (row, s) with s in `state` (stream j) that satisfies window, order and the terms now decidable.
    `order_of(field)` gives `state`'s positions sorted by a field (cached by the caller when it can)."""
    joined = members | {j}
    keep_cols = _columns_after(plan, rows, members, joined)
    if not len(rows) or not len(state):
        return _shape(plan, rows.take(np.empty(0, np.int64)), state, np.empty(0, np.int64), j, keep_cols, joined)
    terms = terms_between(plan.terms, j, members)
    sort = order_of or (lambda f: np.argsort(state[f], kind="stable"))
    lo, hi, order = _candidate_ranges(plan, rows, j, state, terms, sort)
    parts = []
    for a, b in _chunks(hi - lo):
        owner, pos = expand_ranges(lo[a:b], hi[a:b])
        owner += a
        if order is not None:
            pos = order[pos]
        mask = _window_and_order(plan, rows, owner, j, state, pos)
        owner, pos = owner[mask], pos[mask]
        owner, pos = _apply_terms(rows, trigger, owner, j, state, pos, terms, failures)
        parts.append(_shape(plan, rows, state, pos, j, keep_cols, joined, owner))
    return concat(parts)


def _columns_after(plan: RingPlan, rows: Block, members: frozenset[int], joined: frozenset[int]) -> list[str]:
    trigger_cols = [c for c in rows.names if not c[0].isdigit()]
    kept = [prefixed(i, c) for i in sorted(members) for c in plan.member_columns(i, joined)]
    return trigger_cols + kept


def _shape(plan: RingPlan, rows: Block, state: Block, pos: np.ndarray, j: int, keep_cols: list[str],
           joined: frozenset[int], owner: np.ndarray | None = None) -> Block:
    picked = rows if owner is None else rows.take(owner)
    cols = {c: picked[c] for c in keep_cols}
    for c in plan.member_columns(j, joined):
        cols[prefixed(j, c)] = state[c][pos]
    return Block(cols)


def _candidate_ranges(plan: RingPlan, rows: Block, j: int, state: Block, terms: list[Term],
                      sort: OrderOf) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    s = plan.streams[j]
    hi = np.searchsorted(state[G], rows[G], side="left")  # partners come before the trigger
    if s.rows_window:
        lo = np.searchsorted(state[SSEQ], rows[count_column(j)] - s.size, side="right")
    else:
        lo = np.searchsorted(state[TS], rows[T_COL] - s.size, side="right")
    best = (lo, np.maximum(hi, lo), None)
    best_n = int((best[1] - best[0]).sum())
    for t in terms:
        if t.kind == "udf":
            continue
        other, other_field = t.other(j)
        order = sort(t.side(j))
        values = state[t.side(j)][order]
        probe = rows[prefixed(other, other_field)]
        if t.kind == "eq":
            lo2, hi2 = np.searchsorted(values, probe, "left"), np.searchsorted(values, probe, "right")
        else:
            lo2 = np.searchsorted(values, probe - t.within, "left")
            hi2 = np.searchsorted(values, probe + t.within, "right")
        n = int((hi2 - lo2).sum())
        if n < best_n:
            best, best_n = (lo2, hi2, order), n
    return best


def _chunks(counts: np.ndarray) -> list[tuple[int, int]]:
    """Row ranges whose candidate pairs stay under MAX_PAIRS (a single huge row is its own chunk)."""
    if not len(counts):
        return []
    ends = np.cumsum(counts)
    out, start, base = [], 0, 0
    while start < len(counts):
        stop = int(np.searchsorted(ends, base + MAX_PAIRS, side="right"))
        stop = max(stop, start + 1)
        out.append((start, stop))
        base, start = int(ends[stop - 1]), stop
    return out


def _window_and_order(plan: RingPlan, rows: Block, owner: np.ndarray, j: int, state: Block,
                      pos: np.ndarray) -> np.ndarray:
    s = plan.streams[j]
    ok = state[G][pos] < rows[G][owner]
    if s.rows_window:
        ok &= rows[count_column(j)][owner] - state[SSEQ][pos] < s.size
    else:
        ok &= rows[T_COL][owner] - state[TS][pos] < s.size
    return ok


def _apply_terms(rows: Block, trigger: int, owner: np.ndarray, j: int, state: Block, pos: np.ndarray,
                 terms: list[Term], failures: ProbeFailures) -> tuple[np.ndarray, np.ndarray]:
    for t in sorted(terms, key=lambda t: t.kind == "udf"):  # cheap terms first, UDFs on survivors
        if not len(owner):
            break
        other, other_field = t.other(j)
        values = {j: state[t.side(j)][pos], other: rows[prefixed(other, other_field)][owner]}
        if t.kind == "udf":
            mask, failed, detail = _udf_isolated(t, values)
            if failed.any():
                failures.add(trigger, rows.take(np.unique(owner[failed])), detail)
        else:
            mask = t.evaluate(values)
        owner, pos = owner[mask], pos[mask]
    return owner, pos


def _udf_isolated(term: Term, values: dict[int, np.ndarray]) -> tuple[np.ndarray, np.ndarray, str]:
    """Evaluate a UDF; where it raises, bisect down to the pairs it raises on, so a
    pair fails exactly when the UDF fails on it alone (the error path only: a
    healthy UDF is one call). A wrong-shaped answer fails the whole call."""
    n = len(next(iter(values.values())))
    mask, failed = np.zeros(n, bool), np.zeros(n, bool)
    detail = [""]

    def run(lo: int, hi: int) -> None:
        try:
            mask[lo:hi] = term.evaluate({k: v[lo:hi] for k, v in values.items()})
            return
        except UdfFailure as e:
            detail[0] = detail[0] or str(e)
            if hi - lo == 1 or e.systematic:
                failed[lo:hi] = True
                return
        mid = (lo + hi) // 2
        run(lo, mid)
        run(mid, hi)

    run(0, n)
    return mask, failed, detail[0]
