"""A numba scanner for the common shape of input records: one flat JSON object per line,
in its plainest spelling, read straight into columns.

Arrow's JSON reader costs about 330 ns of CPU per 64-byte record of the equi-join workload
(measured, one thread). Most records a producer writes are far simpler than JSON allows:
no whitespace, no escapes, ASCII text, integers. `scan_lines` reads exactly those, at a few
ns per byte, and gives up on a batch at the first line that is anything else; the decoder
then reads the batch with Arrow as before. So it decides nothing Arrow would decide
otherwise: every line it accepts means one value per field to Arrow too.

Accepted, per line: `{` then `"name":value` pairs separated by `,` then `}`, where every
name is one of the stream's fields (any order, each exactly once), written as its plain
bytes; an int value is `-?` and 1 to 18 digits without a leading zero (so it fits int64);
a str value is `"` then printable ASCII other than `"` and backslash, then `"`.
"""

from __future__ import annotations

import numpy as np

from streamjoin.engine.jit import kernel

__all__ = ["INT_FIELD", "STR_FIELD", "MAX_FIELDS", "scan_lines", "gather"]

INT_FIELD, STR_FIELD = 0, 1  # field kinds
MAX_FIELDS = 64  # fields are tracked in one 64-bit mask per line
_MAX_DIGITS = 18  # 10**18 - 1 < 2**63: no overflow check needed
_QUOTE, _BACKSLASH, _COLON, _COMMA, _OPEN, _CLOSE, _MINUS, _NEWLINE = 0x22, 0x5C, 0x3A, 0x2C, 0x7B, 0x7D, 0x2D, 0x0A
_ZERO_DIGIT, _NINE = 0x30, 0x39


@kernel
def _field_of(data: np.ndarray, start: int, end: int, names: np.ndarray, name_offsets: np.ndarray) -> int:
    """The field whose name is data[start:end], or -1."""
    for field in range(len(name_offsets) - 1):
        lo, hi = name_offsets[field], name_offsets[field + 1]
        if hi - lo != end - start:
            continue
        same = True
        for k in range(hi - lo):
            if names[lo + k] != data[start + k]:
                same = False
                break
        if same:
            return field
    return -1


@kernel
def _plain_string_end(data: np.ndarray, at: int) -> int:
    """Where the plain string whose first byte is data[at] ends (its closing quote), or -1 if it
    holds a backslash, a control character or a non-ASCII byte, or never closes."""
    while at < len(data):
        byte = data[at]
        if byte == _QUOTE:
            return at
        if byte == _BACKSLASH or byte < 0x20 or byte >= 0x7F:
            return -1
        at += 1
    return -1


@kernel
def _integer(data: np.ndarray, at: int) -> tuple[int, int]:
    """(value, position after it) of the plain integer at data[at], or (0, -1)."""
    negative = at < len(data) and data[at] == _MINUS
    if negative:
        at += 1
    first = at
    value = 0
    while at < len(data) and _ZERO_DIGIT <= data[at] <= _NINE:
        value = value * 10 + (data[at] - _ZERO_DIGIT)
        at += 1
    digits = at - first
    if digits == 0 or digits > _MAX_DIGITS or (digits > 1 and data[first] == _ZERO_DIGIT):
        return 0, -1
    return (-value if negative else value), at


@kernel
def scan_lines(data: np.ndarray, count: int, names: np.ndarray, name_offsets: np.ndarray, kinds: np.ndarray
               ) -> tuple[bool, np.ndarray, np.ndarray, np.ndarray]:
    """Read `count` LF-separated lines of `data`, each a plain flat object (module docstring).

    data: the lines' bytes (uint8); names: the fields' names end to end (uint8), field f's at
    names[name_offsets[f]:name_offsets[f + 1]]; kinds: per field INT_FIELD or STR_FIELD (at most MAX_FIELDS).
    Returns (whether every line was read, ints, starts, ends): ints[f, i] is line i's value of
    int field f; a str field's value is data[starts[f, i]:ends[f, i]]. When the first value is
    False the rest is meaningless."""
    fields = len(kinds)
    ints = np.zeros((fields, count), np.int64)
    starts = np.zeros((fields, count), np.int64)
    ends = np.zeros((fields, count), np.int64)
    every = (np.uint64(1) << np.uint64(fields)) - np.uint64(1) if fields < 64 else ~np.uint64(0)
    at, size = 0, len(data)
    for line in range(count):
        if at >= size or data[at] != _OPEN:
            return False, ints, starts, ends
        at += 1
        seen = np.uint64(0)
        while True:
            if at >= size or data[at] != _QUOTE:
                return False, ints, starts, ends
            name_end = _plain_string_end(data, at + 1)
            if name_end < 0:
                return False, ints, starts, ends
            field = _field_of(data, at + 1, name_end, names, name_offsets)
            if field < 0:
                return False, ints, starts, ends
            bit = np.uint64(1) << np.uint64(field)
            if seen & bit:
                return False, ints, starts, ends
            seen |= bit
            at = name_end + 1
            if at >= size or data[at] != _COLON:
                return False, ints, starts, ends
            at += 1
            if kinds[field] == INT_FIELD:
                value, at = _integer(data, at)
                if at < 0:
                    return False, ints, starts, ends
                ints[field, line] = value
            else:
                if at >= size or data[at] != _QUOTE:
                    return False, ints, starts, ends
                text_end = _plain_string_end(data, at + 1)
                if text_end < 0:
                    return False, ints, starts, ends
                starts[field, line], ends[field, line] = at + 1, text_end
                at = text_end + 1
            if at < size and data[at] == _COMMA:
                at += 1
                continue
            if at < size and data[at] == _CLOSE:
                at += 1
                break
            return False, ints, starts, ends
        if seen != every:
            return False, ints, starts, ends
        if line < count - 1:
            if at >= size or data[at] != _NEWLINE:
                return False, ints, starts, ends
            at += 1
    return at == size, ints, starts, ends


@kernel
def gather(data: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the values data[starts[i]:ends[i]] end to end, their offsets: len(starts) + 1, from 0)."""
    offsets = np.zeros(len(starts) + 1, np.int64)
    for i in range(len(starts)):
        offsets[i + 1] = offsets[i] + ends[i] - starts[i]
    out = np.empty(offsets[-1], np.uint8)
    for i in range(len(starts)):
        out[offsets[i]:offsets[i + 1]] = data[starts[i]:ends[i]]
    return out, offsets
