"""JSON record values as text: which values Arrow's reader may be given, values spread over
several lines made one line, and why a value is refused, in words (Python's json).

Arrow's JSON reader takes one value per line, so a record written by `json.dumps(obj,
indent=2)` would read as many. RFC 8259 lets line breaks stand only as whitespace between
tokens (inside a string they must be escaped), so in a value that Python's strict parser
reads as an object every CR and LF is whitespace, and spaces in their place change nothing
but the lines. Only records the joined-lines check refuses take this path.
"""

from __future__ import annotations

import json
from typing import Sequence

import numpy as np

from streamjoin.settings import StreamSpec

_PY_TYPES = {"int": (int,), "float": (int, float), "str": (str,), "bool": (bool,), "bytes": (str,)}


class _Pairs(list):
    """A JSON object as Python's json read it, its (name, value) pairs in order (duplicates kept)."""


def check_one_json(spec: StreamSpec, value: bytes | str) -> tuple[str | None, bool]:
    """Slow path: why is this record bad, in words (None: Python's json sees nothing wrong), and
    is it sure to be refused (by Arrow, or after Arrow by `_bad_rows`)? A wrong type, a repeat or
    a range fault in a declared field, a syntax error, or a value that is no object, is; text
    Python's json cannot read for its depth or its invalid UTF-8 Arrow may still take (when it
    sits in fields the stream does not declare)."""
    try:
        pairs = json.loads(value, object_pairs_hook=_Pairs)
    except UnicodeDecodeError:  # read on with the bad bytes as lone surrogates, to see where they are
        return check_one_json(spec, value.decode("utf-8", "surrogateescape"))  # type: ignore[union-attr]
    except RecursionError as e:  # deep nesting
        return f"not JSON: {type(e).__name__}: {e}", False
    except ValueError as e:  # a syntax error: Arrow's reader finds it too (or reads several values)
        return f"not JSON: {type(e).__name__}: {e}", True
    if not isinstance(pairs, _Pairs):
        return f"JSON value must be an object, got {type(pairs).__name__}", True
    names = [name for name, _ in pairs]
    obj = dict(pairs)
    for name, t in spec.fields.items():
        if names.count(name) > 1:
            return f"field {name!r} appears more than once", True
        if name not in obj or obj[name] is None:
            return f"missing field {name!r}", True
        v = obj[name]
        if not isinstance(v, _PY_TYPES[t]) or (t in ("int", "float") and isinstance(v, bool)):
            got = "object" if isinstance(v, _Pairs) else type(v).__name__
            return f"field {name!r} should be {t}, got {got}", True
        if t == "int" and not -(1 << 63) <= v < 1 << 63:
            return f"field {name!r} is outside int64", True
        if t == "float" and isinstance(v, float) and not np.isfinite(v):
            return f"field {name!r} is not a finite number", True
        if t == "str" and not _is_utf8(v):  # invalid bytes or a lone surrogate escape: Arrow refuses both
            return f"field {name!r} is not valid UTF-8", True
    return None, False


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def one_line_objects(values: Sequence[bytes | None]) -> tuple[np.ndarray, bytes | None]:
    """Which values Arrow's reader may be given: one line (it breaks lines at CR too) starting
    with an object (it crashes the process, SIGSEGV seen with pyarrow 26.0.1, when its input
    starts with `null`). Returns the mask and, when every value passes, the values joined by
    LF (the reader's input, built once). Checked on the joined bytes as arrays: a line break
    inside a value shows in the count, a value's first byte at its start; only values that do
    not start with `{` right away (leading blanks, or empty) are looked at one by one."""
    count = len(values)
    try:
        joined = b"\n".join(values)  # type: ignore[arg-type]
    except TypeError:  # a None (tombstone) among them: `None in values` would cost a compare per value
        joined = None
    if count == 0 or joined is None or joined.count(b"\n") != count - 1 or b"\r" in joined:
        return np.array([_one_line_object(v) for v in values], dtype=bool), None
    lengths = np.fromiter(map(len, values), np.int64, count)  # type: ignore[arg-type]
    starts = np.cumsum(lengths + 1) - lengths - 1
    raw = np.frombuffer(joined, np.uint8)
    good = (lengths > 0) & (raw[np.minimum(starts, max(len(raw) - 1, 0))] == ord("{")) if len(raw) else lengths > 0
    for i in np.flatnonzero(~good).tolist():
        good[i] = _one_line_object(values[i])
    return good, joined if good.all() else None


def _one_line_object(value: bytes | None) -> bool:
    return value is not None and b"\n" not in value and b"\r" not in value and value.lstrip()[:1] == b"{"


def unfold_lines(values: Sequence[bytes | None], good: np.ndarray) -> list[bytes | None] | None:
    """`values` with every refused value (`good` False) that is a JSON object spread over
    several lines put on one, or None when there is none such."""
    out: list[bytes | None] | None = None
    for i in np.flatnonzero(~good).tolist():
        value = values[i]
        if value is None or (b"\n" not in value and b"\r" not in value) or not _is_object(value):
            continue
        if out is None:
            out = list(values)
        out[i] = value.replace(b"\r", b" ").replace(b"\n", b" ")
    return out


def _is_object(value: bytes) -> bool:
    """Does Python's strict parser (no raw control characters in strings) read `value` as
    one object? Bytes that are not UTF-8 are read as lone surrogates: where they stand is
    Arrow's to judge."""
    try:
        return isinstance(json.loads(value.decode("utf-8", "surrogateescape")), dict)
    except (ValueError, RecursionError):  # RecursionError: nested too deep to tell; stays refused
        return False
