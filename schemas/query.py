"""Continuous queries (the CQL subset of the StreamReuse query service), as values.

A query is the windowed equi-join of its sources, each with its own RANGE
window, filtered by equality/IN selections on source columns and projected to
its SELECT list. `schemas/cql_parse.py` parses the text form and
`schemas/cql_validate.py` validates it; `topology/reuse/` plans which shared
operator answers it.

Semantics (the contract every sink topic is checked against): a combination
of one tuple per source, all equal on the join classes, with T = the newest
member's event time, is a result of the query when every member s_i satisfies
T - ts(s_i) < RANGE_i, every selection holds on its member, and
`start_ms <= T < end_ms` (the registration's barriers). SLIDE does not change
which results exist, only when they leave: a result with time T is released
at the query's next slide boundary, (T // slide + 1) * slide, once the
operator's watermark has passed it (no SLIDE: as soon as it is found).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Union

Literal_ = Union[int, float, str, bool]


@dataclass(frozen=True, order=True)
class Column:
    """A source column, `stream.field`."""

    stream: str
    field: str

    def __str__(self) -> str:
        return f"{self.stream}.{self.field}"


@dataclass(frozen=True, order=True)
class SourceWindow:
    """One FROM item: a stream with its RANGE (ms) and SLIDE (ms; None = release at once)."""

    stream: str
    range_ms: int
    slide_ms: int | None = None


@dataclass(frozen=True)
class Selection:
    """`column IN (values)`; an equality is a one-value IN list."""

    column: Column
    values: frozenset[Literal_]

    def sort_key(self) -> tuple[str, str]:
        return (self.column.stream, self.column.field)


@dataclass(frozen=True)
class Query:
    """A parsed, normalised query: `columns` in SELECT order, `windows` in FROM order,
    `joins` as sorted (left, right) column pairs with left < right, `selections` one per
    column sorted by column (two conditions on one column are intersected by the parser)."""

    columns: tuple[Column, ...]
    windows: tuple[SourceWindow, ...]
    joins: tuple[tuple[Column, Column], ...]
    selections: tuple[Selection, ...] = ()

    @property
    def sources(self) -> frozenset[str]:
        return frozenset(w.stream for w in self.windows)

    @property
    def slide_ms(self) -> int | None:
        """The release period: the gcd of the sources' SLIDEs (None when none has one)."""
        slides = [w.slide_ms for w in self.windows if w.slide_ms]
        return math.gcd(*slides) if slides else None

    @property
    def join_classes(self) -> frozenset[frozenset[Column]]:
        """The equality classes the join predicates make (union-find over `joins`)."""
        parent: dict[Column, Column] = {}

        def root(c: Column) -> Column:
            while parent.setdefault(c, c) != c:
                c = parent[c]
            return c

        for left, right in self.joins:
            parent[root(left)] = root(right)
        classes: dict[Column, set[Column]] = {}
        for c in list(parent):
            classes.setdefault(root(c), set()).add(c)
        return frozenset(frozenset(members) for members in classes.values())


@dataclass(frozen=True)
class Registration:
    """A query as registered: its id, text, parsed form and metadata.

    `sink`: the Kafka topic its results go to; `region`: where the sink is; `lifetime_ms`:
    how long it runs (None = until dropped); `start_ms`/`end_ms`: the event-time barriers
    its results lie between (end None while it runs)."""

    id: str
    text: str
    query: Query
    sink: str
    region: str
    lifetime_ms: int | None
    registered_ms: int
    start_ms: int
    end_ms: int | None = None
