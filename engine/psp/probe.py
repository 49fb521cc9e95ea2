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
from typing import Protocol

import numpy as np

from streamjoin.engine.block import TS, Block, concat
from streamjoin.engine.predicates import Term, evaluate_isolated, terms_between
from streamjoin.engine.probe import expand_ranges
from streamjoin.engine.psp.plan import RingPlan, count_column, prefixed
from streamjoin.engine.psp.slices import GLOBAL_SEQ, STREAM_SEQ

TRIGGER_TS = "_T"  # the trigger's event time: the result's time T
MAX_PAIRS = 1 << 21


@dataclass
class ProbeFailures:
    """Rows whose UDF evaluation failed (their pairs count as no match), with
    the stream of their trigger, whose records the dead-letter topic gets."""

    entries: list[tuple[int, Block, str]] = field(default_factory=list)

    def add(self, trigger: int, rows: Block, detail: str) -> None:
        if len(rows):
            self.entries.append((trigger, rows, detail))


class Access(Protocol):
    """A state block with sorted indexes on its fields (a slice keeps them across rounds)."""

    @property
    def block(self) -> Block: ...

    def order(self, by: str) -> np.ndarray:
        """Positions of `block` in ascending order of field `by` (stable)."""

    def in_order(self, by: str, column: str) -> np.ndarray:
        """block[column][order(by)]."""


@dataclass
class PlainAccess:
    """Access to a bare block: sorts on demand."""

    block: Block
    _orders: dict[str, np.ndarray] = field(default_factory=dict)

    def order(self, by: str) -> np.ndarray:
        if by not in self._orders:
            self._orders[by] = np.argsort(self.block[by], kind="stable")
        return self._orders[by]

    def in_order(self, by: str, column: str) -> np.ndarray:
        return self.block[column][self.order(by)]


def extend(plan: RingPlan, rows: Block, trigger: int, members: frozenset[int], j: int, state: Block | Access,
           failures: ProbeFailures) -> Block:
    """Every (row, s) with s in `state` (stream j) that satisfies window, order and the terms now decidable."""
    access = PlainAccess(state) if isinstance(state, Block) else state
    block = access.block
    joined = members | {j}
    keep_cols = _columns_after(plan, rows, members, joined)
    if not len(rows) or not len(block):
        return _shape(plan, rows.take(np.empty(0, np.int64)), block, np.empty(0, np.int64), j, keep_cols, joined)
    terms = terms_between(plan.terms, j, members)
    lo, hi, index = _candidate_ranges(plan, rows, j, access, terms)
    # With a term index, the other cheap terms are checked first on columns kept in the
    # index's order: candidates are contiguous runs there, so those reads are sequential,
    # and only their few survivors are looked up at random for the window and the rest.
    early = [t for t in terms if t.kind != "udf" and t is not index] if index is not None else []
    late = [t for t in terms if not any(t is e for e in early)]
    parts = []
    for a, b in _chunks(hi - lo):
        if early and index is not None:
            owner, pos = _early_candidates(rows, a, b, lo[a:b], hi[a:b], j, early, access, index.side(j))
            pos = access.order(index.side(j))[pos]
        else:
            owner, pos = expand_ranges(lo[a:b], hi[a:b])
            owner += a
            if index is not None:
                pos = access.order(index.side(j))[pos]
        mask = _window_and_order(plan, rows, owner, j, block, pos)
        owner, pos = owner[mask], pos[mask]
        owner, pos = _apply_terms(rows, trigger, owner, j, block, pos, late, failures)
        parts.append(_shape(plan, rows, block, pos, j, keep_cols, joined, owner))
    return concat(parts)


def _early_candidates(rows: Block, a: int, b: int, lo: np.ndarray, hi: np.ndarray, j: int, early: list[Term],
                      access: Access, by: str) -> tuple[np.ndarray, np.ndarray]:
    """(row, position in `by`'s order) of rows a..b's candidate pairs that pass the `early` terms.

    The first term is checked on every candidate without building the pairs first: the
    candidates' positions are runs in `by`'s order (read sequentially from a column kept in
    that order) and each row's value is repeated along its run; rows are found only for the
    survivors, by where they fall in the runs."""
    counts = np.maximum(hi - lo, 0)
    ends = np.cumsum(counts)
    total = int(ends[-1]) if len(ends) else 0
    pos = np.repeat(lo - (ends - counts), counts) + np.arange(total, dtype=np.int64)
    first = early[0]
    other, other_field = first.other(j)
    mask = _pair_mask(first, j, access.in_order(by, first.side(j))[pos],
                      np.repeat(rows[prefixed(other, other_field)][a:b], counts))
    hit = np.flatnonzero(mask)
    owner = np.searchsorted(ends, hit, side="right") + a
    pos = pos[hit]
    for t in early[1:]:
        other, other_field = t.other(j)
        keep = _pair_mask(t, j, access.in_order(by, t.side(j))[pos], rows[prefixed(other, other_field)][owner])
        owner, pos = owner[keep], pos[keep]
    return owner, pos


def _pair_mask(t: Term, j: int, state_values: np.ndarray, row_values: np.ndarray) -> np.ndarray:
    """Term.evaluate for an equality or band term, minus its copies: a band is
    |float64(left) - float64(right)| <= within, the very same arithmetic."""
    left, right = (state_values, row_values) if t.left[0] == j else (row_values, state_values)
    if t.kind == "eq":
        return left == right
    diff = np.subtract(left, right, dtype=np.float64)
    np.abs(diff, out=diff)
    return diff <= t.within


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


def _candidate_ranges(plan: RingPlan, rows: Block, j: int, access: Access, terms: list[Term]
                      ) -> tuple[np.ndarray, np.ndarray, Term | None]:
    """Per row, [lo, hi) of its candidates in the tightest index: the window (positions in the
    block, index None) or an equality/band term (positions in that term's sorted order)."""
    s = plan.streams[j]
    state = access.block
    hi = np.searchsorted(state[GLOBAL_SEQ], rows[GLOBAL_SEQ], side="left")  # partners come before the trigger
    if s.rows_window:
        lo = np.searchsorted(state[STREAM_SEQ], rows[count_column(j)] - s.size, side="right")
    else:
        lo = np.searchsorted(state[TS], rows[TRIGGER_TS] - s.size, side="right")
    best: tuple[np.ndarray, np.ndarray, Term | None] = (lo, np.maximum(hi, lo), None)
    best_n = int((best[1] - best[0]).sum())
    for t in terms:
        if t.kind == "udf":
            continue
        other, other_field = t.other(j)
        values = access.in_order(t.side(j), t.side(j))
        probe = rows[prefixed(other, other_field)]
        if t.kind == "eq":
            lo2, hi2 = np.searchsorted(values, probe, "left"), np.searchsorted(values, probe, "right")
        else:
            lo2 = np.searchsorted(values, probe - t.within, "left")
            hi2 = np.searchsorted(values, probe + t.within, "right")
        n = int((hi2 - lo2).sum())
        if n < best_n:
            best, best_n = (lo2, hi2, t), n
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
    ok = state[GLOBAL_SEQ][pos] < rows[GLOBAL_SEQ][owner]
    if s.rows_window:
        ok &= rows[count_column(j)][owner] - state[STREAM_SEQ][pos] < s.size
    else:
        ok &= rows[TRIGGER_TS][owner] - state[TS][pos] < s.size
    return ok


def _apply_terms(rows: Block, trigger: int, owner: np.ndarray, j: int, state: Block, pos: np.ndarray,
                 terms: list[Term], failures: ProbeFailures) -> tuple[np.ndarray, np.ndarray]:
    for t in sorted(terms, key=lambda t: t.kind == "udf"):  # cheap terms first, UDFs on survivors
        if not len(owner):
            break
        other, other_field = t.other(j)
        values = {j: state[t.side(j)][pos], other: rows[prefixed(other, other_field)][owner]}
        if t.kind == "udf":
            mask, failed, detail = evaluate_isolated(t, values)
            if failed.any():
                failures.add(trigger, rows.take(np.unique(owner[failed])), detail)
        else:
            mask = t.evaluate(values)
        owner, pos = owner[mask], pos[mask]
    return owner, pos
