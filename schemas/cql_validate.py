"""Validating a continuous query against a job's streams and against what hash
mode can run (one composite key over every source), and `compile_query`, which
parses then validates. Anything wrong raises QueryError, naming the stream,
column or literal at fault and, when the query's text is known, where it is
written.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import Sequence

from streamjoin.schemas.cql_errors import QueryError, Spot, did_you_mean, error_at, one_of, shown
from streamjoin.schemas.cql_parse import MAX_RANGE_MS, MAX_SLIDE_MS, parse_located, window_problem
from streamjoin.schemas.cql_print import literal_kind, literal_text, name_text
from streamjoin.schemas.query import Column, Query, Selection
from streamjoin.settings.streams import HASH_KEY_TYPES, StreamSpec

__all__ = ["MAX_SOURCES", "validate", "compile_query"]

MAX_SOURCES = 8
# Which literal kinds a field of each type takes, and how the message says so.
_FIELD_TAKES = {"int": ("integer",), "float": ("integer", "decimal"), "str": ("string",), "bool": ("boolean",)}
_FIELD_WANTS = {"int": "an integer", "float": "a number", "str": "a string", "bool": "TRUE or FALSE"}


def _check_sources(query: Query, catalog: dict[str, StreamSpec], places: dict[tuple, Spot]) -> None:
    streams = [window.stream for window in query.windows]
    if len(streams) < 2:
        raise error_at(f"a query joins at least 2 sources; this one reads {one_of(streams or ['none'])}")
    if len(streams) > MAX_SOURCES:
        raise error_at(f"a query joins at most {MAX_SOURCES} sources; this one has {len(streams)}",
                       places.get(("stream", streams[MAX_SOURCES])))
    if len(set(streams)) < len(streams):
        raise error_at("a stream appears twice in FROM: a query joins distinct streams (no self-joins)")
    for window in query.windows:
        spot = places.get(("stream", window.stream))
        problem = window_problem("RANGE", window.range_ms, MAX_RANGE_MS, f"{window.range_ms} MS") or (
            window.slide_ms is not None and window_problem("SLIDE", window.slide_ms, MAX_SLIDE_MS,
                                                           f"{window.slide_ms} MS"))
        if problem:
            raise error_at(f"{window.stream}: {problem}", spot)
        if window.stream not in catalog:
            raise error_at(f"unknown stream {shown(window.stream)}{did_you_mean(window.stream, list(catalog))}", spot)


def _check_column(column: Column, fields: dict[str, dict[str, str]], places: dict[tuple, Spot]) -> None:
    spot = places.get(("column", column))
    if column.stream not in fields:
        raise error_at(f"{column} names stream {column.stream}, which is not in FROM", spot)
    known = fields[column.stream]
    if column.field not in known:
        hint = did_you_mean(column.field, list(known), f"{column.stream}.{{}}")
        raise error_at(f"unknown column {shown(str(column))}{hint}", spot)


def _shown_literal(value: object) -> str:
    try:
        return literal_text(value)
    except QueryError:
        return repr(value)


def _check_selection(selection: Selection, fields: dict[str, dict[str, str]], places: dict[tuple, Spot]) -> None:
    column = selection.column
    field_type = fields[column.stream][column.field]
    spot = places.get(("column", column))
    if not selection.values:
        raise error_at(f"the selection on {column} lists no values", spot)
    if field_type not in _FIELD_TAKES:
        raise error_at(f"{column} is of type {field_type}: it cannot be compared with a literal", spot)
    for value in sorted(selection.values, key=repr):
        kind = literal_kind(value)
        if kind not in _FIELD_TAKES[field_type]:
            raise error_at(f"{_shown_literal(value)} is not {_FIELD_WANTS[field_type]}: "
                           f"{column} is of type {field_type}", places.get(("literal", column, kind, value), spot))


def _check_join_types(pair: tuple[Column, Column], fields: dict[str, dict[str, str]],
                      places: dict[tuple, Spot]) -> None:
    left, right = pair
    left_type, right_type = fields[left.stream][left.field], fields[right.stream][right.field]
    spot = places.get(("join", pair))
    if left.stream == right.stream:
        raise error_at(f"{left} = {right} compares two columns of {left.stream}: an equality of columns joins two "
                       f"different streams", spot)
    if left_type != right_type:
        raise error_at(f"{left} ({left_type}) = {right} ({right_type}): joined columns must have one type", spot)
    if left_type not in HASH_KEY_TYPES:
        raise error_at(f"{left} = {right} joins {left_type} columns: a join key is {one_of(HASH_KEY_TYPES)}", spot)


def _check_join_classes(query: Query, places: dict[tuple, Spot]) -> None:
    """Hash mode joins every source on one composite key: each equality class of the joins
    must hold exactly one column of every source. Classes are checked in the order their
    joins are written (FROM order when the text is not known)."""
    streams = [window.stream for window in query.windows]
    if not query.joins:
        raise error_at(f"the query has no join condition: every source ({one_of(streams, 'and')}) must be joined "
                       f"on one key, e.g. {name_text(streams[0])}.key = {name_text(streams[1])}.key")
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
            raise error_at(f"{' = '.join(map(str, members))} holds two columns of {twice}: every join class must name "
                           f"exactly one column of each source", spots.get(members[0]))
        if len(named) < len(streams):
            raise error_at(f"{' = '.join(map(str, members))} joins only {one_of(named, 'and')}: every join class must "
                           f"name one column of each source (a join tree of several operators is not supported)",
                           spots.get(members[0]))


def _join_class_spots(query: Query, classes: list[list[Column]], places: dict[tuple, Spot]) -> dict[Column, Spot]:
    """Each class's first member -> where its first join is written (classes whose joins' places
    are not known are left out)."""
    first_member = {column: members[0] for members in classes for column in members}
    spots: dict[Column, Spot] = {}
    for pair in query.joins:
        spot = places.get(("join", pair))
        if spot is not None:
            key = first_member[pair[0]]
            spots[key] = min(spot, spots.get(key, spot))
    return spots


def _validate(query: Query, streams: Sequence[StreamSpec], places: dict[tuple, Spot]) -> Query:
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


def _places_in(text: str | None) -> dict[tuple, Spot]:
    """Where things are written in `text` (nothing when there is no text or it does not parse)."""
    if text is None:
        return {}
    try:
        return parse_located(text)[1]
    except QueryError:
        return {}


def validate(query: Query, streams: Sequence[StreamSpec], text: str | None = None) -> Query:
    """`query` checked against `streams` (a job's catalog) and hash mode, with `*` expanded to
    every field of every source in FROM order. `text`, the query's text when there is one,
    lets errors say where the culprit is written. Raises QueryError."""
    return _validate(query, streams, _places_in(text))


def compile_query(text: str, streams: Sequence[StreamSpec]) -> Query:
    """parse then validate `text` against `streams`. Raises QueryError."""
    query, places = parse_located(text)
    return _validate(query, streams, places)
