"""The continuous-query language (seed 002's CQL subset): parse, validate, print.

    SELECT select_list FROM from_item (, from_item)* [WHERE condition (AND condition)*] [;]

`select_list` is `*` or `stream.field` items; `from_item` is `stream`, an
optional alias (`AS f` or `f`), then its window in brackets, required:
`flights f [RANGE 5 MIN SLIDE 1 MIN]` (SLIDE optional); a condition is a join
`a.x = b.y`, a selection `a.x = literal` (either way round) or
`a.x IN (literal, ...)`. Keywords are case-insensitive and reserved; names
are case-sensitive, and a name that is a keyword or not a plain identifier is
written in double quotes ("" for a quote inside). Literals: integers (int64),
decimals, 'strings' ('' for a quote), TRUE, FALSE. Units: MS, S, MIN, H and
their long forms (MILLISECONDS, SEC, SECONDS, MINUTES, HOURS, ...).

`parse` checks syntax and normalises (schemas/query.py states the result),
`validate` checks a query against a job's streams and against what hash mode
can run (one composite key over every source), `to_cql` prints the canonical
text, which parses back to the same query. Anything wrong raises QueryError,
naming the token, stream, column or literal at fault and where it is written.
"""

from __future__ import annotations

import difflib
import math
import re
from collections import Counter
from dataclasses import replace
from typing import NamedTuple, Sequence

from lark import Lark, Token, Transformer, UnexpectedInput, UnexpectedToken

from streamjoin.schemas.query import Column, Literal_, Query, Selection, SourceWindow
from streamjoin.settings.job import HASH_KEY_TYPES, StreamSpec

MAX_QUERY_BYTES = 64 * 1024
MAX_RANGE_MS = 7 * 24 * 3_600_000
MAX_SLIDE_MS = 24 * 3_600_000
MAX_SOURCES = 8
_INT64_BOUND = 1 << 63

_GRAMMAR = r"""
query: _SELECT select_list _FROM from_item ("," from_item)* where_clause? ";"?
select_list: "*"                          -> all_columns
           | column_ref ("," column_ref)* -> column_list
column_ref: name ("." name)?
name: NAME | QUOTED_NAME
from_item: name alias? "[" _RANGE duration (_SLIDE duration)? "]"
alias: _AS? name
duration: NUMBER NAME
where_clause: _WHERE condition (_AND condition)*
condition: operand "=" operand                            -> equality
         | column_ref _IN "(" literal ("," literal)* ")"  -> in_list
?operand: column_ref | literal
literal: NUMBER | STRING | TRUE | FALSE

_SELECT.2: /select\b/i
_FROM.2: /from\b/i
_WHERE.2: /where\b/i
_AND.2: /and\b/i
_AS.2: /as\b/i
_IN.2: /in\b/i
_RANGE.2: /range\b/i
_SLIDE.2: /slide\b/i
TRUE.2: /true\b/i
FALSE.2: /false\b/i
NAME: /[A-Za-z_][A-Za-z0-9_]*/
QUOTED_NAME: /"(?:[^"]|"")*"/
STRING: /'(?:[^']|'')*'/
NUMBER: /[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?/
%ignore /\s+/
"""
# The grammar's reserved words: a name equal to one of them (any case) is printed quoted.
_KEYWORDS = frozenset({"select", "from", "where", "and", "as", "in", "range", "slide", "true", "false"})
_PLAIN_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_INTEGER = re.compile(r"[+-]?[0-9]+")
_UNIT_MS = {"ms": 1, "millisecond": 1, "milliseconds": 1,
            "s": 1000, "sec": 1000, "second": 1000, "seconds": 1000,
            "min": 60_000, "minute": 60_000, "minutes": 60_000,
            "h": 3_600_000, "hour": 3_600_000, "hours": 3_600_000}
_PRINTED_UNITS = (("H", 3_600_000), ("MIN", 60_000), ("S", 1000))
_UNITS_HINT = "a time unit (MS, S, MIN or H)"
# What each terminal the parser could take next is called in a message, in the order listed.
_EXPECTED = {"STAR": "'*'", "NAME": "a name", "QUOTED_NAME": "a name", "NUMBER": "a number", "STRING": "a string",
             "TRUE": "TRUE", "FALSE": "FALSE", "_SELECT": "SELECT", "_FROM": "FROM", "_AS": "AS", "LSQB": "'['",
             "_RANGE": "RANGE", "_SLIDE": "SLIDE", "RSQB": "']'", "_WHERE": "WHERE", "_AND": "AND", "_IN": "IN",
             "LPAR": "'('", "RPAR": "')'", "EQUAL": "'='", "DOT": "'.'", "COMMA": "a comma",
             "SEMICOLON": "the end of the query", "$END": "the end of the query"}
# Which literal kinds a field of each type takes, and how the message says so.
_FIELD_TAKES = {"int": ("integer",), "float": ("integer", "decimal"), "str": ("string",), "bool": ("boolean",)}
_FIELD_WANTS = {"int": "an integer", "float": "a number", "str": "a string", "bool": "TRUE or FALSE"}


class QueryError(ValueError):
    """A query that cannot be run. `reason` says why, naming the token, stream, column or
    literal at fault and what would fit; `line` and `column` (1-based) and `token` (as
    written) say where, when known. str() is "line L, column C: reason"."""

    def __init__(self, reason: str, line: int | None = None, column: int | None = None,
                 token: str | None = None) -> None:
        super().__init__(f"line {line}, column {column}: {reason}" if line is not None else reason)
        self.reason, self.line, self.column, self.token = reason, line, column, token

    def __reduce__(self) -> tuple:
        return (QueryError, (self.reason, self.line, self.column, self.token))


class _Spot(NamedTuple):
    """Where a piece of the query is written: 1-based line and column, and its text."""

    line: int
    column: int
    text: str


def _spot(token: Token) -> _Spot:
    return _Spot(token.line, token.column, str(token))


def _spot_at(text: str, index: int, token: str) -> _Spot:
    """The spot of `token` found at character `index` of `text`."""
    line_start = text.rfind("\n", 0, index) + 1
    return _Spot(text.count("\n", 0, index) + 1, index - line_start + 1, token)


def _error(reason: str, spot: _Spot | None = None) -> QueryError:
    return QueryError(reason) if spot is None else QueryError(reason, spot.line, spot.column, spot.text)


def _shown(token: str) -> str:
    """A token quoted for a message, cut short when long (a string literal may be 64 KiB)."""
    text = str(token)  # a lark Token is a str whose repr names its type
    return repr(text if len(text) <= 40 else text[:37] + "...")


def _one_of(items: Sequence[str], conjunction: str = "or") -> str:
    """`items` listed for a message: "a, b or c"."""
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} {conjunction} {items[-1]}"


# ---------------------------------------------------------------- parse tree -> located pieces

class _Name(NamedTuple):
    text: str
    spot: _Spot


class _Ref(NamedTuple):
    """A column as written: `qualifier` is a stream or an alias (None when left out)."""

    qualifier: _Name | None
    field: _Name
    spot: _Spot


class _Duration(NamedTuple):
    ms: int
    spot: _Spot


class _Source(NamedTuple):
    stream: _Name
    alias: _Name | None
    window: SourceWindow


class _Lit(NamedTuple):
    value: Literal_
    spot: _Spot


class _Equality(NamedTuple):
    left: _Ref | _Lit
    right: _Ref | _Lit


class _InList(NamedTuple):
    column: _Ref
    values: list[_Lit]


class _Statement(NamedTuple):
    columns: list[_Ref] | None  # None: SELECT *
    sources: list[_Source]
    conditions: list[_Equality | _InList]


class _Pieces(Transformer):
    """Turns each rule of the parse tree into a located piece as the parser reduces it,
    checking names, literals and windows on the way (a QueryError stops the parse)."""

    def name(self, children: list[Token]) -> _Name:
        token = children[0]
        if token.type == "NAME":
            return _Name(str(token), _spot(token))
        if len(token) == 2:
            raise _error('an empty quoted name ("")', _spot(token))
        return _Name(token[1:-1].replace('""', '"'), _spot(token))

    def column_ref(self, children: list[_Name]) -> _Ref:
        if len(children) == 1:
            return _Ref(None, children[0], children[0].spot)
        qualifier, field = children
        return _Ref(qualifier, field, qualifier.spot._replace(text=f"{qualifier.spot.text}.{field.spot.text}"))

    def duration(self, children: list[Token]) -> _Duration:
        number, unit = children
        spot = _Spot(number.line, number.column, f"{number} {unit}")
        unit_ms = _UNIT_MS.get(unit.lower())
        if unit_ms is None:
            raise _error(f"unknown time unit {_shown(unit)} (expected {_UNITS_HINT})", _spot(unit))
        if not number.isdigit():
            raise _error(f"{_shown(number)} is not a whole number of {unit}: a window is a count of units",
                         _spot(number))
        digits = number.lstrip("0") or "0"
        # Past 15 digits only the size matters (every bound is far below), and int() of
        # thousands of digits is refused by Python itself.
        return _Duration((int(digits) if len(digits) <= 15 else 10 ** 15) * unit_ms, spot)

    def alias(self, children: list[_Name]) -> _Name:
        return children[0]

    def from_item(self, children: list) -> _Source:
        stream, *rest = children
        alias = rest.pop(0) if isinstance(rest[0], _Name) else None
        range_, slide = rest[0], rest[1] if len(rest) > 1 else None
        for keyword, duration, limit in (("RANGE", range_, MAX_RANGE_MS), ("SLIDE", slide, MAX_SLIDE_MS)):
            problem = _window_problem(keyword, duration.ms, limit, duration.spot.text) if duration else None
            if problem:
                raise _error(problem, duration.spot)
        return _Source(stream, alias, SourceWindow(stream.text, range_.ms, slide.ms if slide else None))

    def literal(self, children: list[Token]) -> _Lit:
        token = children[0]
        if token.type in ("TRUE", "FALSE"):
            return _Lit(token.type == "TRUE", _spot(token))
        if token.type == "STRING":
            return _Lit(token[1:-1].replace("''", "'"), _spot(token))
        return _Lit(_number(token), _spot(token))

    def equality(self, children: list) -> _Equality:
        return _Equality(*children)

    def in_list(self, children: list) -> _InList:
        return _InList(children[0], children[1:])

    def where_clause(self, children: list) -> list:
        return children

    def all_columns(self, children: list) -> None:
        return None

    def column_list(self, children: list[_Ref]) -> list[_Ref]:
        return children

    def query(self, children: list) -> _Statement:
        columns, *rest = children
        conditions = rest.pop() if isinstance(rest[-1], list) else []
        return _Statement(columns, rest, conditions)


def _number(token: Token) -> int | float:
    """An integer literal (int64) or a decimal one (finite float)."""
    if _INTEGER.fullmatch(token):
        digits = token.lstrip("+-").lstrip("0")
        # Past 19 digits it cannot fit; int() of thousands of digits is refused by Python itself.
        value = int(token) if len(digits) <= 19 else _INT64_BOUND
        if not -_INT64_BOUND <= value < _INT64_BOUND:
            raise _error(f"integer {_shown(token)} does not fit in 64 bits", _spot(token))
        return value
    value = float(token)
    if not math.isfinite(value):
        raise _error(f"decimal {_shown(token)} is out of range", _spot(token))
    return value


def _window_problem(keyword: str, ms: int, limit_ms: int, written: str) -> str | None:
    """What is wrong with a RANGE or SLIDE of `ms` (None: nothing); `written` is how it reads."""
    if ms <= 0:
        return f"{keyword} {written} is empty: a window lasts at least 1 ms"
    if ms > limit_ms:
        return f"{keyword} {written} is longer than the most allowed, {_duration_text(limit_ms)}"
    return None


_PARSER = Lark(_GRAMMAR, start="query", parser="lalr", lexer="basic", transformer=_Pieces())


# ---------------------------------------------------------------- located pieces -> Query

def _literal_kind(value: object) -> str:
    """integer, decimal, string, boolean, or unsupported (a hand-built query's stray value)."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "decimal"
    return "string" if isinstance(value, str) else "unsupported"


def _comparable_kind(value: object) -> str:
    """Integers and decimals compare with each other; nothing else mixes."""
    kind = _literal_kind(value)
    return "number" if kind in ("integer", "decimal") else kind


def _scope_of(sources: list[_Source]) -> dict[str, str]:
    """FROM's names: each stream and alias -> the stream it stands for."""
    scope: dict[str, str] = {}
    streams: set[str] = set()
    for source in sources:
        stream = source.stream.text
        if stream in streams:
            raise _error(f"stream {stream} appears twice in FROM: a query joins distinct streams (no self-joins)",
                         source.stream.spot)
        streams.add(stream)
        for name in filter(None, (source.stream, source.alias)):
            if scope.setdefault(name.text, stream) != stream:
                raise _error(f"{name.text} stands for both {scope[name.text]} and {stream} in FROM", name.spot)
    return scope


class _Assembler:
    """Resolves names against FROM and normalises the conditions into a Query, noting where
    each stream, column, join and literal is first written (for validate's messages)."""

    def __init__(self, sources: list[_Source]) -> None:
        self.scope = _scope_of(sources)
        self.example = _name_text((sources[0].alias or sources[0].stream).text)
        self.places: dict[tuple, _Spot] = {("stream", source.stream.text): source.stream.spot for source in sources}
        self.joins: set[tuple[Column, Column]] = set()
        self.selections: dict[Column, frozenset[Literal_]] = {}

    def query(self, statement: _Statement) -> Query:
        columns = self.select(statement.columns)
        for condition in statement.conditions:
            self.condition(condition)
        selections = sorted(self.selections.items(), key=lambda item: item[0])
        return Query(columns=columns, windows=tuple(source.window for source in statement.sources),
                     joins=tuple(sorted(self.joins)),
                     selections=tuple(Selection(column, values) for column, values in selections))

    def column(self, ref: _Ref) -> Column:
        if ref.qualifier is None:
            field = _name_text(ref.field.text)
            raise _error(f"unqualified column {_shown(ref.field.text)}: write it as stream.field, "
                         f"e.g. {self.example}.{field}", ref.spot)
        stream = self.scope.get(ref.qualifier.text)
        if stream is None:
            raise _error(f"{_shown(ref.qualifier.text)} is not a stream or alias of FROM"
                         f"{_did_you_mean(ref.qualifier.text, list(self.scope))}", ref.qualifier.spot)
        column = Column(stream, ref.field.text)
        self.places.setdefault(("column", column), ref.spot)
        return column

    def select(self, refs: list[_Ref] | None) -> tuple[Column, ...]:
        columns: dict[Column, None] = {}  # ordered, with set lookups (a 64 KiB list holds thousands)
        for ref in refs or ():
            column = self.column(ref)
            if column in columns:
                raise _error(f"{column} is selected twice", ref.spot)
            columns[column] = None
        return tuple(columns)

    def condition(self, condition: _Equality | _InList) -> None:
        if isinstance(condition, _InList):
            self.restrict(condition.column, condition.values)
            return
        left, right = condition
        if isinstance(left, _Lit) and isinstance(right, _Lit):
            raise _error(f"{left.spot.text} = {right.spot.text} compares two literals: a condition names a column",
                         left.spot)
        if isinstance(left, _Ref) and isinstance(right, _Ref):
            self.join(left, right)
        elif isinstance(left, _Ref):
            self.restrict(left, [right])
        else:
            self.restrict(right, [left])

    def join(self, left: _Ref, right: _Ref) -> None:
        pair = tuple(sorted((self.column(left), self.column(right))))
        if pair[0].stream == pair[1].stream:
            raise _error(f"{left.spot.text} = {right.spot.text} compares two columns of {pair[0].stream}: "
                         f"an equality of columns joins two different streams", left.spot)
        self.places.setdefault(("join", pair), left.spot)
        self.joins.add(pair)

    def restrict(self, ref: _Ref, literals: list[_Lit]) -> None:
        """Intersects the column's selection with these values."""
        column = self.column(ref)
        held = self.selections.get(column)
        kind = _comparable_kind(next(iter(held)) if held else literals[0].value)
        for literal in literals:
            if _comparable_kind(literal.value) != kind:
                raise _error(f"{literal.spot.text} is a {_comparable_kind(literal.value)}, but {column} is also "
                             f"compared with a {kind}", literal.spot)
            self.places.setdefault(("literal", column, _literal_kind(literal.value), literal.value), literal.spot)
        values = frozenset(literal.value for literal in literals)
        values = values & held if held else values
        if not values:
            raise _error(f"the conditions on {column} can never match: no value satisfies all of them", ref.spot)
        self.selections[column] = values


def _check_text(text: object) -> None:
    if not isinstance(text, str):
        raise QueryError(f"a query is text, not {type(text).__name__}")
    size = len(text) if len(text) > MAX_QUERY_BYTES else len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_QUERY_BYTES:
        raise QueryError(f"the query is longer than {MAX_QUERY_BYTES} bytes")
    nul = text.find("\x00")
    if nul >= 0:
        raise _error("a NUL character is not allowed in a query", _spot_at(text, nul, "\x00"))


def _syntax_error(error: UnexpectedInput, text: str) -> QueryError:
    """The parser's complaint as a QueryError naming the token and what would fit there."""
    accepts = error.interactive_parser.accepts()
    # A bare NAME, with no quoted one beside it, is taken only where a window's unit goes.
    expected = _UNITS_HINT if accepts == {"NAME"} else _one_of(
        list(dict.fromkeys(label for name, label in _EXPECTED.items() if name in accepts)))
    if isinstance(error, UnexpectedToken):
        if error.token.type == "$END":
            return _error(f"unexpected end of the query (expected {expected})", _spot_at(text, len(text), ""))
        return _error(f"unexpected {_shown(error.token)} (expected {expected})", _spot(error.token))
    char = text[error.pos_in_stream]
    spot = _spot_at(text, error.pos_in_stream, char)
    if char == "'":
        return _error("unterminated string: it needs a closing ' (a quote inside is written '')", spot)
    if char == '"':
        return _error('unterminated quoted name: it needs a closing " (a quote inside is written "")', spot)
    return _error(f"unexpected character {char!r} (expected {expected})", spot)


def _parse_located(text: str) -> tuple[Query, dict[tuple, _Spot]]:
    """The query and where its streams, columns, joins and literals are written."""
    _check_text(text)
    try:
        statement = _PARSER.parse(text)
    except UnexpectedInput as error:
        raise _syntax_error(error, text) from None
    assembler = _Assembler(statement.sources)
    return assembler.query(statement), assembler.places


def parse(text: str) -> Query:
    """The normalised query `text` says (syntax and names within the query only; `validate`
    checks it against the streams). Raises QueryError, and nothing else, for any input."""
    return _parse_located(text)[0]


# ---------------------------------------------------------------- Query -> text

def _name_text(name: str) -> str:
    if _PLAIN_NAME.fullmatch(name) and name.lower() not in _KEYWORDS:
        return name
    if not name or "\x00" in name:
        raise QueryError(f"{name!r} cannot be written as a CQL name")
    return '"' + name.replace('"', '""') + '"'


def _column_text(column: Column) -> str:
    return f"{_name_text(column.stream)}.{_name_text(column.field)}"


def _duration_text(ms: int) -> str:
    """`ms` in the largest unit that holds it exactly."""
    return next((f"{ms // size} {unit}" for unit, size in _PRINTED_UNITS if ms % size == 0), f"{ms} MS")


def _literal_text(value: object) -> str:
    kind = _literal_kind(value)
    if kind == "boolean":
        return "TRUE" if value else "FALSE"
    if kind == "integer" and -_INT64_BOUND <= value < _INT64_BOUND:
        return str(value)
    if kind == "decimal" and math.isfinite(value):
        return repr(value)  # always holds '.' or 'e', so it reads back as a decimal
    if kind == "string" and "\x00" not in value:
        return "'" + value.replace("'", "''") + "'"
    raise QueryError(f"{value!r} cannot be written as a CQL literal")


def _literal_order(value: Literal_) -> tuple[str, Literal_]:
    return (_comparable_kind(value), value)


def _selection_text(selection: Selection) -> str:
    values = [_literal_text(value) for value in sorted(selection.values, key=_literal_order)]
    column = _column_text(selection.column)
    return f"{column} = {values[0]}" if len(values) == 1 else f"{column} IN ({', '.join(values)})"


def _window_text(window: SourceWindow) -> str:
    slide = f" SLIDE {_duration_text(window.slide_ms)}" if window.slide_ms is not None else ""
    return f"{_name_text(window.stream)} [RANGE {_duration_text(window.range_ms)}{slide}]"


def to_cql(query: Query) -> str:
    """The canonical text of `query`: parse(to_cql(q)) == q for every q parse can return.
    Raises QueryError for a name or literal the language cannot write."""
    select = ", ".join(map(_column_text, query.columns)) or "*"
    conditions = [f"{_column_text(left)} = {_column_text(right)}" for left, right in query.joins]
    conditions += map(_selection_text, query.selections)
    where = f" WHERE {' AND '.join(conditions)}" if conditions else ""
    return f"SELECT {select} FROM {', '.join(map(_window_text, query.windows))}{where}"


# ---------------------------------------------------------------- validation against the streams

def _did_you_mean(word: str, known: Sequence[str], render: str = "{}") -> str:
    """A hint naming the known names closest to `word` (case aside), or listing them
    (none when nothing is known); `render` writes one name."""
    if not known:
        return ""
    by_folded = {name.lower(): name for name in known}
    close = difflib.get_close_matches(word.lower(), list(by_folded), n=3, cutoff=0.6)
    if close:
        return f" (did you mean {_one_of([render.format(by_folded[name]) for name in close])}?)"
    listed = sorted(known)
    return f" (expected {_one_of([render.format(name) for name in listed[:10]] + (['...'] if listed[10:] else []))})"


def _check_sources(query: Query, catalog: dict[str, StreamSpec], places: dict[tuple, _Spot]) -> None:
    streams = [window.stream for window in query.windows]
    if len(streams) < 2:
        raise _error(f"a query joins at least 2 sources; this one reads {_one_of(streams or ['none'])}")
    if len(streams) > MAX_SOURCES:
        raise _error(f"a query joins at most {MAX_SOURCES} sources; this one has {len(streams)}",
                     places.get(("stream", streams[MAX_SOURCES])))
    if len(set(streams)) < len(streams):
        raise _error("a stream appears twice in FROM: a query joins distinct streams (no self-joins)")
    for window in query.windows:
        spot = places.get(("stream", window.stream))
        problem = _window_problem("RANGE", window.range_ms, MAX_RANGE_MS, f"{window.range_ms} MS") or (
            window.slide_ms is not None and _window_problem("SLIDE", window.slide_ms, MAX_SLIDE_MS,
                                                            f"{window.slide_ms} MS"))
        if problem:
            raise _error(f"{window.stream}: {problem}", spot)
        if window.stream not in catalog:
            raise _error(f"unknown stream {_shown(window.stream)}{_did_you_mean(window.stream, list(catalog))}", spot)


def _check_column(column: Column, fields: dict[str, dict[str, str]], places: dict[tuple, _Spot]) -> None:
    spot = places.get(("column", column))
    if column.stream not in fields:
        raise _error(f"{column} names stream {column.stream}, which is not in FROM", spot)
    known = fields[column.stream]
    if column.field not in known:
        hint = _did_you_mean(column.field, list(known), f"{column.stream}.{{}}")
        raise _error(f"unknown column {_shown(str(column))}{hint}", spot)


def _shown_literal(value: object) -> str:
    try:
        return _literal_text(value)
    except QueryError:
        return repr(value)


def _check_selection(selection: Selection, fields: dict[str, dict[str, str]], places: dict[tuple, _Spot]) -> None:
    column = selection.column
    field_type = fields[column.stream][column.field]
    spot = places.get(("column", column))
    if not selection.values:
        raise _error(f"the selection on {column} lists no values", spot)
    if field_type not in _FIELD_TAKES:
        raise _error(f"{column} is of type {field_type}: it cannot be compared with a literal", spot)
    for value in sorted(selection.values, key=repr):
        kind = _literal_kind(value)
        if kind not in _FIELD_TAKES[field_type]:
            raise _error(f"{_shown_literal(value)} is not {_FIELD_WANTS[field_type]}: {column} is of type {field_type}",
                         places.get(("literal", column, kind, value), spot))


def _check_join_types(pair: tuple[Column, Column], fields: dict[str, dict[str, str]],
                      places: dict[tuple, _Spot]) -> None:
    left, right = pair
    left_type, right_type = fields[left.stream][left.field], fields[right.stream][right.field]
    spot = places.get(("join", pair))
    if left.stream == right.stream:
        raise _error(f"{left} = {right} compares two columns of {left.stream}: an equality of columns joins two "
                     f"different streams", spot)
    if left_type != right_type:
        raise _error(f"{left} ({left_type}) = {right} ({right_type}): joined columns must have one type", spot)
    if left_type not in HASH_KEY_TYPES:
        raise _error(f"{left} = {right} joins {left_type} columns: a join key is {_one_of(HASH_KEY_TYPES)}", spot)


def _check_join_classes(query: Query, places: dict[tuple, _Spot]) -> None:
    """Hash mode joins every source on one composite key: each equality class of the joins
    must hold exactly one column of every source. Classes are checked in the order their
    joins are written (FROM order when the text is not known)."""
    streams = [window.stream for window in query.windows]
    if not query.joins:
        raise _error(f"the query has no join condition: every source ({_one_of(streams, 'and')}) must be joined "
                     f"on one key, e.g. {_name_text(streams[0])}.key = {_name_text(streams[1])}.key")
    position = {stream: at for at, stream in enumerate(streams)}

    def order(column: Column) -> tuple[int, str]:
        return (position[column.stream], column.field)

    classes = [sorted(members, key=order) for members in query.join_classes]
    spots = _join_class_spots(query, classes, places)
    for members in sorted(classes, key=lambda members: (members[0] not in spots, spots.get(members[0]),
                                                        order(members[0]))):
        named = [column.stream for column in members]
        twice = next((stream for stream, count in Counter(named).items() if count > 1), None)
        if twice:
            raise _error(f"{' = '.join(map(str, members))} holds two columns of {twice}: every join class must name "
                         f"exactly one column of each source", spots.get(members[0]))
        if len(named) < len(streams):
            raise _error(f"{' = '.join(map(str, members))} joins only {_one_of(named, 'and')}: every join class must "
                         f"name one column of each source (a join tree of several operators is not supported)",
                         spots.get(members[0]))


def _join_class_spots(query: Query, classes: list[list[Column]], places: dict[tuple, _Spot]) -> dict[Column, _Spot]:
    """Each class's first member -> where its first join is written (classes whose joins' places
    are not known are left out)."""
    first_member = {column: members[0] for members in classes for column in members}
    spots: dict[Column, _Spot] = {}
    for pair in query.joins:
        spot = places.get(("join", pair))
        if spot is not None:
            key = first_member[pair[0]]
            spots[key] = min(spot, spots.get(key, spot))
    return spots


def _validate(query: Query, streams: Sequence[StreamSpec], places: dict[tuple, _Spot]) -> Query:
    catalog = {spec.name: spec for spec in streams}
    _check_sources(query, catalog, places)
    fields = {window.stream: dict(catalog[window.stream].fields) for window in query.windows}
    referenced = [*query.columns, *(column for pair in query.joins for column in pair),
                  *(selection.column for selection in query.selections)]
    for column in referenced:
        _check_column(column, fields, places)
    for selection in query.selections:
        _check_selection(selection, fields, places)
    for pair in query.joins:
        _check_join_types(pair, fields, places)
    _check_join_classes(query, places)
    columns = query.columns or tuple(Column(window.stream, field) for window in query.windows
                                     for field in fields[window.stream])
    return replace(query, columns=columns)


def _places_in(text: str | None) -> dict[tuple, _Spot]:
    """Where things are written in `text` (nothing when there is no text or it does not parse)."""
    if text is None:
        return {}
    try:
        return _parse_located(text)[1]
    except QueryError:
        return {}


def validate(query: Query, streams: Sequence[StreamSpec], text: str | None = None) -> Query:
    """`query` checked against `streams` (a job's catalog) and hash mode, with `*` expanded to
    every field of every source in FROM order. `text`, the query's text when there is one,
    lets errors say where the culprit is written. Raises QueryError."""
    return _validate(query, streams, _places_in(text))


def compile_query(text: str, streams: Sequence[StreamSpec]) -> Query:
    """parse then validate `text` against `streams`. Raises QueryError."""
    query, places = _parse_located(text)
    return _validate(query, streams, places)
