"""Numba kernels that write many rows of text into one byte buffer, for the encoders
that build whole blocks of records (schemas/columns.py, schemas/result_encode.py).

Why numba: each of these is a loop over the bytes of every row (a row's length
depends on its own values), which NumPy can only express as several passes over
(rows x width) masks and gathers. Measured on a result block of the equi-join
workload: a 'U' text column to UTF-8 took 119 ns a row as NumPy passes, and
Arrow's concatenation of a JSON document's 27 pieces 276 ns a row.

The layout is Arrow's: a row's bytes lie at data[offsets[i]:offsets[i + 1]].
Writers take a `cursor` (one write position per row, uint64) and the rows
[start, stop) to write, and advance each row's cursor by what they wrote, so a
record is built piece by piece, a cache-sized run of rows at a time: every writer has a
`*_lengths` twin that says how many bytes each row's piece takes. Offsets are
uint64 too: numba checks every signed index for a negative value (Python's
wrap-around), which made the byte loops ten times slower (measured).
"""

from __future__ import annotations

import numpy as np

from streamjoin.engine.jit import kernel

__all__ = ["utf8_lengths", "put_utf8", "fixed_lengths", "put_fixed", "decimal_lengths", "put_decimal", "put_hex",
           "put_literal", "put_flat"]

# JSON's two-character escapes (json.dumps writes these); other code points below 0x20
# become \u00XX with lowercase hex, as json.dumps writes them.
_SHORT_ESCAPE = np.zeros(128, np.uint8)
for _code, _letter in ((0x22, '"'), (0x5C, "\\"), (0x08, "b"), (0x0C, "f"), (0x0A, "n"), (0x0D, "r"), (0x09, "t")):
    _SHORT_ESCAPE[_code] = ord(_letter)
_HEX = np.frombuffer(b"0123456789abcdef", np.uint8)
_PAIRS = np.frombuffer("".join(f"{k:02d}" for k in range(100)).encode(), np.uint8)  # "00".."99", 2 bytes each
_POWERS = np.array([10 ** k for k in range(1, 20)], np.uint64)  # a value below _POWERS[k] has at most k + 1 digits
_NOT_UTF8 = -1  # a lone surrogate or a value past U+10FFFF: no UTF-8 exists
_ZERO, _ONE, _TWO, _TEN, _HUNDRED = np.uint64(0), np.uint64(1), np.uint64(2), np.uint64(10), np.uint64(100)


@kernel
def _escaped(code: int) -> bool:
    return code < 0x20 or code == 0x22 or code == 0x5C


@kernel
def _code_width(code: int, json_escape: bool) -> int:
    """Bytes the code point takes in UTF-8 (escaped for a JSON string where asked), or _NOT_UTF8."""
    if code < 0x80:
        if json_escape and _escaped(code):
            return 2 if _SHORT_ESCAPE[code] != 0 else 6
        return 1
    if code < 0x800:
        return 2
    if 0xD800 <= code < 0xE000 or code > 0x10FFFF:
        return _NOT_UTF8
    return 3 if code < 0x10000 else 4


@kernel
def _text_end(units: np.ndarray, row: int) -> np.uint64:
    """Where row `row`'s value ends: after its last non-NUL unit, as NumPy ends a 'U' or 'S' value."""
    end = np.uint64(units.shape[1])
    while end > _ZERO and units[row, end - _ONE] == 0:
        end -= _ONE
    return end


@kernel
def fixed_lengths(units: np.ndarray) -> np.ndarray:
    """Units per row of a fixed-width column's values, each ending at its last non-NUL unit.

    units: the column as unsigned integers, shape (rows, width): a 'S' column as uint8."""
    lengths = np.empty(units.shape[0], np.uint64)
    for row in range(units.shape[0]):
        lengths[row] = _text_end(units, row)
    return lengths


@kernel
def put_fixed(out: np.ndarray, cursor: np.ndarray, start: int, stop: int, units: np.ndarray, lengths: np.ndarray) -> None:
    """Write the first lengths[i] units of row i (as bytes) at its cursor, and advance it."""
    for row in range(start, stop):
        at = cursor[row]
        for j in range(lengths[row]):
            out[at + j] = units[row, j]
        cursor[row] = at + lengths[row]


@kernel
def _row_utf8_length(code_points: np.ndarray, row: int, end: np.uint64, json_escape: bool) -> int:
    """Bytes of one row (the general case: escapes, multi-byte code points), or _NOT_UTF8."""
    total = 0
    for j in range(end):
        width = _code_width(code_points[row, j], json_escape)
        if width == _NOT_UTF8:
            return _NOT_UTF8
        total += width
    return total


@kernel
def utf8_lengths(code_points: np.ndarray, json_escape: bool) -> tuple[np.ndarray, bool]:
    """(bytes per row, whether every row has UTF-8) of a NumPy 'U' column's values.

    code_points: the column viewed as uint32, shape (rows, width); json_escape: count the
    escapes of a JSON string literal (json.dumps' own: `\\"`, `\\\\`, `\\n`..., `\\u00XX`)."""
    rows = code_points.shape[0]
    lengths = np.zeros(rows, np.uint64)
    for row in range(rows):
        end = _text_end(code_points, row)
        plain = True  # printable ASCII without escapes: one byte per code point (branch-free, so it vectorises)
        for j in range(end):
            code = code_points[row, j]
            plain &= (code < 0x80) & (code >= 0x20) & (code != 0x22) & (code != 0x5C)
        if plain:
            lengths[row] = end
            continue
        total = _row_utf8_length(code_points, row, end, json_escape)
        if total == _NOT_UTF8:
            return lengths, False
        lengths[row] = total
    return lengths, True


@kernel
def put_utf8(out: np.ndarray, cursor: np.ndarray, start: int, stop: int, code_points: np.ndarray, lengths: np.ndarray,
             json_escape: bool) -> None:
    """Write each row's UTF-8 (JSON-escaped where asked) at its cursor, and advance it.

    out: the buffer (uint8); cursor: write position per row (uint64); code_points and
    lengths: as `utf8_lengths` took and gave them, which must have found every row encodable."""
    for row in range(start, stop):
        at, end = cursor[row], _text_end(code_points, row)
        cursor[row] = at + lengths[row]
        if lengths[row] == end:  # one byte per code point: all ASCII, none escaped (an escape takes 2 or 6)
            for j in range(end):
                out[at + j] = code_points[row, j]
            continue
        for j in range(end):
            code = code_points[row, j]
            if code < 0x80 and not (json_escape and _escaped(code)):
                out[at] = code
                at += _ONE
            elif code < 0x80:
                out[at] = 0x5C
                if _SHORT_ESCAPE[code] != 0:
                    out[at + _ONE] = _SHORT_ESCAPE[code]
                    at += _TWO
                else:  # \u00XX
                    out[at + _ONE], out[at + np.uint64(2)], out[at + np.uint64(3)] = 0x75, 0x30, 0x30
                    out[at + np.uint64(4)], out[at + np.uint64(5)] = _HEX[code >> 4], _HEX[code & 0xF]
                    at += np.uint64(6)
            elif code < 0x800:
                out[at], out[at + _ONE] = 0xC0 | (code >> 6), 0x80 | (code & 0x3F)
                at += _TWO
            elif code < 0x10000:
                out[at], out[at + _ONE] = 0xE0 | (code >> 12), 0x80 | ((code >> 6) & 0x3F)
                out[at + _TWO] = 0x80 | (code & 0x3F)
                at += np.uint64(3)
            else:
                out[at], out[at + _ONE] = 0xF0 | (code >> 18), 0x80 | ((code >> 12) & 0x3F)
                out[at + _TWO], out[at + np.uint64(3)] = 0x80 | ((code >> 6) & 0x3F), 0x80 | (code & 0x3F)
                at += np.uint64(4)


@kernel
def _magnitude(value: np.int64) -> np.uint64:
    """|value| as uint64 (exact for the most negative int64 too)."""
    if value < 0:
        return np.uint64(-(value + 1)) + _ONE
    return np.uint64(value)


@kernel
def _digits(magnitude: np.uint64) -> np.uint64:
    count = 0
    while count < len(_POWERS) and magnitude >= _POWERS[count]:
        count += 1
    return np.uint64(count + 1)


@kernel
def decimal_lengths(values: np.ndarray) -> np.ndarray:
    """Bytes per row of each int64 value's decimal text (a '-' and digits, no leading zeros)."""
    lengths = np.empty(len(values), np.uint64)
    for row in range(len(values)):
        lengths[row] = _digits(_magnitude(values[row])) + (_ONE if values[row] < 0 else _ZERO)
    return lengths


@kernel
def put_decimal(out: np.ndarray, cursor: np.ndarray, start: int, stop: int, values: np.ndarray) -> None:
    """Write each int64 value's decimal text at its row's cursor, and advance it."""
    for row in range(start, stop):
        at = cursor[row]
        if values[row] < 0:
            out[at] = 0x2D  # '-'
            at += _ONE
        magnitude = _magnitude(values[row])
        end = at + _digits(magnitude)
        cursor[row] = end
        while magnitude >= _TEN:  # two digits at a time, from the last
            pair = _TWO * (magnitude % _HUNDRED)
            magnitude //= _HUNDRED
            out[end - _ONE], out[end - _TWO] = _PAIRS[pair + _ONE], _PAIRS[pair]
            end -= _TWO
        if end > at:
            out[at] = np.uint8(0x30 + magnitude)


@kernel
def put_hex(out: np.ndarray, cursor: np.ndarray, start: int, stop: int, values: np.ndarray) -> None:
    """Write each uint64 value as 16 lowercase hex digits (zero-padded) at its row's cursor, and advance it."""
    for row in range(start, stop):
        at, value = cursor[row], values[row]
        for k in range(16):
            out[at + np.uint64(15 - k)] = _HEX[value & np.uint64(0xF)]
            value >>= np.uint64(4)
        cursor[row] = at + np.uint64(16)


@kernel
def put_literal(out: np.ndarray, cursor: np.ndarray, start: int, stop: int, literal: np.ndarray) -> None:
    """Write the same bytes (uint8) at every row's cursor, and advance it."""
    size = np.uint64(len(literal))
    for row in range(start, stop):
        at = cursor[row]
        for k in range(size):
            out[at + k] = literal[k]
        cursor[row] = at + size


@kernel
def put_flat(out: np.ndarray, cursor: np.ndarray, start: int, stop: int, data: np.ndarray, offsets: np.ndarray) -> None:
    """Write row i's bytes data[offsets[i]:offsets[i + 1]] (offsets uint64) at its cursor, and advance it."""
    for row in range(start, stop):
        at, start = cursor[row], offsets[row]
        size = offsets[row + 1] - start
        for k in range(size):
            out[at + k] = data[start + k]
        cursor[row] = at + size
