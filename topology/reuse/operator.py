"""Shared join operators and their relaxation (the StreamReuse paper, sections 3 and 3.1).

An operator is one hash-mode streamjoin job. It reads its sources' whole Kafka
topics, keeps the tuples that pass its selection cover (pushed down as each
stream's `StreamSpec.where`: cascading relaxation, the paper's section 3.1 step 5),
decodes only its projected fields, joins all sources on one composite key (one
column of each source per join class) with RANGE windows `T - ts_i < range_i`,
and emits result blocks whose columns are `event_time`, and per stream
`<s>.ts`, `<s>.partition`, `<s>.offset` and `<s>.<field>` for its projected
fields. Each query on it is answered by compensation (compensation.py) over
those blocks.

Relaxation rules (minimal, the paper's section 3.1 steps 1-4):
  selection cover  per column: the union of the value sets where both sides
                   constrain the column; dropped where only one does (an
                   IN-list cover is conjunctive per column, so this is the
                   least cover of both);
  projection       the union of SELECT lists, plus every selection column whose
                   condition the cover no longer enforces identically (the
                   compensation must evaluate it), plus the join class columns
                   (each stream's key);
  window           per stream the larger RANGE; the slide is the gcd of the
                   slides (the OR of `t mod s_i = 0` conditions, on a common
                   grid), None (release at once) when any query releases at once;
  lifetime         the latest expiry, None when any query runs until dropped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from streamjoin.schemas.query import Column, Literal_, Query, Registration, Selection

JoinClasses = frozenset[frozenset[Column]]


class OperatorError(ValueError):
    """A query that does not fit a shared operator (or two that do not share one); says why."""


@dataclass(frozen=True)
class OperatorDef:
    """One shared operator's definition: what its hash-mode job computes and where it runs.

    `sources` sorted; `join_classes` the equality classes (one column of each source per
    class); `selections` the conjunctive cover, one per column, sorted by column;
    `columns` the sorted projection; `range_ms` per stream (sorted) the RANGE it keeps;
    `slide_ms` its release period (None = at once); `expires_ms` when its last query
    ends (None = some query runs until dropped); `region` where it is placed."""

    sources: tuple[str, ...]
    join_classes: JoinClasses
    selections: tuple[Selection, ...]
    columns: tuple[Column, ...]
    range_ms: tuple[tuple[str, int], ...]
    slide_ms: int | None
    expires_ms: int | None
    region: str

    def ordered_classes(self) -> list[tuple[Column, ...]]:
        """The join classes, each as its sorted columns, in sorted order: key position i of
        every stream belongs to class i."""
        return sorted(tuple(sorted(members)) for members in self.join_classes)

    def key_fields(self, stream: str) -> list[str]:
        """`stream`'s join key: its column of each join class, classes in `ordered_classes` order."""
        return [next(c.field for c in members if c.stream == stream) for members in self.ordered_classes()]

    def fields_of(self, stream: str) -> list[str]:
        """The projected fields of `stream` (sorted), the only ones its job decodes."""
        return [c.field for c in self.columns if c.stream == stream]

    def range_of(self, stream: str) -> int:
        """The RANGE (ms) the operator keeps for `stream`."""
        return dict(self.range_ms)[stream]

    def cover(self) -> dict[Column, frozenset[Literal_]]:
        """The selection cover as column -> allowed values."""
        return {s.column: s.values for s in self.selections}

    def where(self, stream: str) -> dict[str, list[Literal_]]:
        """`stream`'s part of the cover in `StreamSpec.where` form (field -> sorted values)."""
        return {s.column.field: sorted_values(s.values) for s in self.selections if s.column.stream == stream}

    def to_json(self) -> dict[str, object]:
        """The definition as JSON-able values (for explain and the registry)."""
        return {
            "sources": list(self.sources),
            "join_classes": [[str(c) for c in members] for members in self.ordered_classes()],
            "selections": {str(s.column): sorted_values(s.values) for s in self.selections},
            "columns": [str(c) for c in self.columns],
            "range_ms": dict(self.range_ms),
            "slide_ms": self.slide_ms,
            "expires_ms": self.expires_ms,
            "region": self.region,
        }


def sorted_values(values: Iterable[Literal_]) -> list[Literal_]:
    """IN-list values in a stable order, whatever their types (type name first, then value)."""
    return sorted(values, key=lambda v: (type(v).__name__, v))


def selection_map(selections: Iterable[Selection]) -> dict[Column, frozenset[Literal_]]:
    """Column -> allowed values; two selections on one column are ANDed (their values intersected)."""
    allowed: dict[Column, frozenset[Literal_]] = {}
    for selection in selections:
        previous = allowed.get(selection.column)
        allowed[selection.column] = selection.values if previous is None else previous & selection.values
    return allowed


def _selections(allowed: Mapping[Column, frozenset[Literal_]]) -> tuple[Selection, ...]:
    return tuple(Selection(column, allowed[column]) for column in sorted(allowed))


def _query(query_or_reg: Query | Registration) -> Query:
    return query_or_reg.query if isinstance(query_or_reg, Registration) else query_or_reg


def expiry(reg: Registration) -> int | None:
    """When `reg` ends (registered + lifetime), None when it runs until dropped."""
    return None if reg.lifetime_ms is None else reg.registered_ms + reg.lifetime_ms


def _check_fits(query: Query, classes: JoinClasses) -> None:
    """Raise OperatorError unless hash mode can run `query` (join classes `classes`): at
    least one join class, each with exactly one column of every source, and every column
    and selection on a source."""
    sources = query.sources
    if len(sources) != len(query.windows):
        raise OperatorError("a stream appears twice in FROM")
    if not classes:
        raise OperatorError("the sources share no join predicate")
    for members in classes:
        streams = sorted(c.stream for c in members)
        if streams != sorted(sources):
            names = ", ".join(sorted(str(c) for c in members))
            raise OperatorError(f"join class {{{names}}} must hold exactly one column of each of {sorted(sources)}")
    outside = [str(c) for c in query.columns if c.stream not in sources]
    outside += [str(s.column) for s in query.selections if s.column.stream not in sources]
    if outside:
        raise OperatorError(f"columns {outside} name streams that are not in FROM {sorted(sources)}")
    empty = [str(s.column) for s in query.selections if not s.values]
    if empty:
        raise OperatorError(f"selections on {empty} allow no value")
    bad = [w.stream for w in query.windows if w.range_ms <= 0 or (w.slide_ms is not None and w.slide_ms <= 0)]
    if bad:
        raise OperatorError(f"RANGE and SLIDE must be positive, not for {bad}")


def join_columns(classes: JoinClasses) -> set[Column]:
    """Every column of every join class (each stream's key fields)."""
    return {c for members in classes for c in members}


def compensation_columns(query: Query, cover: Mapping[Column, frozenset[Literal_]]) -> set[Column]:
    """The selection columns of `query` whose condition `cover` does not enforce identically:
    its compensation must read them."""
    return {column for column, values in selection_map(query.selections).items() if cover.get(column) != values}


def needed_columns(query: Query, cover: Mapping[Column, frozenset[Literal_]],
                   classes: JoinClasses | None = None) -> set[Column]:
    """What an operator with `cover` must project to answer `query`: its SELECT list, its
    compensation columns and the join class columns (`classes`: the query's join classes,
    when the caller has them already)."""
    classes = query.join_classes if classes is None else classes
    return set(query.columns) | compensation_columns(query, cover) | join_columns(classes)


def for_query(reg: Registration, region: str) -> OperatorDef:
    """A fresh operator computing exactly `reg`'s query, placed in `region`.

    Raises OperatorError when hash mode cannot run the query (see `_check_fits`)."""
    query = reg.query
    classes = query.join_classes
    _check_fits(query, classes)
    cover = selection_map(query.selections)
    return OperatorDef(
        sources=tuple(sorted(query.sources)),
        join_classes=classes,
        selections=_selections(cover),
        columns=tuple(sorted(needed_columns(query, cover, classes))),
        range_ms=tuple(sorted((w.stream, w.range_ms) for w in query.windows)),
        slide_ms=query.slide_ms,
        expires_ms=expiry(reg),
        region=region,
    )


def base_match(op: OperatorDef, query: Query | Registration) -> bool:
    """The StreamReuse paper's base conditions: the same sources and identical join classes (group-by
    containment holds trivially: our subset has no group-by)."""
    query = _query(query)
    return op.sources == tuple(sorted(query.sources)) and op.join_classes == query.join_classes


def cover_implied(cover: Mapping[Column, frozenset[Literal_]], query: Query) -> bool:
    """True when every tuple passing `query`'s selections passes `cover`."""
    allowed = selection_map(query.selections)
    return all(column in allowed and allowed[column] <= values for column, values in cover.items())


def window_contains(op: OperatorDef, query: Query) -> bool:
    """True when `op` keeps at least `query`'s RANGE on every stream and releases on a grid
    the query's slide lies on (None releases at once, which serves every slide)."""
    return windows_contain(op.range_ms, op.slide_ms, query)


def windows_contain(range_ms: tuple[tuple[str, int], ...], slide_ms: int | None, query: Query) -> bool:
    """`window_contains` on an operator's window part: per stream RANGEs and its slide."""
    ranges = dict(range_ms)
    if any(ranges.get(w.stream, -1) < w.range_ms for w in query.windows):
        return False
    return slide_serves(slide_ms, query.slide_ms)


def slide_serves(op_slide: int | None, query_slide: int | None) -> bool:
    """True when results released every `op_slide` reach a query releasing every `query_slide` in time."""
    if op_slide is None:
        return True
    return query_slide is not None and query_slide % op_slide == 0


def lifetime_covers(expires_ms: int | None, reg: Registration) -> bool:
    """True when an operator expiring at `expires_ms` outlives `reg`."""
    if expires_ms is None:
        return True
    wanted = expiry(reg)
    return wanted is not None and wanted <= expires_ms


def answers(op: OperatorDef, reg: Registration | Query) -> bool:
    """True when `op` answers the query without change (reuse by containment): base match,
    its cover implied by the query's selections, its projection holding what the query and
    its compensation read, its windows containing the query's and (for a Registration; a bare
    Query has no lifetime) its lifetime covering the query's."""
    query = _query(reg)
    if not base_match(op, query):
        return False
    cover = op.cover()
    if not cover_implied(cover, query) or not needed_columns(query, cover, op.join_classes) <= set(op.columns):
        return False
    if not window_contains(op, query):
        return False
    return not isinstance(reg, Registration) or lifetime_covers(op.expires_ms, reg)


def relaxed_cover(cover: Mapping[Column, frozenset[Literal_]], query: Query) -> dict[Column, frozenset[Literal_]]:
    """The least conjunctive cover of `cover` and `query`'s selections: per column both
    constrain, the union of their values."""
    other = selection_map(query.selections)
    return {column: values | other[column] for column, values in cover.items() if column in other}


def relaxed_ranges(op: OperatorDef, query: Query) -> dict[str, int]:
    """Per stream the larger of `op`'s and `query`'s RANGE."""
    ranges = dict(op.range_ms)
    for window in query.windows:
        ranges[window.stream] = max(ranges[window.stream], window.range_ms)
    return ranges


def _merge_slides(a: int | None, b: int | None) -> int | None:
    return None if a is None or b is None else math.gcd(a, b)


def later(a: int | None, b: int | None) -> int | None:
    """The later of two expiries, None (never) beating any time: the relaxed lifetime."""
    return None if a is None or b is None else max(a, b)


def relax(op: OperatorDef, reg: Registration) -> OperatorDef:
    """The minimal relaxation of `op` under `reg` (module docstring), in `op`'s region.

    Raises OperatorError when the base conditions fail or the query does not fit."""
    query = reg.query
    classes = query.join_classes  # a union-find over the predicates: worked out once here
    _check_fits(query, classes)
    if op.join_classes != classes or op.sources != tuple(sorted(query.sources)):
        raise OperatorError("the operator and the query differ in sources or join predicates")
    old_cover = op.cover()
    cover = relaxed_cover(old_cover, query)
    # The existing queries' conditions on a column whose cover changed now need compensation.
    changed = {column for column, values in old_cover.items() if cover.get(column) != values}
    return OperatorDef(
        sources=op.sources,
        join_classes=op.join_classes,
        selections=_selections(cover),
        columns=tuple(sorted(set(op.columns) | changed | needed_columns(query, cover, classes))),
        range_ms=tuple(sorted(relaxed_ranges(op, query).items())),
        slide_ms=_merge_slides(op.slide_ms, query.slide_ms),
        expires_ms=later(op.expires_ms, expiry(reg)),
        region=op.region,
    )


def fold(regs: Sequence[Registration], region: str) -> OperatorDef:
    """The minimal operator answering every registration in `regs` (all sharing sources and
    join classes), placed in `region`: what an operator narrows to when a query leaves.

    Equal to relaxing `for_query(regs[0])` by the others in any order. Raises OperatorError
    on an empty or mixed set."""
    if not regs:
        raise OperatorError("folding needs at least one query")
    op = for_query(regs[0], region)
    for reg in regs[1:]:
        op = relax(op, reg)
    return op
