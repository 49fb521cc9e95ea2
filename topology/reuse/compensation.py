"""Compensation operators (the StreamReuse paper, section 3.1): what turns a shared operator's result
blocks back into one query's results.

Per query, over a whole block with NumPy: its selections the operator's cover does not
already enforce identically (`np.isin` on `<s>.<field>`), its RANGE on each stream where
the operator keeps a wider one (`event_time - <s>.ts < range`), its barriers
(`start_ms <= event_time < end_ms`), then its projection (the SELECT list) and its slide
(a result with time T is released at `(T // slide + 1) * slide`, at once without one).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np

from streamjoin.schemas.query import Column, Literal_, Registration, Selection
from streamjoin.topology.reuse.operator import OperatorDef, base_match, sorted_values


class CompensationError(KeyError):
    """A result block lacks a column the compensation reads; says which."""


@dataclass(frozen=True)
class Compensation:
    """One query's compensation on its operator: `selections` still to apply, `columns` its
    SELECT list, `range_ms` per stream (sorted) its RANGE where the operator's is wider,
    `slide_ms` its release period (None = at once)."""

    selections: tuple[Selection, ...]
    columns: tuple[Column, ...]
    range_ms: tuple[tuple[str, int], ...]
    slide_ms: int | None

    def to_json(self) -> dict[str, object]:
        """The compensation as JSON-able values (for explain)."""
        return {
            "selections": {str(s.column): sorted_values(s.values) for s in self.selections},
            "columns": [str(c) for c in self.columns],
            "range_ms": dict(self.range_ms),
            "slide_ms": self.slide_ms,
        }


def compensation(op: OperatorDef, reg: Registration) -> Compensation:
    """The compensation that computes `reg`'s query from `op`'s results.

    Raises ValueError when `op` does not match the query's sources and join classes."""
    query = reg.query
    if not base_match(op, query):
        raise ValueError(f"query {reg.id!r} does not share the operator's sources and join predicates")
    cover = op.cover()
    kept = sorted((s for s in query.selections if cover.get(s.column) != s.values), key=Selection.sort_key)
    wider = sorted((w.stream, w.range_ms) for w in query.windows if op.range_of(w.stream) > w.range_ms)
    return Compensation(selections=tuple(kept), columns=query.columns, range_ms=tuple(wider),
                        slide_ms=query.slide_ms)


def _column(columns: Mapping[str, np.ndarray], name: str) -> np.ndarray:
    try:
        return np.asarray(columns[name])
    except KeyError:
        raise CompensationError(f"the result block has no column {name!r}") from None


def _compatible(values: np.ndarray, allowed: frozenset[Literal_]) -> list[Literal_]:
    """The IN-list values that can equal an element of `values` (numbers for a numeric
    column, strings for a text one); mixing them in one array would turn 1 into "1"."""
    if values.dtype.kind in "iufb":
        return [v for v in allowed if isinstance(v, (int, float))]
    if values.dtype.kind in "US":
        return [v for v in allowed if isinstance(v, str)]
    return list(allowed)


def _member_mask(values: np.ndarray, allowed: frozenset[Literal_]) -> np.ndarray:
    """`values IN allowed`, elementwise over the whole column."""
    compatible = _compatible(values, allowed)
    if values.dtype.kind != "O":
        return np.isin(values, np.asarray(compatible)) if compatible else np.zeros(len(values), dtype=bool)
    # np.isin sorts object arrays, which fails on mixed types; IN-lists are short, so compare per value.
    mask = np.zeros(len(values), dtype=bool)
    for value in compatible:
        mask |= values == value
    return mask


def compensation_mask(columns: Mapping[str, np.ndarray], comp: Compensation, start_ms: int,
                      end_ms: int | None) -> np.ndarray:
    """Which rows of an operator's result block are results of the query.

    columns: the block's columns by name (`event_time`, `<s>.ts`, `<s>.<field>`, ...),
    all of one length; comp: the query's compensation; start_ms/end_ms: its barriers
    (end None while it runs). Raises CompensationError naming a missing column."""
    event_time = _column(columns, "event_time").astype(np.int64, copy=False)
    mask = event_time >= start_ms
    if end_ms is not None:
        mask &= event_time < end_ms
    for stream, range_ms in comp.range_ms:
        mask &= (event_time - _column(columns, f"{stream}.ts").astype(np.int64, copy=False)) < range_ms
    for selection in comp.selections:
        mask &= _member_mask(_column(columns, str(selection.column)), selection.values)
    return mask


def release_ms(event_time: np.ndarray, slide_ms: int | None) -> np.ndarray:
    """When each result leaves: the next slide boundary after its time T,
    `(T // slide + 1) * slide`, or T itself when the query has no slide."""
    times = np.asarray(event_time, dtype=np.int64)
    if slide_ms is None:
        return times.copy()
    return (times // slide_ms + 1) * slide_ms
