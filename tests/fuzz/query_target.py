"""Fuzz target of the query parser (schemas/cql_parse.py), `cql` in tests/fuzz/fuzz.py.

The input bytes are the query text (UTF-8; a byte that is not turns into a lone
surrogate, so every input is some text). Whatever the text, parse must return a
Query or raise QueryError, never anything else; a QueryError must say a reason
and point inside the text; a parsed query must print to text that parses back
to it, and validating it against a small catalog must again raise nothing but
QueryError.
"""

from __future__ import annotations

from streamjoin.schemas.cql_errors import QueryError
from streamjoin.schemas.cql_parse import parse
from streamjoin.schemas.cql_print import to_cql
from streamjoin.schemas.cql_validate import validate
from streamjoin.settings import StreamSpec

_WINDOW = {"range_ms": 60_000}
# The seeds in tests/fuzz/corpus/cql/ query these streams.
CATALOG = [
    StreamSpec(name="a", fields={"k": "int", "ts": "int", "s": "str", "f": "float", "b": "bool", "raw": "bytes"},
               time_field="ts", key_fields=["k"], window=_WINDOW),
    StreamSpec(name="b", fields={"k": "int", "ts": "int", "s": "str"}, time_field="ts", key_fields=["k"],
               window=_WINDOW),
    StreamSpec(name="c", fields={"k": "int", "ts": "int", "name": "str"}, time_field="ts", key_fields=["k"],
               window=_WINDOW),
]


def _check_error(error: QueryError, text: str) -> None:
    """A QueryError says why, and a place that lies within the text."""
    assert error.reason, "a QueryError without a reason"
    if error.line is not None:
        assert error.column is not None and error.column >= 1, f"column {error.column}"
        assert 1 <= error.line <= text.count("\n") + 1, f"line {error.line} is outside the text"
        assert str(error).startswith(f"line {error.line}, column {error.column}: ")


def check_query_text(data: bytes) -> None:
    """Parse `data` as a query and check the verdict; AssertionError on a wrong one (any other
    exception is a parser bug)."""
    text = data.decode("utf-8", "surrogateescape")
    try:
        query = parse(text)
    except QueryError as error:
        _check_error(error, text)
        return
    assert parse(to_cql(query)) == query, "the printed query reads back otherwise"
    try:
        validated = validate(query, CATALOG, text)
    except QueryError as error:
        _check_error(error, text)
        return
    assert validated.columns, "a valid query selects something"
