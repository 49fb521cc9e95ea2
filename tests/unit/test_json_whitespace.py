"""JSON values spelled with any RFC 8259 whitespace (leading, trailing, between tokens, line
breaks included: `json.dumps(obj, indent=2)`) decode like their compact spelling; a value a
strict parser refuses (a raw control character inside a string, a character that is not JSON
whitespace between tokens) is refused. Checked differentially against Python's json, which
allows exactly the four whitespace characters and no raw control characters in strings."""

from __future__ import annotations

import json

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from streamjoin.engine.block import KEY, TS
from streamjoin.schemas.codecs import decode_json
from streamjoin.settings import StreamSpec
from tests.profiles import examples

FIELDS = {"k": "int", "ts": "int", "v": "str", "w": "float"}
SPEC = StreamSpec(name="r", fields=FIELDS, time_field="ts", key_fields=["k"], window={"range_ms": 10})
JSON_WHITESPACE = " \t\n\r"
_MARK = "\ue000"  # a private-use character no generated text holds: where `odd` goes in a string
NOT_WHITESPACE = ["\x0b", "\x0c", "\xa0", "\u2028", "\x00"]

# No NUL: a str column is fixed-width NumPy text, which drops trailing NULs whatever the spelling.
_text = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00\ue000"), max_size=12)
_objects = st.fixed_dictionaries(
    {"k": st.integers(-(1 << 62), 1 << 62), "ts": st.integers(-(1 << 40), 1 << 40), "v": _text,
     "w": st.floats(allow_nan=False, allow_infinity=False)},
    optional={"extra": st.one_of(st.none(), st.integers(), _text, st.lists(st.integers(), max_size=3))})


def _meta(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return np.zeros(n, np.int32), np.arange(n, dtype=np.int64), np.zeros(n, np.int64)


def _spelled(obj: dict, gaps: list[str]) -> str:
    """`obj` as JSON with gaps[i % len(gaps)] at the i-th place whitespace may stand."""
    tokens = ["{"]
    for n, (name, value) in enumerate(obj.items()):
        tokens += ([","] if n else []) + [json.dumps(name), ":", json.dumps(value, ensure_ascii=False)]
    tokens.append("}")
    out = [gaps[0]]
    for i, token in enumerate(tokens, start=1):
        out += [token, gaps[i % len(gaps)]]
    return "".join(out)


def _strict(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


@settings(max_examples=examples(200), deadline=None)
@given(objs=st.lists(_objects, min_size=1, max_size=6),
       gaps=st.lists(st.text(st.sampled_from(JSON_WHITESPACE), max_size=4), min_size=1, max_size=9),
       pretty=st.booleans())
def test_whitespace_never_changes_what_a_record_holds(objs: list[dict], gaps: list[str], pretty: bool) -> None:
    values = [(json.dumps(o, indent=2) if pretty else _spelled(o, gaps)).encode() for o in objs]
    out = decode_json(SPEC, values, *_meta(len(values)))
    assert out.rejects == [] and out.records.tolist() == list(range(len(objs)))
    assert out.block[KEY].tolist() == [o["k"] for o in objs] and out.block[TS].tolist() == [o["ts"] for o in objs]
    assert out.block["v"].tolist() == [o["v"] for o in objs] and out.block["w"].tolist() == [o["w"] for o in objs]


@settings(max_examples=examples(200), deadline=None)
@given(obj=_objects, gaps=st.lists(st.text(st.sampled_from(JSON_WHITESPACE), max_size=3), min_size=1, max_size=5),
       odd=st.sampled_from(NOT_WHITESPACE + ["\n", "\r", "\t", "\x1f"]), at=st.integers(0, 1_000), in_string=st.booleans())
def test_a_record_is_taken_exactly_when_a_strict_parser_reads_it(obj: dict, gaps: list[str], odd: str, at: int,
                                                                 in_string: bool) -> None:
    """One character put in a string's text or between two tokens: the decoder's verdict is
    the strict parser's (a raw control character in a string or a non-whitespace gap: refused)."""
    if in_string:
        text = _spelled({**obj, "v": obj["v"] + _MARK}, gaps).replace(_MARK, odd)
    else:
        text = _spelled(obj, gaps)
        places = [i for i, c in enumerate(text) if c in "{},:" and i + 1 < len(text)]
        place = places[at % len(places)] + 1
        text = text[:place] + odd + text[place:]
    good = json.dumps({**obj, "k": 7}).encode()
    out = decode_json(SPEC, [good, text.encode(), good], *_meta(3))
    taken = 1 in out.records.tolist()
    assert taken == _strict(text), (text, out.rejects)
    assert out.records.tolist() == ([0, 1, 2] if taken else [0, 2])
    if not taken:
        assert [(r.index, r.reason) for r in out.rejects] == [(1, "malformed")]
