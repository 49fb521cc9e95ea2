"""Block columns as Arrow arrays and back, byte for byte, and `RowText`, which builds
many rows of records at once for the encoders (result records, keys, blocks).

NumPy's fixed-width str ('U') and bytes ('S') columns end each value at its
last non-NUL unit; `pa.array` would also cut a value at its first NUL, so
the conversions here keep interior NULs. Arrow arrays use 64-bit offsets
(large_string, large_binary): a block of results may exceed 2 GiB of text.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from streamjoin.engine import text_kernels


def string_array(values: np.ndarray) -> pa.LargeStringArray:
    """A str column (NumPy 'U' or object) as Arrow UTF-8 strings, interior NULs kept.

    values: the column; its strings must be surrogate-free (UTF-8 cannot hold lone surrogates)."""
    values = np.asarray(values)
    if values.dtype.kind == "U":
        text = RowText(pa.large_string(), len(values))
        if text.utf8(values):
            return text.join()
    arr = pa.array(values, pa.large_string())  # object columns; a 'U' one that has no UTF-8 fails here
    # Arrow's NumPy 'U' conversion stops at a NUL; NumPy's own length does not: redo the few that differ.
    cut = np.strings.str_len(values) != pc.utf8_length(arr).to_numpy()
    if cut.any():
        arr = pc.replace_with_mask(arr, pa.array(cut), pa.array(values[cut].tolist(), pa.large_string()))
    return arr


def binary_array(values: np.ndarray) -> pa.LargeBinaryArray:
    """A bytes column (NumPy 'S') as Arrow binary, byte for byte up to each value's last non-NUL byte.

    values: the column."""
    text = RowText(pa.large_binary(), len(values))
    text.fixed(_units(values, np.uint8))
    return text.join()


def _units(values: np.ndarray, unit: type) -> np.ndarray:
    """A fixed-width column as a (rows, width) array of its units ('S': uint8, 'U': uint32)."""
    values = np.ascontiguousarray(values)
    width = values.dtype.itemsize // np.dtype(unit).itemsize
    return values.view(unit).reshape(len(values), width) if width else np.zeros((len(values), 0), unit)


RUN_BYTES = 256 << 10  # records written piece by piece in runs of about this size (RowText.join)


class RowText:
    """Records of many rows built piece by piece, then written into one buffer by the kernels
    of engine/text_kernels.py: bytes every row shares (merged while adjacent), or one piece
    per row (Arrow values, int64 decimals, NumPy text).

    arrow_type: what `join` returns, pa.large_string() or pa.large_binary(); rows: the row count."""

    def __init__(self, arrow_type: pa.DataType, rows: int) -> None:
        self.arrow_type, self.rows = arrow_type, rows
        self.lengths = np.zeros(rows, np.uint64)  # each row's bytes so far
        self.writers: list[tuple[Callable[..., None], tuple]] = []  # (kernel, its arguments after out and cursor)
        self.literal = b""

    def same(self, piece: str | bytes) -> None:
        """Append what every row has here. piece: text (UTF-8) or bytes."""
        self.literal += piece.encode() if isinstance(piece, str) else piece

    def each(self, values: pa.Array) -> None:
        """Append one piece per row. values: a binary-like Arrow array without nulls, one value per row."""
        data, offsets = flat(values)
        self._add(np.diff(offsets).view(np.uint64), text_kernels.put_flat, data, offsets.view(np.uint64))

    def decimal(self, values: np.ndarray) -> None:
        """Append each row's integer as decimal text. values: integers (int64 range), one per row."""
        values = np.ascontiguousarray(values, np.int64)
        self._add(text_kernels.decimal_lengths(values), text_kernels.put_decimal, values)

    def hex(self, values: np.ndarray) -> None:
        """Append each row's value as 16 lowercase hex digits. values: uint64, one per row."""
        self._add(np.full(self.rows, 16, np.uint64), text_kernels.put_hex, np.ascontiguousarray(values, np.uint64))

    def utf8(self, values: np.ndarray, json_escape: bool = False) -> bool:
        """Append each row's text of a NumPy 'U' column as UTF-8 (escaped for a JSON string
        literal where asked, as json.dumps(ensure_ascii=False) escapes), each value ending at its
        last non-NUL character. Returns False, appending nothing, if a value has no UTF-8 (a lone
        surrogate).

        values: the 'U' column, one value per row."""
        code_points = _units(values, np.uint32)
        lengths, encodable = text_kernels.utf8_lengths(code_points, json_escape)
        if encodable:
            self._add(lengths, text_kernels.put_utf8, code_points, lengths, json_escape)
        return encodable

    def fixed(self, units: np.ndarray) -> None:
        """Append each row's value of a fixed-width column, up to its last non-NUL unit.

        units: (rows, width) unsigned integers below 256 (a 'S' column as uint8)."""
        lengths = text_kernels.fixed_lengths(units)
        self._add(lengths, text_kernels.put_fixed, units, lengths)

    def _add(self, lengths: np.ndarray, kernel: Callable[..., None], *args: object) -> None:
        """Append a piece: `lengths` bytes per row, that kernel(out, cursor, *args) writes."""
        self._flush()
        self.lengths += lengths
        self.writers.append((kernel, args))

    def _flush(self) -> None:
        if self.literal:
            literal = np.frombuffer(self.literal, np.uint8)
            self.lengths += np.uint64(len(literal))
            self.writers.append((text_kernels.put_literal, (literal,)))
            self.literal = b""

    def join(self) -> pa.Array:
        """The records, one per row, as an Arrow array of `arrow_type`."""
        self._flush()
        offsets = np.zeros(self.rows + 1, np.uint64)
        np.cumsum(self.lengths, out=offsets[1:])
        out = np.empty(int(offsets[-1]), np.uint8)
        cursor = offsets[:-1].copy()
        for start, stop in _runs(offsets):
            for kernel, args in self.writers:
                kernel(out, cursor, start, stop, *args)
        return pa.Array.from_buffers(self.arrow_type, self.rows, [None, pa.py_buffer(offsets.view(np.int64)),
                                                                  pa.py_buffer(out)])


def _runs(offsets: np.ndarray) -> list[tuple[int, int]]:
    """Rows [start, stop) whose records fill about RUN_BYTES each: every piece is written over a
    run before the next, so a run's bytes stay in the core's cache between pieces (writing each
    piece over a whole block took up to twice as long once a block outgrew the cache)."""
    cuts = np.searchsorted(offsets, np.arange(RUN_BYTES, int(offsets[-1]), RUN_BYTES, dtype=np.uint64))
    bounds = [0, *np.unique(cuts).tolist(), len(offsets) - 1]
    return [(a, b) for a, b in zip(bounds, bounds[1:]) if b > a]


def from_flat(arrow_type: pa.DataType, data: np.ndarray, lengths: np.ndarray) -> pa.Array:
    """An Arrow large_string/large_binary array over concatenated values (no nulls).

    arrow_type: pa.large_string() or pa.large_binary(); data: the values' bytes end to end (uint8);
    lengths: each value's byte length (sums to len(data))."""
    offsets = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return pa.Array.from_buffers(arrow_type, len(lengths), [None, pa.py_buffer(offsets),
                                                           pa.py_buffer(np.ascontiguousarray(data, np.uint8))])


def flat(values: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(data uint8, offsets int64 of len(values) + 1) of an Arrow binary-like array without copying its data.

    values: binary, string, large_binary or large_string, no nulls. Offsets index into data
    (they need not start at 0 when the array is a slice)."""
    if values.null_count:
        raise ValueError("null values have no bytes")
    large = pa.types.is_large_binary(values.type) or pa.types.is_large_string(values.type)
    _, offsets_buf, data_buf = values.buffers()
    offsets = np.frombuffer(offsets_buf, np.int64 if large else np.int32)[values.offset:values.offset + len(values) + 1]
    data = np.frombuffer(data_buf, np.uint8) if data_buf is not None else np.empty(0, np.uint8)
    return data, offsets.astype(np.int64)


def fixed_width_array(values: pa.Array | pa.ChunkedArray, kind: str, width: int | None = None) -> np.ndarray:
    """A text or binary Arrow column as the engine's fixed-width NumPy column, without a Python
    object per value where it can: bytes as 'S', and str as 'U' when every byte is ASCII (its code
    points are its bytes); other text goes through Python strings. As NumPy would hold them, each
    value ends at its last non-NUL unit (trailing NULs are padding, interior ones kept).

    values: string, binary or their large forms, nulls allowed (a null reads as empty); kind: "U" or
    "S"; width: the column's width in units (characters for 'U', bytes for 'S'), at least its
    longest value's; None: the longest value's (at least 1)."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if values.null_count:
        values = values.fill_null("" if pa.types.is_string(values.type) or pa.types.is_large_string(values.type)
                                  else b"")
    data, offsets = flat(values)
    data = data[offsets[0]:offsets[-1]]
    if kind == "U" and len(data) and data.max() >= 0x80:  # multi-byte UTF-8: Python decodes it
        text = values.to_numpy(zero_copy_only=False).astype("U")
        return text.astype(f"U{width}") if width and width > text.dtype.itemsize // 4 else text
    lengths = np.diff(offsets)
    width = max(width or 1, int(lengths.max(initial=0)))
    units = np.zeros((len(lengths), width), np.uint8)
    units[np.arange(width) < lengths[:, None]] = data  # row-major: each value's bytes in order
    return units.astype(np.uint32).view(f"U{width}").ravel() if kind == "U" else units.view(f"S{width}").ravel()


def to_bytes_list(values: pa.Array) -> list[bytes]:
    """The values as Python bytes, e.g. record values or keys for the producer (the one per-row step).

    values: any binary-like Arrow array without nulls."""
    if pa.types.is_string(values.type):
        values = values.cast(pa.binary())  # zero-copy: same buffers
    elif pa.types.is_large_string(values.type):
        values = values.cast(pa.large_binary())
    return values.to_pylist()


_BASE64 = np.frombuffer(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/", np.uint8)
_PAD, _NOT_BASE64 = 64, 255
_BASE64_VALUE = np.full(256, _NOT_BASE64, np.uint8)
_BASE64_VALUE[_BASE64] = np.arange(64, dtype=np.uint8)
_BASE64_VALUE[ord("=")] = _PAD


def base64_encode(values: pa.Array) -> pa.LargeStringArray:
    """Standard, padded base64 (RFC 4648) of every value.

    values: binary-like Arrow array without nulls."""
    data, offsets = flat(values)
    lengths = np.diff(offsets)
    triples = (lengths + 2) // 3
    # Each value's bytes, zero-padded to whole triples, end to end.
    padded = np.zeros(3 * int(triples.sum()), np.uint8)
    moved_by = np.repeat(3 * (np.cumsum(triples) - triples) - offsets[:-1], lengths)
    padded[np.arange(offsets[0], offsets[-1]) + moved_by] = data[offsets[0]:offsets[-1]]
    t = padded.reshape(-1, 3).astype(np.uint32)
    v = (t[:, 0] << 16) | (t[:, 1] << 8) | t[:, 2]
    chars = _BASE64[np.stack([v >> 18, (v >> 12) & 63, (v >> 6) & 63, v & 63], axis=1)].ravel()
    ends, short_by = 4 * np.cumsum(triples), (3 - lengths % 3) % 3  # 1 or 2 '=' where the last triple is short
    chars[ends[short_by == 2] - 2] = ord("=")
    chars[ends[short_by >= 1] - 1] = ord("=")
    return from_flat(pa.large_string(), chars, 4 * triples)


def base64_decode(values: pa.Array) -> tuple[pa.LargeBinaryArray, np.ndarray]:
    """(decoded values, bool mask of the values that were valid padded base64); invalid ones decode to b"".

    values: string-like Arrow array without nulls."""
    data, offsets = flat(values)
    data = data[offsets[0]:offsets[-1]]
    offsets = offsets - offsets[0]
    lengths = np.diff(offsets)
    digits = _BASE64_VALUE[data]
    row_of = np.repeat(np.arange(len(lengths)), lengths)
    pads = np.bincount(row_of, weights=digits == _PAD, minlength=len(lengths)).astype(np.int64)
    invalid = np.bincount(row_of, weights=digits == _NOT_BASE64, minlength=len(lengths)) > 0
    # Padding is "=" or "==" at the very end: the last `pads` digits are all pads. (Two guard
    # digits in front let every value's last two be read; masks drop what belongs to another.)
    guarded, ends = np.concatenate([np.full(2, _NOT_BASE64, np.uint8), digits]), offsets[1:]
    last_is_pad = (lengths > 0) & (guarded[ends + 1] == _PAD)
    second_is_pad = (lengths > 1) & (guarded[ends] == _PAD) & last_is_pad
    ok = (lengths % 4 == 0) & ~invalid & (pads == last_is_pad.astype(np.int64) + second_is_pad)
    keep = ok[row_of]
    quads = np.where(digits == _PAD, 0, digits)[keep].astype(np.uint32).reshape(-1, 4)
    v = (quads[:, 0] << 18) | (quads[:, 1] << 12) | (quads[:, 2] << 6) | quads[:, 3]
    decoded = np.stack([v >> 16, (v >> 8) & 255, v & 255], axis=1).astype(np.uint8).ravel()
    sizes = np.where(ok, 3 * lengths // 4, 0)
    drop = np.zeros(len(decoded), bool)  # the bytes that stand for padding
    decoded_ends = np.cumsum(sizes)
    drop[decoded_ends[ok & (pads >= 1)] - 1] = True
    drop[decoded_ends[ok & (pads == 2)] - 2] = True
    return from_flat(pa.large_binary(), decoded[~drop], sizes - np.where(ok, pads, 0)), ok
