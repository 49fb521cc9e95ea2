"""Parsing the continuous-query language: its grammar (lark, LALR), the text to
a normalised Query (schemas/query.py states the result), with syntax, names,
literals and windows checked within the query itself; schemas/cql_validate.py
checks it against a job's streams.

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

Anything wrong raises QueryError, naming the token, stream, column or literal
at fault and where it is written.
"""

from __future__ import annotations

import math
import re
from typing import NamedTuple

from lark import Lark, Token, Transformer, UnexpectedInput, UnexpectedToken

from streamjoin.schemas.cql_errors import QueryError, Spot, did_you_mean, error_at, one_of, shown
from streamjoin.schemas.cql_print import INT64_BOUND, comparable_kind, duration_text, literal_kind, name_text
from streamjoin.schemas.query import Column, Literal_, Query, Selection, SourceWindow

__all__ = ["MAX_QUERY_BYTES", "MAX_RANGE_MS", "MAX_SLIDE_MS", "parse", "parse_located", "window_problem"]

MAX_QUERY_BYTES = 64 * 1024
MAX_RANGE_MS = 7 * 24 * 3_600_000
MAX_SLIDE_MS = 24 * 3_600_000

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
_INTEGER = re.compile(r"[+-]?[0-9]+")
_UNIT_MS = {"ms": 1, "millisecond": 1, "milliseconds": 1,
            "s": 1000, "sec": 1000, "second": 1000, "seconds": 1000,
            "min": 60_000, "minute": 60_000, "minutes": 60_000,
            "h": 3_600_000, "hour": 3_600_000, "hours": 3_600_000}
_UNITS_HINT = "a time unit (MS, S, MIN or H)"
# What each terminal the parser could take next is called in a message, in the order listed.
_EXPECTED = {"STAR": "'*'", "NAME": "a name", "QUOTED_NAME": "a name", "NUMBER": "a number", "STRING": "a string",
             "TRUE": "TRUE", "FALSE": "FALSE", "_SELECT": "SELECT", "_FROM": "FROM", "_AS": "AS", "LSQB": "'['",
             "_RANGE": "RANGE", "_SLIDE": "SLIDE", "RSQB": "']'", "_WHERE": "WHERE", "_AND": "AND", "_IN": "IN",
             "LPAR": "'('", "RPAR": "')'", "EQUAL": "'='", "DOT": "'.'", "COMMA": "a comma",
             "SEMICOLON": "the end of the query", "$END": "the end of the query"}


def _spot(token: Token) -> Spot:
    return Spot(token.line, token.column, str(token))


def _spot_at(text: str, index: int, token: str) -> Spot:
    """The spot of `token` found at character `index` of `text`."""
    line_start = text.rfind("\n", 0, index) + 1
    return Spot(text.count("\n", 0, index) + 1, index - line_start + 1, token)


# ---------------------------------------------------------------- parse tree -> located pieces

class _Name(NamedTuple):
    text: str
    spot: Spot


class _Ref(NamedTuple):
    """A column as written: `qualifier` is a stream or an alias (None when left out)."""

    qualifier: _Name | None
    field: _Name
    spot: Spot


class _Duration(NamedTuple):
    ms: int
    spot: Spot


class _Source(NamedTuple):
    stream: _Name
    alias: _Name | None
    window: SourceWindow


class _Lit(NamedTuple):
    value: Literal_
    spot: Spot


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
            raise error_at('an empty quoted name ("")', _spot(token))
        return _Name(token[1:-1].replace('""', '"'), _spot(token))

    def column_ref(self, children: list[_Name]) -> _Ref:
        if len(children) == 1:
            return _Ref(None, children[0], children[0].spot)
        qualifier, field = children
        return _Ref(qualifier, field, qualifier.spot._replace(text=f"{qualifier.spot.text}.{field.spot.text}"))

    def duration(self, children: list[Token]) -> _Duration:
        number, unit = children
        spot = Spot(number.line, number.column, f"{number} {unit}")
        unit_ms = _UNIT_MS.get(unit.lower())
        if unit_ms is None:
            raise error_at(f"unknown time unit {shown(unit)} (expected {_UNITS_HINT})", _spot(unit))
        if not number.isdigit():
            raise error_at(f"{shown(number)} is not a whole number of {unit}: a window is a count of units",
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
            problem = window_problem(keyword, duration.ms, limit, duration.spot.text) if duration else None
            if problem:
                raise error_at(problem, duration.spot)
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
        value = int(token) if len(digits) <= 19 else INT64_BOUND
        if not -INT64_BOUND <= value < INT64_BOUND:
            raise error_at(f"integer {shown(token)} does not fit in 64 bits", _spot(token))
        return value
    value = float(token)
    if not math.isfinite(value):
        raise error_at(f"decimal {shown(token)} is out of range", _spot(token))
    return value


def window_problem(keyword: str, ms: int, limit_ms: int, written: str) -> str | None:
    """What is wrong with a RANGE or SLIDE of `ms` (None: nothing); `written` is how it reads."""
    if ms <= 0:
        return f"{keyword} {written} is empty: a window lasts at least 1 ms"
    if ms > limit_ms:
        return f"{keyword} {written} is longer than the most allowed, {duration_text(limit_ms)}"
    return None


_PARSER = Lark(_GRAMMAR, start="query", parser="lalr", lexer="basic", transformer=_Pieces())


# ---------------------------------------------------------------- located pieces -> Query

def _scope_of(sources: list[_Source]) -> dict[str, str]:
    """FROM's names: each stream and alias -> the stream it stands for."""
    scope: dict[str, str] = {}
    streams: set[str] = set()
    for source in sources:
        stream = source.stream.text
        if stream in streams:
            raise error_at(f"stream {stream} appears twice in FROM: a query joins distinct streams (no self-joins)",
                           source.stream.spot)
        streams.add(stream)
        for name in filter(None, (source.stream, source.alias)):
            if scope.setdefault(name.text, stream) != stream:
                raise error_at(f"{name.text} stands for both {scope[name.text]} and {stream} in FROM", name.spot)
    return scope


class _Assembler:
    """Resolves names against FROM and normalises the conditions into a Query, noting where
    each stream, column, join and literal is first written (for validate's messages)."""

    def __init__(self, sources: list[_Source]) -> None:
        self.scope = _scope_of(sources)
        self.example = name_text((sources[0].alias or sources[0].stream).text)
        self.places: dict[tuple, Spot] = {("stream", source.stream.text): source.stream.spot for source in sources}
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
            field = name_text(ref.field.text)
            raise error_at(f"unqualified column {shown(ref.field.text)}: write it as stream.field, "
                           f"e.g. {self.example}.{field}", ref.spot)
        stream = self.scope.get(ref.qualifier.text)
        if stream is None:
            raise error_at(f"{shown(ref.qualifier.text)} is not a stream or alias of FROM"
                           f"{did_you_mean(ref.qualifier.text, list(self.scope))}", ref.qualifier.spot)
        column = Column(stream, ref.field.text)
        self.places.setdefault(("column", column), ref.spot)
        return column

    def select(self, refs: list[_Ref] | None) -> tuple[Column, ...]:
        columns: dict[Column, None] = {}  # ordered, with set lookups (a 64 KiB list holds thousands)
        for ref in refs or ():
            column = self.column(ref)
            if column in columns:
                raise error_at(f"{column} is selected twice", ref.spot)
            columns[column] = None
        return tuple(columns)

    def condition(self, condition: _Equality | _InList) -> None:
        if isinstance(condition, _InList):
            self.restrict(condition.column, condition.values)
            return
        left, right = condition
        if isinstance(left, _Lit) and isinstance(right, _Lit):
            raise error_at(f"{left.spot.text} = {right.spot.text} compares two literals: a condition names a column",
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
            raise error_at(f"{left.spot.text} = {right.spot.text} compares two columns of {pair[0].stream}: "
                           f"an equality of columns joins two different streams", left.spot)
        self.places.setdefault(("join", pair), left.spot)
        self.joins.add(pair)

    def restrict(self, ref: _Ref, literals: list[_Lit]) -> None:
        """Intersects the column's selection with these values."""
        column = self.column(ref)
        held = self.selections.get(column)
        kind = comparable_kind(next(iter(held)) if held else literals[0].value)
        for literal in literals:
            if comparable_kind(literal.value) != kind:
                raise error_at(f"{literal.spot.text} is a {comparable_kind(literal.value)}, but {column} is also "
                               f"compared with a {kind}", literal.spot)
            self.places.setdefault(("literal", column, literal_kind(literal.value), literal.value), literal.spot)
        values = frozenset(literal.value for literal in literals)
        values = values & held if held else values
        if not values:
            raise error_at(f"the conditions on {column} can never match: no value satisfies all of them", ref.spot)
        self.selections[column] = values


def _check_text(text: object) -> None:
    if not isinstance(text, str):
        raise QueryError(f"a query is text, not {type(text).__name__}")
    size = len(text) if len(text) > MAX_QUERY_BYTES else len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_QUERY_BYTES:
        raise QueryError(f"the query is longer than {MAX_QUERY_BYTES} bytes")
    nul = text.find("\x00")
    if nul >= 0:
        raise error_at("a NUL character is not allowed in a query", _spot_at(text, nul, "\x00"))


# Joins the language does not have, named where a user of another engine writes them.
_ASOF = ("an as-of join (FOR SYSTEM_TIME AS OF) is not in the query language, whose operators are shared "
         "sliding windows: run it as a job with join.table")
_TUMBLING = ("tumbling and hopping windows are not in the query language: a source's window is sliding, "
             "[RANGE n unit] or [RANGE n unit SLIDE m unit]; run a window join as a job with window: tumbling_ms or "
             "hopping_ms")
_NOT_IN_THE_LANGUAGE = {"FOR": _ASOF, "ASOF": _ASOF, "TUMBLE": _TUMBLING, "TUMBLING": _TUMBLING, "HOP": _TUMBLING,
                        "HOPPING": _TUMBLING}


def _syntax_error(error: UnexpectedInput, text: str) -> QueryError:
    """The parser's complaint as a QueryError naming the token and what would fit there."""
    if isinstance(error, UnexpectedToken) and str(error.token).upper() in _NOT_IN_THE_LANGUAGE:
        return error_at(_NOT_IN_THE_LANGUAGE[str(error.token).upper()], _spot(error.token))
    accepts = error.interactive_parser.accepts()
    # A bare NAME, with no quoted one beside it, is taken only where a window's unit goes.
    expected = _UNITS_HINT if accepts == {"NAME"} else one_of(
        list(dict.fromkeys(label for name, label in _EXPECTED.items() if name in accepts)))
    if isinstance(error, UnexpectedToken):
        if error.token.type == "$END":
            return error_at(f"unexpected end of the query (expected {expected})", _spot_at(text, len(text), ""))
        return error_at(f"unexpected {shown(error.token)} (expected {expected})", _spot(error.token))
    char = text[error.pos_in_stream]
    spot = _spot_at(text, error.pos_in_stream, char)
    if char == "'":
        return error_at("unterminated string: it needs a closing ' (a quote inside is written '')", spot)
    if char == '"':
        return error_at('unterminated quoted name: it needs a closing " (a quote inside is written "")', spot)
    return error_at(f"unexpected character {char!r} (expected {expected})", spot)


def parse_located(text: str) -> tuple[Query, dict[tuple, Spot]]:
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
    return parse_located(text)[0]


