"""The canonical text of a continuous query (`to_cql`), which parses back to the
same query (schemas/cql_parse.py), and the text of its names, literals and
durations, which the parser's and validator's messages quote too.
"""

from __future__ import annotations

import math
import re

from streamjoin.schemas.cql_errors import QueryError
from streamjoin.schemas.query import Column, Literal_, Query, Selection, SourceWindow

__all__ = ["INT64_BOUND", "to_cql", "name_text", "duration_text", "literal_text", "literal_kind", "comparable_kind"]

INT64_BOUND = 1 << 63  # integer literals are int64
# The grammar's reserved words: a name equal to one of them (any case) is printed quoted.
_KEYWORDS = frozenset({"select", "from", "where", "and", "as", "in", "range", "slide", "true", "false"})
_PLAIN_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_PRINTED_UNITS = (("H", 3_600_000), ("MIN", 60_000), ("S", 1000))


def literal_kind(value: object) -> str:
    """integer, decimal, string, boolean, or unsupported (a hand-built query's stray value)."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "decimal"
    return "string" if isinstance(value, str) else "unsupported"


def comparable_kind(value: object) -> str:
    """Integers and decimals compare with each other; nothing else mixes."""
    kind = literal_kind(value)
    return "number" if kind in ("integer", "decimal") else kind


def name_text(name: str) -> str:
    """A stream or field name as the language writes it: plain, or double-quoted."""
    if _PLAIN_NAME.fullmatch(name) and name.lower() not in _KEYWORDS:
        return name
    if not name or "\x00" in name:
        raise QueryError(f"{name!r} cannot be written as a CQL name")
    return '"' + name.replace('"', '""') + '"'


def _column_text(column: Column) -> str:
    return f"{name_text(column.stream)}.{name_text(column.field)}"


def duration_text(ms: int) -> str:
    """`ms` in the largest unit that holds it exactly."""
    return next((f"{ms // size} {unit}" for unit, size in _PRINTED_UNITS if ms % size == 0), f"{ms} MS")


def literal_text(value: object) -> str:
    """A literal as the language writes it (reads back as the same value and kind)."""
    kind = literal_kind(value)
    if kind == "boolean":
        return "TRUE" if value else "FALSE"
    if kind == "integer" and -INT64_BOUND <= value < INT64_BOUND:
        return str(value)
    if kind == "decimal" and math.isfinite(value):
        return repr(value)  # always holds '.' or 'e', so it reads back as a decimal
    if kind == "string" and "\x00" not in value:
        return "'" + value.replace("'", "''") + "'"
    raise QueryError(f"{value!r} cannot be written as a CQL literal")


def _literal_order(value: Literal_) -> tuple[str, Literal_]:
    return (comparable_kind(value), value)


def _selection_text(selection: Selection) -> str:
    values = [literal_text(value) for value in sorted(selection.values, key=_literal_order)]
    column = _column_text(selection.column)
    return f"{column} = {values[0]}" if len(values) == 1 else f"{column} IN ({', '.join(values)})"


def _window_text(window: SourceWindow) -> str:
    slide = f" SLIDE {duration_text(window.slide_ms)}" if window.slide_ms is not None else ""
    return f"{name_text(window.stream)} [RANGE {duration_text(window.range_ms)}{slide}]"


def to_cql(query: Query) -> str:
    """The canonical text of `query`: parse(to_cql(q)) == q for every q parse can return.
    Raises QueryError for a name or literal the language cannot write."""
    select = ", ".join(map(_column_text, query.columns)) or "*"
    conditions = [f"{_column_text(left)} = {_column_text(right)}" for left, right in query.joins]
    conditions += map(_selection_text, query.selections)
    where = f" WHERE {' AND '.join(conditions)}" if conditions else ""
    return f"SELECT {select} FROM {', '.join(map(_window_text, query.windows))}{where}"

