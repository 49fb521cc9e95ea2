"""Block columns as Arrow arrays and back, byte for byte, for the encoders
that build whole blocks of records with Arrow compute.

NumPy's fixed-width str ('U') and bytes ('S') columns end each value at its
last non-NUL unit; `pa.array` would also cut a value at its first NUL, so
the conversions here keep interior NULs. Arrow arrays use 64-bit offsets
(large_string, large_binary): a block of results may exceed 2 GiB of text.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


def string_array(values: np.ndarray) -> pa.LargeStringArray:
    """A str column (NumPy 'U' or object) as Arrow UTF-8 strings, interior NULs kept.

    values: the column; its strings must be surrogate-free (UTF-8 cannot hold lone surrogates)."""
    values = np.asarray(values)
    if values.dtype.kind == "O":
        return pa.array(values, pa.large_string())
    arr = pa.array(values, pa.large_string())
    # Arrow's NumPy 'U' conversion stops at a NUL; NumPy's own length does not: redo the few that differ.
    cut = np.strings.str_len(values) != pc.utf8_length(arr).to_numpy()
    if cut.any():
        arr = pc.replace_with_mask(arr, pa.array(cut), pa.array(values[cut].tolist(), pa.large_string()))
    return arr


def binary_array(values: np.ndarray) -> pa.LargeBinaryArray:
    """A bytes column (NumPy 'S') as Arrow binary, byte for byte up to each value's last non-NUL byte.

    values: the column."""
    n, width = len(values), values.dtype.itemsize
    raw = np.frombuffer(np.ascontiguousarray(values).tobytes(), np.uint8).reshape(n, width)
    nonzero = raw != 0
    lengths = np.where(nonzero.any(axis=1), width - np.argmax(nonzero[:, ::-1], axis=1), 0)
    data = raw[np.arange(width) < lengths[:, None]]
    return from_flat(pa.large_binary(), data, lengths)


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


def to_bytes_list(values: pa.Array) -> list[bytes]:
    """The values as Python bytes, e.g. record values or keys for the producer (the one per-row step).

    values: any binary-like Arrow array without nulls."""
    if pa.types.is_string(values.type):
        values = values.cast(pa.binary())  # zero-copy: same buffers
    elif pa.types.is_large_string(values.type):
        values = values.cast(pa.large_binary())
    return values.to_pylist()
