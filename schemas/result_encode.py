"""The result record encoders (JSON, Avro, blocks) and the records' Kafka keys,
as schemas/result_format.py lays them out.

Every encoder takes a whole result block (engine/window_join.py's columns:
result_id_hi, result_id_lo, event_time, a window join's window_start and
window_end, produced_ms, then per stream
`s.partition`, `s.offset`, `s.ts`, `s.<field>`) and builds all its records at
once (columns.RowText): the text or bytes every row shares, and per-row pieces
(decimal integers, UTF-8 of NumPy text, Arrow arrays) that numba kernels write
row by row into one buffer. The only per-row Python step is handing the records
over as bytes.
"""

from __future__ import annotations

import json
from functools import partial
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from streamjoin.engine.block import Block
from streamjoin.engine.outer import NEWEST_ARRIVAL
from streamjoin.engine.result_ids import (ABSENT, EVENT_TIME, PRODUCED_MS, RESULT_ID_HI, RESULT_ID_LO, WINDOW_END,
                                          WINDOW_START)
from streamjoin.schemas.codecs import BLOCK_SHIFT, encode_block
from streamjoin.schemas.columns import (RowText, base64_encode, binary_array, flat, from_flat, string_array,
                                        to_bytes_list)
from streamjoin.schemas.join_keys import key_text
from streamjoin.schemas.result_format import INDEX_MASK, ResultLayout, StreamLayout
from streamjoin.settings import FieldType

__all__ = ["ROWS_PER_CHUNK", "DROPPED_COLUMNS", "json_documents", "encode_json", "avro_values", "encode_avro",
           "encode_blocks", "result_keys"]

ROWS_PER_CHUNK = 50_000  # blocks format: rows per record; fixed, so a replayed batch chunks identically
DROPPED_COLUMNS = (NEWEST_ARRIVAL,)  # internal (delay metrics), never written
_VARINT_LIMITS = np.left_shift(np.uint64(1), np.uint64(7) * np.arange(1, 10, dtype=np.uint64))  # a varint byte more
_AVRO_NULL, _AVRO_RECORD = b"\x00", b"\x02"  # union branches 0 ("null") and 1 (the record), zigzag varints


def _present(stream: StreamLayout, block: Block) -> pa.BooleanArray | None:
    """Per row, whether it holds the stream's member; None where every row does (a stream that
    is not optional, or a block without absent members), so encoders need no choice per row.

    stream: one stream of the layout; block: a result block."""
    if not stream.optional:
        return None
    present = np.asarray(block[f"{stream.name}.partition"]) != ABSENT
    return None if present.all() else pa.array(present)


def _split_offsets(stream: StreamLayout, tuple_offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """(record offsets, indexes within the record or None) of a stream's tuple offsets."""
    offsets = np.asarray(tuple_offsets, np.int64)
    if not stream.blocks:
        return offsets, None
    return offsets >> BLOCK_SHIFT, offsets & INDEX_MASK


# ------------------------------------------------------------ row assembly


def _member(rows: RowText, present: pa.BooleanArray | None, write: Callable[[RowText], None],
            absent: str | bytes) -> None:
    """Append one member's piece: what `write` appends, or `absent` in the rows without it.

    rows: the records being built; present: `_present`'s mask (None: every row has the member, so
    `write` appends to `rows` directly); write: appends the member's pieces to the RowText it is
    given; absent: the piece of an absent member."""
    if present is None:
        write(rows)
        return
    own = RowText(rows.arrow_type, rows.rows)  # the member alone, one piece per row, to choose by row
    write(own)
    rows.each(pc.if_else(present, own.join(), pa.scalar(absent, rows.arrow_type)))


def _put_hex_id(rows: RowText, block: Block) -> None:
    """Append each result's id as its 32 hex digits (`result_id_hex`'s text), hi first."""
    rows.hex(block[RESULT_ID_HI])
    rows.hex(block[RESULT_ID_LO])


def _hex_ids(block: Block) -> pa.LargeStringArray:
    """The 32-hex result ids (ASCII) as an Arrow string array, without a per-row step."""
    rows = RowText(pa.large_string(), len(block))
    _put_hex_id(rows, block)
    return rows.join()


# -------------------------------------------------------------------- JSON

_JSON_SHORT_ESCAPES = {0x22: '\\"', 0x5C: "\\\\", 0x08: "\\b", 0x0C: "\\f", 0x0A: "\\n", 0x0D: "\\r", 0x09: "\\t"}
# What json.dumps(ensure_ascii=False) escapes: " \ and the control characters below 0x20.
_JSON_ESCAPES = {c: _JSON_SHORT_ESCAPES.get(c, f"\\u{c:04x}") for c in [*range(0x20), 0x22, 0x5C]}


def _json_text(values: pa.LargeStringArray) -> pa.LargeStringArray:
    """Strings escaped for a JSON string literal (without the quotes). Only rows that hold a
    character to escape go through the replacements, and only for the characters present."""
    data, offsets = flat(values)
    data, offsets = data[offsets[0]:offsets[-1]], offsets - offsets[0]
    needs = (data < 0x20) | (data == 0x22) | (data == 0x5C)  # 10x faster than a 256-entry lookup
    if not needs.any():
        return values
    seen = np.concatenate([[0], np.cumsum(needs)])
    rows = seen[offsets[1:]] > seen[offsets[:-1]]
    escaped = values.filter(pa.array(rows))
    present = np.unique(data[needs])
    for char in sorted(present.tolist(), key=lambda c: c != 0x5C):  # backslash first: later escapes add some
        escaped = pc.replace_substring(escaped, chr(char), _JSON_ESCAPES[char])
    return pc.replace_with_mask(values, pa.array(rows), escaped)


def _float_text(values: np.ndarray) -> np.ndarray:
    """Shortest round-trip text ('U'), as Python's repr (NumPy's float-to-str cast is the same
    algorithm, in C), so integral values keep their ".0"; NaN and infinities are null."""
    values = np.asarray(values, np.float64)
    text = values.astype(str)
    finite = np.isfinite(values)
    return text if finite.all() else np.where(finite, text, "null")


def _json_value(rows: RowText, values: np.ndarray, ftype: FieldType) -> None:
    """Append one field's JSON values. values: the block column; ftype: its field type."""
    if ftype == "int":
        rows.decimal(values)
    elif ftype == "float":
        rows.utf8(_float_text(values))  # ASCII: it always has UTF-8
    elif ftype == "bool":
        rows.each(pa.array(np.asarray(values, np.bool_)).cast(pa.large_string()))
    else:
        rows.same('"')
        if ftype == "bytes":
            rows.each(base64_encode(binary_array(values)))
        elif values.dtype.kind != "U" or not rows.utf8(values, json_escape=True):  # object text, or no UTF-8
            rows.each(_json_text(string_array(values)))
        rows.same('"')


def _quoted(name: str) -> str:
    return json.dumps(name, ensure_ascii=False)


def _json_ref(rows: RowText, stream: StreamLayout, block: Block) -> None:
    """Append one stream's ref object. stream: its layout; block: a result block."""
    offsets, index = _split_offsets(stream, block[f"{stream.name}.offset"])
    rows.same(f'{{"topic":{_quoted(stream.topic)},"partition":')
    rows.decimal(block[f"{stream.name}.partition"])
    rows.same(',"offset":')
    rows.decimal(offsets)
    if index is not None:
        rows.same(',"index":')
        rows.decimal(index)
    rows.same("}")


def _json_fields(rows: RowText, stream: StreamLayout, block: Block) -> None:
    """Append one stream's fields object. stream: its layout; block: a result block."""
    rows.same("{")
    for j, (field, ftype) in enumerate(stream.fields):
        rows.same(f'{"," if j else ""}{_quoted(field)}:')
        _json_value(rows, block[f"{stream.name}.{field}"], ftype)
    rows.same("}")


def _json_inputs(rows: RowText, layout: ResultLayout, block: Block) -> None:
    rows.same(',"inputs":{')
    for i, s in enumerate(layout.streams):
        rows.same(f'{"," if i else ""}{_quoted(s.name)}:')
        _member(rows, _present(s, block), partial(_json_ref, stream=s, block=block), "null")
    rows.same("}")


def json_documents(layout: ResultLayout, block: Block) -> pa.LargeStringArray:
    """The JSON value of every result, as an Arrow string array.

    layout: the job's `result_layout`; block: a result block (extra columns are ignored)."""
    rows = RowText(pa.large_string(), len(block))
    rows.same('{"result_id":"')
    _put_hex_id(rows, block)
    rows.same('","event_time":')
    rows.decimal(block[EVENT_TIME])
    if layout.window_ms is not None:
        rows.same(',"window_start":')
        rows.decimal(block[WINDOW_START])
        rows.same(',"window_end":')
        rows.decimal(block[WINDOW_END])
    rows.same(',"produced_ms":')
    rows.decimal(block[PRODUCED_MS])
    _json_inputs(rows, layout, block)
    for s in layout.streams:
        rows.same(f",{_quoted(s.name)}:")
        _member(rows, _present(s, block), partial(_json_fields, stream=s, block=block), "null")
    rows.same("}")
    return rows.join()


def encode_json(layout: ResultLayout, block: Block) -> list[bytes]:
    """One compact JSON document (UTF-8) per result of `block`, in block order.

    layout: the job's `result_layout`; block: a result block."""
    return to_bytes_list(json_documents(layout, block))


def _varints(values: np.ndarray) -> pa.LargeBinaryArray:
    """Avro's zigzag varint of every value (int and long encode alike). values: integers (int64 range)."""
    v = np.asarray(values, np.int64)
    zigzag = (v.view(np.uint64) << np.uint64(1)) ^ (v >> 63).view(np.uint64)
    sizes = 1 + np.searchsorted(_VARINT_LIMITS, zigzag, side="right")
    width = int(sizes.max()) if len(sizes) else 1
    encoded = np.empty((len(v), width), np.uint8)  # 7 bits per byte, low first; all but the last set bit 7
    for k in range(width):
        low7 = ((zigzag >> np.uint64(7 * k)) & np.uint64(0x7F)).astype(np.uint8)
        encoded[:, k] = low7 | ((sizes > k + 1).astype(np.uint8) << np.uint8(7))
    data = encoded.ravel() if (sizes == width).all() else encoded[np.arange(width) < sizes[:, None]]
    return from_flat(pa.large_binary(), data, sizes)


def _avro_lengths(values: pa.Array) -> pa.LargeBinaryArray:
    """The varint length prefix of every string/bytes value."""
    _, offsets = flat(values)
    return _varints(np.diff(offsets))


def _avro_value(rows: RowText, values: np.ndarray, ftype: FieldType) -> None:
    """Append one field's Avro encoding. values: the block column; ftype: its field type."""
    n = len(values)
    if ftype == "int":
        rows.each(_varints(values))
    elif ftype == "float":
        rows.each(from_flat(pa.large_binary(), np.asarray(values, "<f8").view(np.uint8), np.full(n, 8)))
    elif ftype == "bool":
        rows.each(from_flat(pa.large_binary(), np.asarray(values, np.bool_).view(np.uint8), np.ones(n, np.int64)))
    else:
        raw = string_array(values) if ftype == "str" else binary_array(values)
        rows.each(_avro_lengths(raw))
        rows.each(raw)


def _varint(value: int) -> bytes:
    return _varints(np.array([value])).to_pylist()[0]


def _avro_literal_string(text: str) -> bytes:
    """A string every row shares, Avro-encoded."""
    raw = text.encode()
    return _varint(len(raw)) + raw


def _avro_ref(rows: RowText, stream: StreamLayout, block: Block) -> None:
    """Append one stream's ref record. stream: its layout; block: a result block."""
    offsets, index = _split_offsets(stream, block[f"{stream.name}.offset"])
    rows.same(_avro_literal_string(stream.topic))
    rows.each(_varints(block[f"{stream.name}.partition"]))
    rows.each(_varints(offsets))
    if index is not None:
        rows.each(_varints(index))


def _avro_fields(rows: RowText, stream: StreamLayout, block: Block) -> None:
    """Append one stream's fields record. stream: its layout; block: a result block."""
    for field, ftype in stream.fields:
        _avro_value(rows, block[f"{stream.name}.{field}"], ftype)


def _avro_member(rows: RowText, stream: StreamLayout, block: Block, write: Callable[[RowText], None]) -> None:
    """Append one member (ref or fields record) that `write` appends; an optional stream's goes
    in its union: branch 1 then the record, or branch 0 (null) in the rows without it."""
    if not stream.optional:
        write(rows)
        return

    def branch(r: RowText) -> None:
        r.same(_AVRO_RECORD)
        write(r)

    _member(rows, _present(stream, block), branch, _AVRO_NULL)


def avro_values(layout: ResultLayout, block: Block) -> pa.LargeBinaryArray:
    """The schemaless Avro value of every result, as an Arrow binary array.

    layout: the job's `result_layout`; block: a result block."""
    rows = RowText(pa.large_binary(), len(block))
    rows.same(_varint(32))  # the id's length prefix
    _put_hex_id(rows, block)
    rows.each(_varints(block[EVENT_TIME]))
    if layout.window_ms is not None:
        rows.each(_varints(block[WINDOW_START]))
        rows.each(_varints(block[WINDOW_END]))
    rows.each(_varints(block[PRODUCED_MS]))
    for s in layout.streams:
        _avro_member(rows, s, block, partial(_avro_ref, stream=s, block=block))
    for s in layout.streams:
        _avro_member(rows, s, block, partial(_avro_fields, stream=s, block=block))
    return rows.join()


def encode_avro(layout: ResultLayout, block: Block) -> list[bytes]:
    """One schemaless Avro value (`results_avro_schema`) per result of `block`, in block order.

    layout: the job's `result_layout`; block: a result block."""
    return to_bytes_list(avro_values(layout, block))


# ------------------------------------------------------------------ blocks


def encode_blocks(block: Block) -> list[bytes]:
    """Arrow IPC stream records of `block` without the internal columns, ROWS_PER_CHUNK rows at
    most each (none for an empty block: commits travel on the commits topic). An absent member
    keeps its columns: partition and offset ABSENT (-1), by which readers recognise it, and
    filler that readers must not take for values."""
    written = {k: v for k, v in block.columns.items() if k not in DROPPED_COLUMNS}
    return [encode_block(Block({k: v[start:start + ROWS_PER_CHUNK] for k, v in written.items()}))
            for start in range(0, len(block), ROWS_PER_CHUNK)]


# -------------------------------------------------------------------- keys


def _key_text(stream: StreamLayout, block: Block) -> pa.LargeBinaryArray:
    """The join-key text of `stream`'s member in every row of `block`."""
    types = dict(stream.fields)
    return key_text([(block[f"{stream.name}.{k}"], types[k]) for k in stream.key_fields])


def result_keys(layout: ResultLayout, block: Block) -> pa.LargeBinaryArray:
    """The Kafka key of every result: hash mode the join-key text of the first stream's key
    fields (the second stream's where the first is absent: right and full joins; the settings
    give both the same key types, so equal keys have equal text), ring and splitjoin modes and
    the query service's sinks the 32-hex result id. Feed it to `partitions_for_keys` for the results partitions and to
    `columns.to_bytes_list` for the producer.

    layout: the job's `result_layout`; block: a result block."""
    if layout.mode != "hash":
        return _hex_ids(block).cast(pa.large_binary())
    first = layout.streams[0]
    present = _present(first, block)
    if present is None:
        return _key_text(first, block)
    return pc.if_else(present, _key_text(first, block), _key_text(layout.streams[1], block))

