"""The result record: what a job writes on its results topic, one Kafka
record per result (JSON or Avro), or Arrow IPC blocks of many results for
high-rate internal consumers (`output.format`).

Every encoder takes a whole result block (engine/window_join.py's columns:
result_id_hi, result_id_lo, event_time, produced_ms, then per stream
`s.partition`, `s.offset`, `s.ts`, `s.<field>`) and builds all its records at
once (columns.RowText): the text or bytes every row shares, and per-row pieces
(decimal integers, UTF-8 of NumPy text, Arrow arrays) that numba kernels write
row by row into one buffer. The only per-row Python step is handing the records
over as bytes.

JSON value (compact, keys in this order):
  {"result_id":"<32 hex>","event_time":T,"produced_ms":t,
   "inputs":{"<s>":{"topic":"<source topic>","partition":p,"offset":o[,"index":i]},...},
   "<s>":{"<field>":value,...},...}
  floats as Python's repr (shortest round trip), NaN/Inf as null; strings as
  json.dumps(ensure_ascii=False) writes them; bytes as padded base64. For a
  `format: blocks` stream, offset is the Kafka record's and index the tuple's
  place in it (the engine's tuple offset is (offset << BLOCK_SHIFT) | index).
Avro value: schemaless binary of `results_avro_schema(layout)`.
Key: hash mode the join-key text of the first stream's key fields (so the
record lands on the results partition of its group; of the second stream's
where the first is absent), ring and splitjoin modes the 32-hex id.

Absent members (outer, semi and anti joins): a result may lack the member of
an optional stream (`StreamLayout.optional`). The engine's block marks it with
partition and offset ABSENT (-1) and filler in its ts and field columns. JSON
writes null for both its ref and its fields object ("inputs":{...,"s":null},
...,"s":null), Avro takes the null branch of both unions; blocks keep the
columns as they are, so a blocks reader recognises an absent member by its
partition -1 (offset -1 too) and never reads its filler. Readers return an
absent member as partition and offset ABSENT, ts and fields filler (0, 0.0,
"", b"", False); a null member of a stream that is not optional, or a member
with one of ref and fields null but not the other, is malformed.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from functools import partial
from typing import Callable, Literal, Sequence

import fastavro
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson

from streamjoin.engine.block import Block
from streamjoin.engine.outer import NEWEST_ARRIVAL, optional_streams
from streamjoin.engine.result_ids import (ABSENT, EVENT_TIME, PRODUCED_MS, RESULT_ID_HI, RESULT_ID_LO,
                                          parse_result_id_hex)
from streamjoin.schemas.codecs import BLOCK_SHIFT, Reject, encode_block, read_ipc
from streamjoin.schemas.columns import (RowText, base64_decode, base64_encode, binary_array, fixed_width_array, flat,
                                        from_flat, string_array, to_bytes_list)
from streamjoin.settings import FieldType, JobSettings
from streamjoin.topology.partitioner import key_text

__all__ = ["ROWS_PER_CHUNK", "DROPPED_COLUMNS", "StreamLayout", "ResultLayout", "DecodedResults", "result_layout",
           "result_columns", "json_documents", "encode_json", "avro_values", "encode_avro", "encode_blocks",
           "results_avro_schema", "result_keys", "decode_results"]

ROWS_PER_CHUNK = 50_000  # blocks format: rows per record; fixed, so a replayed batch chunks identically
DROPPED_COLUMNS = (NEWEST_ARRIVAL,)  # internal (delay metrics), never written
_INDEX_MASK = (1 << BLOCK_SHIFT) - 1
_AVRO_TYPES = {"int": "long", "float": "double", "str": "string", "bool": "boolean", "bytes": "bytes"}
_ARROW = {"int": pa.int64(), "float": pa.float64(), "str": pa.string(), "bool": pa.bool_(), "bytes": pa.binary()}
_HEX_ID = r"^[0-9a-f]{32}$"
_VARINT_LIMITS = np.left_shift(np.uint64(1), np.uint64(7) * np.arange(1, 10, dtype=np.uint64))  # a varint byte more
_FILLER = {"int": 0, "float": 0.0, "str": "", "bool": False, "bytes": b""}  # an absent member's values, as the engine's
_AVRO_NULL, _AVRO_RECORD = b"\x00", b"\x02"  # union branches 0 ("null") and 1 (the record), zigzag varints


# ------------------------------------------------------------------ layout


@dataclass(frozen=True)
class StreamLayout:
    """One stream's part of a result record."""

    name: str
    topic: str  # its source topic, named in the record's input refs
    blocks: bool  # format: blocks, so its tuple offsets hold (record offset << BLOCK_SHIFT) | index
    fields: tuple[tuple[str, FieldType], ...]  # job.result_fields(stream), in job order
    time_field: str
    key_fields: tuple[str, ...]
    optional: bool = False  # a result may lack this stream's member (outer, semi, anti joins)


@dataclass(frozen=True)
class ResultLayout:
    """What the result records of a job look like (built once from its settings)."""

    job: str
    mode: Literal["hash", "ring", "splitjoin", "query"]  # the join mode; query: a query service's sink
    streams: tuple[StreamLayout, ...]


def result_layout(job: JobSettings) -> ResultLayout:
    """The result record layout of `job`."""
    return ResultLayout(job.job, job.join.mode, tuple(
        StreamLayout(s.name, job.topic_of(s), s.format == "blocks", tuple(job.result_fields(s).items()), s.time_field,
                     tuple(s.key_fields), optional)
        for s, optional in zip(job.streams, optional_streams(job.join.type, len(job.streams)))))


def result_columns(layout: ResultLayout) -> dict[str, FieldType]:
    """The result block's written columns, in order, with their field types (ids are uint64,
    partitions int32; the rest as named)."""
    cols: dict[str, FieldType] = {RESULT_ID_HI: "int", RESULT_ID_LO: "int", EVENT_TIME: "int", PRODUCED_MS: "int"}
    for s in layout.streams:
        cols |= {f"{s.name}.partition": "int", f"{s.name}.offset": "int", f"{s.name}.ts": "int"}
        cols |= {f"{s.name}.{f}": t for f, t in s.fields}
    return cols


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
    return offsets >> BLOCK_SHIFT, offsets & _INDEX_MASK


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


# -------------------------------------------------------------------- Avro


def _avro_member_type(stream: StreamLayout, record: dict) -> dict | list:
    """A member's Avro type: `record`, or for an optional stream the union ["null", record]."""
    return ["null", record] if stream.optional else record


def results_avro_schema(layout: ResultLayout) -> dict:
    """The Avro schema (.avsc as a dict) of the job's result records. An optional stream's ref and
    fields records are unions with null (an absent member)."""
    refs = [{"name": s.name, "type": _avro_member_type(s, {"type": "record", "name": f"{s.name}_ref", "fields": [
        {"name": "topic", "type": "string"}, {"name": "partition", "type": "int"}, {"name": "offset", "type": "long"},
        *([{"name": "index", "type": "int"}] if s.blocks else [])]})} for s in layout.streams]
    fields = [{"name": s.name, "type": _avro_member_type(s, {"type": "record", "name": f"{s.name}_fields", "fields": [
        {"name": f, "type": _AVRO_TYPES[t]} for f, t in s.fields]})} for s in layout.streams]
    return {"type": "record", "name": "Result", "namespace": f"streamjoin.{layout.job.replace('-', '_')}",
            "fields": [{"name": "result_id", "type": "string"}, {"name": "event_time", "type": "long"},
                       {"name": "produced_ms", "type": "long"},
                       {"name": "inputs", "type": {"type": "record", "name": "Inputs", "fields": refs}},
                       *fields]}


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


# ----------------------------------------------------------------- readers


@dataclass(frozen=True)
class DecodedResults:
    """Results read back from record values, as the result block's columns (`result_columns`,
    the engine's dtypes: uint64 ids, int32 partitions, tuple offsets, NumPy 'U'/'S' text)."""

    columns: dict[str, np.ndarray]
    rejects: list[Reject]  # values that are no result record of the job (index = position in the input)


def decode_results(layout: ResultLayout, fmt: Literal["json", "avro", "blocks"],
                   values: Sequence[bytes | None]) -> DecodedResults:
    """Read result record values of one format; malformed ones come back as rejects, never raise.

    layout: the job's `result_layout`; fmt: output.format they were written in; values: record values."""
    if fmt == "blocks":
        return _decode_blocks(layout, values)
    rejects: list[Reject] = []
    records, index = (_json_records if fmt == "json" else _avro_records)(layout, values, rejects)
    return _checked(layout, records, index, rejects, base64_bytes=fmt == "json")


def _record_schema(layout: ResultLayout, bytes_type: pa.DataType) -> pa.Schema:
    """The nested Arrow schema of a result record. bytes_type: how bytes fields arrive (base64 text in JSON)."""
    refs = pa.struct([(s.name, pa.struct([("topic", pa.string()), ("partition", pa.int64()), ("offset", pa.int64()),
                                          *([("index", pa.int64())] if s.blocks else [])]))
                      for s in layout.streams])
    return pa.schema([("result_id", pa.string()), ("event_time", pa.int64()), ("produced_ms", pa.int64()),
                      ("inputs", refs),
                      *[(s.name, pa.struct([(f, bytes_type if t == "bytes" else _ARROW[t]) for f, t in s.fields]))
                        for s in layout.streams]])


def _read_json(schema: pa.Schema, data: bytes) -> pa.Table:
    """Arrow's C++ JSON reader over newline-separated documents, in one block so none straddles two."""
    return pajson.read_json(io.BytesIO(data), read_options=pajson.ReadOptions(block_size=max(len(data) + 1, 1 << 16)),
                            parse_options=pajson.ParseOptions(explicit_schema=schema,
                                                              unexpected_field_behavior="ignore"))


def _objects_one_per_line(values: Sequence[bytes | None], joined: bytes) -> bool:
    """Whether `joined` (the values joined by newlines) holds one line per value, each opening an
    object: then each line yields at least one row, and n rows mean one each. (A compact record
    opens with "{"; pyarrow 26's reader crashes when the first document is a bare null.)"""
    if joined.count(b"\n") != len(values) - 1 or b"\r" in joined:
        return False
    raw = pa.array(values, pa.binary())
    if raw.null_count:
        return False
    data, offsets = flat(raw)
    starts, ends = offsets[:-1], offsets[1:]
    return bool((ends > starts).all() and (data[starts] == ord("{")).all())


def _json_records(layout: ResultLayout, values: Sequence[bytes | None],
                  rejects: list[Reject]) -> tuple[pa.Table, np.ndarray]:
    """(nested records, their positions in `values`); unparsable values go to `rejects`.
    All at once when every value parses; else value by value, to name the bad ones."""
    schema = _record_schema(layout, pa.string())
    joined = b"\n".join(v or b"" for v in values)
    if values and _objects_one_per_line(values, joined):
        try:
            table = _read_json(schema, joined)
            if table.num_rows == len(values):
                return table, np.arange(len(values))
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            pass
    return _json_one_by_one(schema, values, rejects)


def _json_one_by_one(schema: pa.Schema, values: Sequence[bytes | None],
                     rejects: list[Reject]) -> tuple[pa.Table, np.ndarray]:
    tables, index = [], []
    for i, value in enumerate(values):
        problem = _json_shape_problem(value)
        if problem is None:
            try:
                table = _read_json(schema, value)  # type: ignore[arg-type]
                problem = None if table.num_rows == 1 else f"{table.num_rows} JSON documents in one value"
            except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
                problem = f"not a result record: {e}"
        if problem is None:
            tables.append(table)
            index.append(i)
        else:
            rejects.append(Reject(i, "malformed", problem))
    return (pa.concat_tables(tables) if tables else schema.empty_table()), np.asarray(index, np.int64)


def _json_shape_problem(value: bytes | None) -> str | None:
    """Why one value cannot be read as a one-line JSON object, or None."""
    if value is None or not value.strip():
        return "empty value"
    if b"\n" in value or b"\r" in value:
        return "JSON spread over several lines"
    if not value.lstrip().startswith(b"{"):
        return "not a JSON object"
    return None


def _avro_records(layout: ResultLayout, values: Sequence[bytes | None],
                  rejects: list[Reject]) -> tuple[pa.Table, np.ndarray]:
    """(nested records, their positions in `values`): fastavro record by record (readers are no hot path)."""
    parsed = fastavro.parse_schema(results_avro_schema(layout))
    records, index = [], []
    for i, value in enumerate(values):
        stream = io.BytesIO(value or b"")
        try:
            record = fastavro.schemaless_reader(stream, parsed)
        except Exception as e:  # fastavro raises many types on bad bytes
            rejects.append(Reject(i, "malformed", f"not a result record: {type(e).__name__}: {e}"))
            continue
        if stream.tell() != len(value or b""):
            rejects.append(Reject(i, "malformed", f"{len(value or b'') - stream.tell()} bytes after the record"))
            continue
        records.append(record)
        index.append(i)
    return pa.Table.from_pylist(records, schema=_record_schema(layout, pa.binary())), np.asarray(index, np.int64)


def _absent_column(stream: StreamLayout) -> str:
    """The decoder's column marking the records that lack `stream`'s member. No record column is
    named so: theirs are the record's keys and dotted paths below them, and stream names hold no ':'."""
    return f"{stream.name}:absent"


def _member_nulls(layout: ResultLayout,
                  records: pa.Table) -> tuple[dict[str, np.ndarray], list[tuple[np.ndarray, str]]]:
    """(absent-member mask per `_absent_column`, problems) of nested records (`_record_schema`),
    whose refs (`inputs.<s>`) and fields objects (`<s>`) are null where the record has null.

    An optional stream's member is absent when both are null; one null without the other is
    malformed, and so is a result lacking more than one member. A null member of a stream that is
    not optional is left to `_problems`, which finds its fields missing."""
    absent, problems = {}, []
    lacking = np.zeros(records.num_rows, np.int64)
    for s in (s for s in layout.streams if s.optional):
        ref_null = pc.struct_field(records.column("inputs"), s.name).is_null().to_numpy(zero_copy_only=False)
        fields_null = records.column(s.name).is_null().to_numpy(zero_copy_only=False)
        problems.append((ref_null != fields_null, f"inputs.{s.name} and {s.name}: one is null, the other not"))
        absent[_absent_column(s)] = ref_null & fields_null
        lacking += ref_null & fields_null
    problems.append((lacking > 1, "the result lacks more than one member"))
    return absent, problems


def _absent_by_column(layout: ResultLayout, table: pa.Table) -> dict[str, np.ndarray]:
    """For each flattened column of an optional stream's member (`inputs.<s>.*`, `<s>.*`), the
    rows that lack that member (and so hold null there)."""
    out = {}
    for s in (s for s in layout.streams if s.optional):
        absent = table.column(_absent_column(s)).to_numpy(zero_copy_only=False)
        out |= {name: absent for name in table.column_names
                if name.startswith((f"inputs.{s.name}.", f"{s.name}."))}
    return out


def _problems(layout: ResultLayout, table: pa.Table) -> list[tuple[np.ndarray, str]]:
    """(bad-row mask, reason) for every check a flattened record table must pass. An absent
    member's nulls pass every check: its ref's range checks read nulls as in range."""
    absent = _absent_by_column(layout, table)
    out = [(table.column(name).is_null().to_numpy(zero_copy_only=False) & ~absent.get(name, np.False_),
            f"missing {name}")
           for name in table.column_names if not pa.types.is_floating(table.column(name).type)]  # null float = NaN
    ids = table.column("result_id").fill_null("")
    hex_ids = pc.match_substring_regex(ids, _HEX_ID).to_numpy(zero_copy_only=False)
    out.append((~hex_ids, "result_id is not 32 hex digits"))
    for s in layout.streams:
        ref = f"inputs.{s.name}"
        out.append((pc.not_equal(table.column(f"{ref}.topic"), s.topic).fill_null(False).to_numpy(zero_copy_only=False),
                    f"{ref}.topic is not {s.topic}"))
        out.append((_outside(table.column(f"{ref}.partition"), 0, 2**31 - 1), f"{ref}.partition out of range"))
        top = 2**63 - 1 if not s.blocks else 2**(63 - BLOCK_SHIFT) - 1
        out.append((_outside(table.column(f"{ref}.offset"), 0, top), f"{ref}.offset out of range"))
        if s.blocks:
            out.append((_outside(table.column(f"{ref}.index"), 0, _INDEX_MASK), f"{ref}.index out of range"))
    return out


def _outside(values: pa.ChunkedArray, low: int, high: int) -> np.ndarray:
    v = values.fill_null(low).to_numpy()
    return (v < low) | (v > high)


def _checked(layout: ResultLayout, records: pa.Table, index: np.ndarray, rejects: list[Reject],
             base64_bytes: bool) -> DecodedResults:
    """The valid records as result columns; every other one joins `rejects` with its first problem.

    records: nested records (`_record_schema`); index: their positions in the input;
    base64_bytes: bytes fields arrive as base64 text (JSON)."""
    absent, member_problems = _member_nulls(layout, records)
    # The absent masks ride along as columns, so that every row filter below keeps them in step.
    table = pa.Table.from_arrays([*records.columns, *map(pa.array, absent.values())],
                                 [*records.column_names, *absent]).flatten().flatten()
    # Arrow's JSON reader takes strings without checking their UTF-8: weed those out before any kernel reads them.
    table, index = _without(table, index, _utf8_problems(table) + member_problems, rejects)
    problems = _problems(layout, table)
    if base64_bytes:
        table, base64_problems = _decode_base64_fields(layout, table)
        problems += base64_problems
    table, _ = _without(table, index, problems, rejects)
    rejects.sort(key=lambda r: r.index)
    return DecodedResults(_columns(layout, table), rejects)


def _without(table: pa.Table, index: np.ndarray, problems: list[tuple[np.ndarray, str]],
             rejects: list[Reject]) -> tuple[pa.Table, np.ndarray]:
    """`table` and `index` less the rows with a problem, each rejected once with its first one.

    problems: (bad-row mask, reason) pairs; index: the rows' positions in the input."""
    bad = np.zeros(table.num_rows, bool)
    for mask, reason in problems:
        rejects += [Reject(int(index[row]), "malformed", reason) for row in np.flatnonzero(mask & ~bad)]
        bad |= mask
    return (table.filter(pa.array(~bad)), index[~bad]) if bad.any() else (table, index)


def _utf8_problems(table: pa.Table) -> list[tuple[np.ndarray, str]]:
    """(bad-row mask, reason) for string columns holding invalid UTF-8 (row by row only when some do)."""
    out = []
    for name in table.column_names:
        column = table.column(name)
        if not pa.types.is_string(column.type):
            continue
        try:
            column.validate(full=True)
        except pa.ArrowInvalid:
            raw = column.cast(pa.binary()).to_pylist()
            out.append((np.array([v is not None and not _is_utf8(v) for v in raw], bool), f"{name} is not UTF-8"))
    return out


def _is_utf8(raw: bytes) -> bool:
    try:
        raw.decode()
    except UnicodeDecodeError:
        return False
    return True


def _decode_base64_fields(layout: ResultLayout, table: pa.Table) -> tuple[pa.Table, list[tuple[np.ndarray, str]]]:
    problems = []
    for s in layout.streams:
        for field in (f for f, t in s.fields if t == "bytes"):
            name = f"{s.name}.{field}"
            decoded, ok = base64_decode(table.column(name).combine_chunks().fill_null(""))
            table = table.set_column(table.column_names.index(name), name, decoded)
            problems.append((~ok, f"{name} is not base64"))
    return table, problems


def _numpy(values: pa.ChunkedArray, ftype: FieldType) -> np.ndarray:
    """An Arrow column as the engine's NumPy column of `ftype` (numbers keep their Arrow width;
    a null float is NaN)."""
    if ftype in ("str", "bytes"):
        return fixed_width_array(values, "U" if ftype == "str" else "S")
    return values.to_numpy()


def _member_values(table: pa.Table, name: str, ftype: FieldType, absent: pa.BooleanArray | None) -> np.ndarray:
    """One member column as the engine's NumPy column, the rows lacking the member holding filler.

    table: valid flattened records; name: the column; ftype: its type; absent: those rows (None: none)."""
    values = table.column(name)
    if absent is not None:
        values = pc.if_else(absent, pa.scalar(_FILLER[ftype], values.type), values)
    return _numpy(values, ftype)


def _columns(layout: ResultLayout, table: pa.Table) -> dict[str, np.ndarray]:
    """Result columns of valid flattened records; an absent member as the engine's: partition and
    offset ABSENT, ts and fields filler."""
    ids = table.column("result_id").combine_chunks().cast(pa.large_binary())
    data, offsets = flat(ids)
    hi, lo = parse_result_id_hex(data[offsets[0]:offsets[-1]].view("S32"))
    cols = {RESULT_ID_HI: hi, RESULT_ID_LO: lo, EVENT_TIME: _numpy(table.column("event_time"), "int"),
            PRODUCED_MS: _numpy(table.column("produced_ms"), "int")}
    for s in layout.streams:
        absent = table.column(_absent_column(s)).combine_chunks() if s.optional else None
        value = partial(_member_values, table, absent=absent)
        ref = f"inputs.{s.name}"
        partition, offset = value(f"{ref}.partition", "int"), value(f"{ref}.offset", "int")
        if s.blocks:
            offset = (offset << BLOCK_SHIFT) | value(f"{ref}.index", "int")
        if absent is not None:
            lacking = absent.to_numpy(zero_copy_only=False)
            partition, offset = np.where(lacking, ABSENT, partition), np.where(lacking, ABSENT, offset)
        cols[f"{s.name}.partition"] = partition.astype(np.int32)
        cols[f"{s.name}.offset"] = offset
        cols[f"{s.name}.ts"] = value(f"{s.name}.{s.time_field}", "int")
        cols |= {f"{s.name}.{f}": value(f"{s.name}.{f}", t) for f, t in s.fields}
    return cols


def _block_schema(layout: ResultLayout) -> pa.Schema:
    """The Arrow types of the written result block columns."""
    special = {RESULT_ID_HI: pa.uint64(), RESULT_ID_LO: pa.uint64()} | {
        f"{s.name}.partition": pa.int32() for s in layout.streams}
    return pa.schema([(name, special.get(name, _ARROW[t])) for name, t in result_columns(layout).items()])


def _block_ref_problem(layout: ResultLayout, table: pa.Table) -> str | None:
    """What is wrong with the refs of a block of results, or None: a negative partition or offset,
    unless both are ABSENT in an optional stream (an absent member); more than one member absent.

    table: the block's result columns, without nulls."""
    lacking = np.zeros(table.num_rows, np.int64)
    for s in layout.streams:
        partition = table.column(f"{s.name}.partition").to_numpy()
        offset = table.column(f"{s.name}.offset").to_numpy()
        absent = (partition == ABSENT) & (offset == ABSENT) & s.optional
        if ((partition < 0) | (offset < 0))[~absent].any():
            return f"{s.name}.partition or {s.name}.offset negative" + ("" if s.optional else " (not optional)")
        lacking += absent
    return "a result lacks more than one member" if (lacking > 1).any() else None


def _decode_blocks(layout: ResultLayout, values: Sequence[bytes | None]) -> DecodedResults:
    schema = _block_schema(layout)
    tables, rejects = [], []
    for i, value in enumerate(values):
        try:
            table = read_ipc(value or b"").select(schema.names).cast(schema)
        except (pa.ArrowException, OSError, KeyError, ValueError) as e:  # damaged IPC raises OSError too
            rejects.append(Reject(i, "malformed", f"not an Arrow IPC block of results: {e}"))
            continue
        nulls = [name for name in schema.names if table.column(name).null_count]
        problem = f"nulls in result columns {nulls}" if nulls else _block_ref_problem(layout, table)
        if problem:
            rejects.append(Reject(i, "malformed", problem))
            continue
        tables.append(table)
    table = pa.concat_tables(tables) if tables else schema.empty_table()
    return DecodedResults({name: _numpy(table.column(name), t) for name, t in result_columns(layout).items()}, rejects)
