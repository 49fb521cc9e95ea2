"""The query language (schemas/cql_parse.py, cql_print.py, cql_validate.py): the
StreamReuse paper's queries, round trips of random queries through their text,
the error for each kind of bad input (where and which token), and hostile text,
which must only ever raise QueryError."""

from __future__ import annotations

import pickle
import random
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamjoin.schemas.cql_errors import QueryError
from streamjoin.schemas.cql_parse import MAX_RANGE_MS, MAX_SLIDE_MS, parse
from streamjoin.schemas.cql_print import to_cql
from streamjoin.schemas.cql_validate import compile_query, validate
from streamjoin.schemas.query import Column, Query, Selection, SourceWindow
from streamjoin.settings import StreamSpec
from tests.fuzz.query_target import check_query_text
from tests.profiles import examples

MIN = 60_000


def _stream(name: str, **fields: str) -> StreamSpec:
    return StreamSpec(name=name, fields={"ts": "int", **fields}, time_field="ts", window={"range_ms": 5 * MIN})


# The airline streams of the StreamReuse paper, section 2.1 (CHECK-INS is `checkins`: a name has no dash).
AIRLINE = [
    _stream("flights", num="str", gate="str", dest="str", terminal="str", carrier_code="str", capacity="int",
            load="float", delayed="bool", raw="bytes"),
    _stream("weather", city="str", forecast="str", temp="float"),
    _stream("checkins", flight="str", status="str", vacant_seats="int"),
    _stream("baggage", flight="str", area="str"),
]

# The StreamReuse paper's Q1 and Q2, in this language: lower-case names, 'strings', carrier_code for CARRIER CODE.
Q1 = ("SELECT flights.num, flights.gate, baggage.area, checkins.status, weather.forecast\n"
      "FROM flights [RANGE 5 MIN], weather [RANGE 5 MIN], checkins [RANGE 1 MIN], baggage [RANGE 1 MIN]\n"
      "WHERE flights.dest = weather.city AND flights.num = checkins.flight AND flights.num = baggage.flight\n"
      "  AND flights.terminal = 'TERMINAL A' AND flights.carrier_code = 'DL';")
Q2 = ("SELECT flights.num, checkins.status, checkins.vacant_seats "
      "FROM flights [RANGE 5 MIN SLIDE 5 MIN], checkins [RANGE 5 MIN SLIDE 5 MIN] "
      "WHERE flights.num = checkins.flight AND flights.carrier_code IN ('DL', 'CO');")


def test_q2_parses_and_validates_against_the_airline_streams() -> None:
    flights, checkins = "flights", "checkins"
    expected = Query(
        columns=(Column(flights, "num"), Column(checkins, "status"), Column(checkins, "vacant_seats")),
        windows=(SourceWindow(flights, 5 * MIN, 5 * MIN), SourceWindow(checkins, 5 * MIN, 5 * MIN)),
        joins=((Column(checkins, "flight"), Column(flights, "num")),),
        selections=(Selection(Column(flights, "carrier_code"), frozenset({"DL", "CO"})),))
    assert parse(Q2) == expected
    assert compile_query(Q2, AIRLINE) == expected
    assert to_cql(expected) == ("SELECT flights.num, checkins.status, checkins.vacant_seats FROM "
                                "flights [RANGE 5 MIN SLIDE 5 MIN], checkins [RANGE 5 MIN SLIDE 5 MIN] WHERE "
                                "checkins.flight = flights.num AND flights.carrier_code IN ('CO', 'DL')")


def test_q1_parses_but_its_join_tree_is_refused() -> None:
    query = parse(Q1)
    assert len(query.join_classes) == 2 and query.slide_ms is None
    assert query.selections == (Selection(Column("flights", "carrier_code"), frozenset({"DL"})),
                                Selection(Column("flights", "terminal"), frozenset({"TERMINAL A"})))
    for error in (pytest.raises(QueryError, compile_query, Q1, AIRLINE),
                  pytest.raises(QueryError, validate, query, AIRLINE, Q1)):
        assert error.value.reason == ("flights.dest = weather.city joins only flights and weather: every join class "
                                      "must name one column of each source (a join tree of several operators is not "
                                      "supported)")
        assert (error.value.line, error.value.column, error.value.token) == (3, 7, "flights.dest")
    without_text = pytest.raises(QueryError, validate, query, AIRLINE).value
    assert without_text.line is None and str(without_text) == without_text.reason


def test_aliases_resolve_and_star_expands_in_from_order() -> None:
    text = ("select * from checkins AS c [range 90 s], flights f [range 2 h slide 30 min] "
            "where c.flight = f.num and f.capacity = 180 and 180 = f.capacity and f.delayed = false")
    query = compile_query(text, AIRLINE)
    assert query.windows == (SourceWindow("checkins", 90_000), SourceWindow("flights", 2 * 60 * MIN, 30 * MIN))
    assert query.columns[:5] == (Column("checkins", "ts"), Column("checkins", "flight"), Column("checkins", "status"),
                                 Column("checkins", "vacant_seats"), Column("flights", "ts"))
    assert len(query.columns) == 4 + 10
    assert query.selections == (Selection(Column("flights", "capacity"), frozenset({180})),
                                Selection(Column("flights", "delayed"), frozenset({False})))
    assert parse(text).columns == ()


def test_selections_on_one_column_intersect_and_joins_are_deduplicated() -> None:
    query = parse("SELECT a.x FROM a [RANGE 1 S], b [RANGE 1 S] WHERE b.k = a.k AND a.k = b.k "
                  "AND a.c IN ('DL', 'CO', 'UA') AND a.c IN ('UA', 'DL', 'LH') AND a.n IN (1, 2.5) AND a.n = 2.5")
    assert query.joins == ((Column("a", "k"), Column("b", "k")),)
    assert query.selections == (Selection(Column("a", "c"), frozenset({"DL", "UA"})),
                                Selection(Column("a", "n"), frozenset({2.5})))


def test_to_cql_writes_windows_in_the_largest_exact_unit_and_quotes_names_that_need_it() -> None:
    query = Query(columns=(Column("select", "my field"), Column("min", 'say "hi"')),
                  windows=(SourceWindow("select", 7 * 24 * 60 * MIN, 90_000), SourceWindow("min", 1001, 2000)),
                  joins=((Column("min", "k"), Column("select", "k")),),
                  selections=(Selection(Column("min", "n"), frozenset({3, -1.5})),
                              Selection(Column("select", "s"), frozenset({"it's"}))))
    text = to_cql(query)
    assert text == ('SELECT "select"."my field", min."say ""hi""" FROM "select" [RANGE 168 H SLIDE 90 S], '
                    'min [RANGE 1001 MS SLIDE 2 S] WHERE min.k = "select".k AND min.n IN (-1.5, 3) '
                    "AND \"select\".s = 'it''s'")
    assert parse(text) == query


@pytest.mark.parametrize("value", [float("nan"), float("inf"), 1 << 63, "a\x00b", b"raw", None])
def test_to_cql_refuses_a_literal_the_language_cannot_write(value: object) -> None:
    query = Query(columns=(), windows=(SourceWindow("a", 1), SourceWindow("b", 1)),
                  joins=((Column("a", "k"), Column("b", "k")),), selections=(Selection(Column("a", "x"),
                                                                                       frozenset({value})),))
    with pytest.raises(QueryError, match="cannot be written as a CQL literal"):
        to_cql(query)


# ------------------------------------------------------------------ bad text: where, which token, why

_TWO = "SELECT a.x FROM a [RANGE 1 S], b [RANGE 1 S]"
BAD_TEXT = [
    # (text, line, column, token, fragment of the reason)
    ("SELECT a.x FROM a [RANGE 5 MIN] WHRE a.x = 1", 1, 33, "WHRE",
     "unexpected 'WHRE' (expected WHERE, a comma or the end of the query)"),
    ("", 1, 1, "", "unexpected end of the query (expected SELECT)"),
    ("SELECT a.x FROM", 1, 16, "", "unexpected end of the query (expected a name)"),
    ("SELECT a.x\nFROM a [RANGE 5 ]", 2, 17, "]", "unexpected ']' (expected a time unit (MS, S, MIN or H))"),
    ("SELECT a.x FROM a [RANGE 5 MINS]", 1, 28, "MINS", "unknown time unit 'MINS' (expected a time unit"),
    ("SELECT a.x FROM a [RANGE 1.5 S]", 1, 26, "1.5", "'1.5' is not a whole number of S"),
    ("SELECT a.x FROM a [RANGE 0 S]", 1, 26, "0 S", "RANGE 0 S is empty"),
    ("SELECT a.x FROM a [RANGE 169 HOURS]", 1, 26, "169 HOURS",
     "RANGE 169 HOURS is longer than the most allowed, 168 H"),
    ("SELECT a.x FROM a [RANGE 1 S SLIDE 1441 MIN]", 1, 36, "1441 MIN",
     "SLIDE 1441 MIN is longer than the most allowed, 24 H"),
    ("SELECT a.x FROM a [RANGE " + "9" * 5000 + " MS]", 1, 26, "9" * 5000 + " MS", "is longer than"),
    ("SELECT a.x FROM a", 1, 18, "", "unexpected end of the query (expected a name, AS or '[')"),
    ("SELECT a.x FROM a [SLIDE 1 S]", 1, 20, "SLIDE", "unexpected 'SLIDE' (expected RANGE)"),
    ("SELECT x FROM flights f [RANGE 1 S]", 1, 8, "x", "unqualified column 'x': write it as stream.field, e.g. f.x"),
    ("SELECT z.x FROM a [RANGE 1 S], b [RANGE 1 S]", 1, 8, "z",
     "'z' is not a stream or alias of FROM (expected a or b)"),
    ("SELECT a.* FROM a [RANGE 1 S]", 1, 10, "*", "unexpected '*' (expected a name)"),
    ("SELECT a.x, a.x FROM a [RANGE 1 S]", 1, 13, "a.x", "a.x is selected twice"),
    ("SELECT a.x FROM a [RANGE 1 S], a [RANGE 2 S]", 1, 32, "a", "stream a appears twice in FROM"),
    ("SELECT a.x FROM a [RANGE 1 S], b AS a [RANGE 2 S]", 1, 37, "a", "a stands for both a and b in FROM"),
    ('SELECT a.x FROM "" [RANGE 1 S]', 1, 17, '""', 'an empty quoted name ("")'),
    (_TWO + " WHERE a.x = a.y", 1, 52, "a.x", "a.x = a.y compares two columns of a"),
    (_TWO + " WHERE 1 = 'x'", 1, 52, "1", "1 = 'x' compares two literals"),
    (_TWO + " WHERE a.x = 1 AND a.x IN (2, 3)", 1, 64, "a.x", "the conditions on a.x can never match"),
    (_TWO + " WHERE a.x = 1 AND a.x = TRUE", 1, 70, "TRUE",
     "TRUE is a boolean, but a.x is also compared with a number"),
    (_TWO + " WHERE a.x IN ('a', 2)", 1, 65, "2", "2 is a number, but a.x is also compared with a string"),
    (_TWO + " WHERE a.x = 9223372036854775808", 1, 58, "9223372036854775808",
     "integer '9223372036854775808' does not fit in 64 bits"),
    (_TWO + " WHERE a.x = -" + "1" * 5000, 1, 58, "-" + "1" * 5000, "does not fit in 64 bits"),
    (_TWO + "\nWHERE a.x = 1e999", 2, 13, "1e999", "decimal '1e999' is out of range"),
    (_TWO + " WHERE a.x IN ()", 1, 60, ")", "unexpected ')' (expected a number, a string, TRUE or FALSE)"),
    (_TWO + " WHERE a.x = 'it's'", 1, 62, "s", "unexpected 's' (expected AND or the end of the query)"),
    (_TWO + " WHERE a.x = 'open", 1, 58, "'", "unterminated string: it needs a closing '"),
    (_TWO + ' WHERE "a.x = 1', 1, 52, '"', 'unterminated quoted name: it needs a closing "'),
    (_TWO + " WHERE a.x = @", 1, 58, "@", "unexpected character '@' (expected a name, a number, a string, TRUE or "
                                          "FALSE)"),
    (_TWO + " WHERE a.x = 1;;", 1, 60, ";", "unexpected ';' (expected the end of the query)"),
    ("SELECT a.x\x00 FROM a [RANGE 1 S]", 1, 11, "\x00", "a NUL character is not allowed"),
    ("SELECT a.x FROM a [RANGE 1 S], b [RANGE 1 S] FOR SYSTEM_TIME AS OF a.ts", 1, 46, "FOR",
     "an as-of join (FOR SYSTEM_TIME AS OF) is not in the query language"),
    ("SELECT a.x FROM a [tumble 10 S]", 1, 20, "tumble", "tumbling and hopping windows are not in the query language"),
]


@pytest.mark.parametrize("text, line, column, token, fragment", BAD_TEXT, ids=[f"bad{i}" for i in range(len(BAD_TEXT))])
def test_bad_text_is_refused_at_its_token(text: str, line: int, column: int, token: str, fragment: str) -> None:
    with pytest.raises(QueryError) as caught:
        parse(text)
    error = caught.value
    assert (error.line, error.column, error.token, fragment in error.reason) == (line, column, token, True), str(error)
    assert str(error) == f"line {line}, column {column}: {error.reason}"


def test_oversized_and_non_text_input_is_refused() -> None:
    with pytest.raises(QueryError, match="longer than 65536 bytes"):
        parse(_TWO + " WHERE a.x = '" + "é" * 40_000 + "'")
    with pytest.raises(QueryError, match="a query is text, not bytes"):
        parse(b"SELECT *")  # type: ignore[arg-type]


# ------------------------------------------------------------------ validation against the streams

_CHECKED = "SELECT flights.num FROM flights [RANGE 5 MIN], checkins [RANGE 5 MIN] WHERE flights.num = checkins.flight"
BAD_QUERIES = [
    # (text, line, column, token, fragment of the reason); None: the error has no place
    ("SELECT flight.num FROM flight [RANGE 1 MIN], checkins [RANGE 1 MIN] WHERE flight.num = checkins.flight",
     1, 24, "flight", "unknown stream 'flight' (did you mean flights?)"),
    ("SELECT x.num FROM FLIGHTS x [RANGE 1 MIN], checkins [RANGE 1 MIN] WHERE x.num = checkins.flight",
     1, 19, "FLIGHTS", "unknown stream 'FLIGHTS' (did you mean flights?)"),
    ("SELECT f.nmu FROM flights f [RANGE 1 MIN], checkins [RANGE 1 MIN] WHERE f.num = checkins.flight",
     1, 8, "f.nmu", "unknown column 'flights.nmu' (did you mean flights.num?)"),
    (_CHECKED + " AND checkins.zzz = 1", 1, 111, "checkins.zzz",
     "unknown column 'checkins.zzz' (expected checkins.flight, checkins.status, checkins.ts or checkins.vacant_seats)"),
    (_CHECKED + " AND flights.capacity = 1.5", 1, 130, "1.5", "1.5 is not an integer: flights.capacity is of type int"),
    (_CHECKED + " AND flights.load = 'x'", 1, 126, "'x'", "'x' is not a number: flights.load is of type float"),
    (_CHECKED + " AND flights.gate = 5", 1, 126, "5", "5 is not a string: flights.gate is of type str"),
    (_CHECKED + " AND flights.delayed = 1", 1, 129, "1", "1 is not TRUE or FALSE: flights.delayed is of type bool"),
    (_CHECKED + " AND flights.raw = 'x'", 1, 111, "flights.raw",
     "flights.raw is of type bytes: it cannot be compared with a literal"),
    (_CHECKED + " AND flights.capacity = checkins.status", 1, 111, "flights.capacity",
     "checkins.status (str) = flights.capacity (int): joined columns must have one type"),
    ("SELECT * FROM flights [RANGE 1 MIN], weather [RANGE 1 MIN] WHERE flights.load = weather.temp", 1, 66,
     "flights.load", "flights.load = weather.temp joins float columns: a join key is int, str or bool"),
    ("SELECT * FROM flights [RANGE 1 MIN], checkins [RANGE 1 MIN]", None, None, None,
     "the query has no join condition: every source (flights and checkins) must be joined on one key"),
    ("SELECT * FROM flights [RANGE 1 MIN] WHERE flights.num = 'x'", None, None, None,
     "a query joins at least 2 sources; this one reads flights"),
    (_CHECKED + " AND flights.gate = checkins.flight", 1, 77, "flights.num",
     "flights.gate = flights.num = checkins.flight holds two columns of flights"),
    ("SELECT * FROM flights [RANGE 1 MIN], checkins [RANGE 1 MIN], baggage [RANGE 1 MIN] "
     "WHERE flights.num = checkins.flight AND checkins.status = baggage.area", 1, 90, "flights.num",
     "flights.num = checkins.flight joins only flights and checkins"),
]


@pytest.mark.parametrize("text, line, column, token, fragment", BAD_QUERIES,
                         ids=[f"invalid{i}" for i in range(len(BAD_QUERIES))])
def test_invalid_query_is_refused_naming_its_culprit(text: str, line: int | None, column: int | None,
                                                     token: str | None, fragment: str) -> None:
    query = parse(text)
    with pytest.raises(QueryError) as caught:
        compile_query(text, AIRLINE)
    error = caught.value
    assert (error.line, error.column, error.token, fragment in error.reason) == (line, column, token, True), str(error)
    assert pytest.raises(QueryError, validate, query, AIRLINE).value.line is None


def test_join_classes_are_judged_in_the_order_their_joins_are_written() -> None:
    text = ("SELECT * FROM flights [RANGE 1 MIN], checkins [RANGE 1 MIN], baggage [RANGE 1 MIN]\n"
            "WHERE checkins.status = baggage.area AND flights.num = checkins.flight")
    error = pytest.raises(QueryError, compile_query, text, AIRLINE).value
    assert (error.line, error.column, error.token) == (2, 7, "checkins.status")
    assert error.reason.startswith("checkins.status = baggage.area joins only checkins and baggage: ")
    # Without the text, FROM order decides.
    error = pytest.raises(QueryError, validate, parse(text), AIRLINE).value
    assert error.reason.startswith("flights.num = checkins.flight joins only flights and checkins: ")


def test_a_join_class_over_every_source_passes_even_with_several_classes() -> None:
    text = ("SELECT f.num FROM flights f [RANGE 1 MIN], checkins c [RANGE 1 MIN], baggage b [RANGE 1 MIN] "
            "WHERE f.num = c.flight AND b.flight = c.flight AND f.gate = c.status AND c.status = b.area")
    query = compile_query(text, AIRLINE)
    assert len(query.join_classes) == 2 and all(len(cls) == 3 for cls in query.join_classes)


def test_an_unknown_stream_is_refused_even_when_no_stream_is_known() -> None:
    error = pytest.raises(QueryError, compile_query, Q2, []).value
    assert (error.reason, error.line, error.column) == ("unknown stream 'flights'", 1, 65)


def test_query_error_survives_pickling() -> None:
    error = pytest.raises(QueryError, parse, "SELECT").value
    copy = pickle.loads(pickle.dumps(error))
    assert (copy.reason, copy.line, copy.column, copy.token, str(copy)) == (
        error.reason, error.line, error.column, error.token, str(error))


def test_more_than_eight_sources_are_refused_at_the_ninth() -> None:
    names = [f"s{i}" for i in range(9)]
    streams = [_stream(name, k="int") for name in names]
    text = ("SELECT * FROM " + ", ".join(f"{name} [RANGE 1 S]" for name in names) + " WHERE "
            + " AND ".join(f"s0.k = {name}.k" for name in names[1:]))
    assert len(compile_query(text.replace(", s8 [RANGE 1 S]", "").replace(" AND s0.k = s8.k", ""), streams[:8])
               .windows) == 8
    error = pytest.raises(QueryError, compile_query, text, streams).value
    assert "at most 8 sources; this one has 9" in error.reason and error.token == "s8"


@pytest.mark.parametrize("query, fragment", [
    (Query((), (SourceWindow("flights", 0), SourceWindow("checkins", MIN)), ()), "flights: RANGE 0 MS is empty"),
    (Query((), (SourceWindow("flights", MIN, MAX_SLIDE_MS + 1), SourceWindow("checkins", MIN)), ()),
     "flights: SLIDE 86400001 MS is longer than the most allowed, 24 H"),
    (Query((), (SourceWindow("flights", MIN), SourceWindow("flights", MIN)), ()), "a stream appears twice in FROM"),
    (Query((Column("baggage", "area"),), (SourceWindow("flights", MIN), SourceWindow("checkins", MIN)),
           ((Column("checkins", "flight"), Column("flights", "num")),)),
     "baggage.area names stream baggage, which is not in FROM"),
    (Query((), (SourceWindow("flights", MIN), SourceWindow("checkins", MIN)),
           ((Column("checkins", "flight"), Column("flights", "num")),),
           (Selection(Column("flights", "gate"), frozenset()),)), "the selection on flights.gate lists no values"),
    (Query((), (SourceWindow("flights", MIN), SourceWindow("checkins", MIN)),
           ((Column("checkins", "flight"), Column("flights", "num")),),
           (Selection(Column("flights", "gate"), frozenset({b"x"})),)), "b'x' is not a string"),
    (Query((), (SourceWindow("flights", MIN), SourceWindow("checkins", MIN)),
           ((Column("flights", "gate"), Column("flights", "num")),)), "compares two columns of flights"),
])
def test_validate_refuses_a_hand_built_query_that_parse_would_not_give(query: Query, fragment: str) -> None:
    with pytest.raises(QueryError, match=re.escape(fragment)):
        validate(query, AIRLINE)


# ------------------------------------------------------------------ round trips of random queries

_NAMES = st.one_of(
    st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,5}", fullmatch=True),
    st.sampled_from(["select", "Range", "min", "s", "AS", "true", "ms", "In"]),
    st.text(st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), min_size=1, max_size=5))
_DURATIONS = st.one_of(st.integers(1, 168).map(lambda hours: hours * 3_600_000), st.integers(1, 1440).map(
    lambda minutes: minutes * MIN), st.integers(1, 86_400).map(lambda seconds: seconds * 1000))
_VALUE_SETS = st.one_of(
    st.frozensets(st.one_of(st.integers(-(1 << 63), (1 << 63) - 1), st.floats(allow_nan=False, allow_infinity=False)),
                  min_size=1, max_size=4),
    st.frozensets(st.text(st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), max_size=6),
                  min_size=1, max_size=4),
    st.frozensets(st.booleans(), min_size=1))


@st.composite
def queries(draw: st.DrawFn) -> Query:
    """Any query parse can return: distinct streams, normalised joins and selections."""
    streams = draw(st.lists(_NAMES, min_size=1, max_size=5, unique=True))
    windows = tuple(SourceWindow(stream, draw(_DURATIONS | st.integers(1, MAX_RANGE_MS)),
                                 draw(st.none() | _DURATIONS.filter(lambda ms: ms <= MAX_SLIDE_MS)))
                    for stream in streams)
    columns = st.builds(Column, st.sampled_from(streams), _NAMES)
    selected = draw(st.just(()) | st.lists(columns, unique=True, max_size=5).map(tuple))
    pairs = draw(st.lists(st.tuples(columns, columns), max_size=5)) if len(streams) > 1 else []
    joins = sorted({tuple(sorted(pair)) for pair in pairs if pair[0].stream != pair[1].stream})
    restricted = draw(st.lists(columns, unique=True, max_size=4))
    selections = [Selection(column, draw(_VALUE_SETS)) for column in sorted(restricted)]
    return Query(selected, windows, tuple(joins), tuple(selections))


_WORD_OR_GAP = re.compile(r"""'(?:[^']|'')*'|"(?:[^"]|"")*"|[A-Za-z_][A-Za-z0-9_]*|[+-]?[0-9][0-9.eE+-]*|\s+|.""",
                          re.DOTALL)
_RESERVED = {"SELECT", "FROM", "WHERE", "AND", "AS", "IN", "RANGE", "SLIDE", "TRUE", "FALSE"}


def _respell(text: str, chance: random.Random) -> str:
    """`text` with its keywords and units in random case and random whitespace between tokens."""
    tokens = [token for token in _WORD_OR_GAP.findall(text) if not token.isspace()]
    out: list[str] = []
    for at, token in enumerate(tokens):
        is_unit = at > 0 and tokens[at - 1][0].isdigit() and token.isalpha()
        if token in _RESERVED or is_unit:
            token = "".join(chance.choice((letter.lower(), letter.upper())) for letter in token)
        wordy = out and (out[-1][-1].isalnum() or out[-1][-1] == "_") and (token[0].isalnum() or token[0] == "_")
        gap = chance.choice(["", "\n", "\t", "  ", "\r\n"]) if at else ""
        out.append((" " if wordy or chance.random() < 0.5 else "") + gap + token)
    return "".join(out) + chance.choice(["", ";", " ;\n"])


@given(queries())
@settings(max_examples=examples(100), deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_random_query_reads_back_from_its_text(query: Query) -> None:
    text = to_cql(query)
    assert parse(text) == query
    assert to_cql(parse(text)) == text


@given(queries(), st.randoms(use_true_random=False))
@settings(max_examples=examples(100), deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_random_query_reads_back_whatever_the_keyword_case_and_whitespace(query: Query, chance: random.Random) -> None:
    assert parse(_respell(to_cql(query), chance)) == query


# ------------------------------------------------------------------ hostile text

_PIECES = ["SELECT", "FROM", "WHERE", "AND", "IN", "AS", "RANGE", "SLIDE", "TRUE", "a.k", "b.s", "*", ",", ".", "[",
           "]", "(", ")", "=", ";", "'", '"', "1", "-1.5e9", "99999999999999999999", "MIN", "\x00", "\ud800", "\n"]


@given(st.text())
@settings(max_examples=examples(1000), deadline=None)
def test_any_text_raises_only_query_error(text: str) -> None:
    check_query_text(text.encode("utf-8", "surrogatepass"))


@given(queries(), st.lists(st.tuples(st.integers(0, 400), st.integers(0, 6), st.sampled_from(_PIECES)), max_size=4))
@settings(max_examples=examples(100), deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_damaged_query_text_raises_only_query_error(query: Query, edits: list[tuple[int, int, str]]) -> None:
    """Valid text with slices cut out and pieces put in: deeper than random text gets."""
    text = to_cql(query)
    for at, cut, piece in edits:
        at %= len(text) + 1
        text = text[:at] + piece + text[at + cut:]
    check_query_text(text.encode("utf-8", "surrogatepass"))
