"""Codecs between Kafka records and blocks.

Per-record formats (what ordinary producers write): JSON and Avro, one tuple
per record. Block format (high-rate producers and every internal hop): one
Arrow IPC stream per record holding many tuples.

JSON is decoded a whole poll at a time: in its plainest spelling (flat objects
of int and str fields, no whitespace or escapes) by a numba scanner
(engine/json_scan.py), otherwise by Arrow's C++ JSON reader; only when that
fails does the slow path find the records Arrow refuses (bisecting, with
Python's json to sort and word the reasons; Arrow alone judges, as the two
disagree at the edges: integers past int64, invalid UTF-8, deep nesting,
several values on one line). A value spread over several lines (pretty-printed)
is put on one line first (schemas/json_text.py). Avro rows go to Arrow the same way. Rows that
parse but cannot be tuples (a null or missing field, a non-finite float, an
event time outside +-2^60 ms) are refused as well. Records that cannot become
tuples come back as `Reject`s with a reason, for the dead-letter topic; no
input makes a decoder raise (tests/fuzz holds the fuzz targets that check it).
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, Sequence

import fastavro
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson

from streamjoin.engine import json_scan
from streamjoin.engine.block import ARR, KEY, OFF, PART, TS, Block, system_block
from streamjoin.schemas.columns import binary_array, fixed_width_array, string_array
from streamjoin.schemas.ipc_size import decoded_bytes
from streamjoin.schemas.json_text import check_one_json, one_line_objects, unfold_lines
from streamjoin.settings import StreamSpec

_ARROW_TYPES = {"int": pa.int64(), "float": pa.float64(), "str": pa.string(), "bool": pa.bool_(), "bytes": pa.binary()}
_AVRO_TYPES = {"int": "long", "float": "double", "str": "string", "bool": "boolean", "bytes": "bytes"}
# Block-format records hold many tuples at one Kafka offset; a tuple's offset
# column is (record offset << BLOCK_SHIFT) | index so tuple ids stay unique.
BLOCK_SHIFT = 20
# Event times must lie within +-TIME_BOUND ms (the year 36 million): window and watermark arithmetic
# then stays clear of int64 wrap-around (the engine's NO_TIME is -2^61).
TIME_BOUND = 1 << 60
# A block the repartitioner forwards holds some of a record's tuples, each with its index in that record.
BLOCK_INDEX = "_sj_index"


UNSUPPORTED = "unsupported"  # valid input a column cannot hold as written (a str value ending in U+0000)


@dataclass(frozen=True)
class Reject:
    index: int  # position in the polled batch
    reason: str  # short machine-readable reason: malformed, oversize, unsupported, unknown-stream, late
    detail: str


@dataclass(frozen=True)
class Decoded:
    block: Block
    rejects: list[Reject]
    records: np.ndarray  # per tuple: its record's position in the decoded batch


def arrow_schema(spec: StreamSpec) -> pa.Schema:
    return pa.schema([(name, _ARROW_TYPES[t]) for name, t in spec.fields.items()])


def avro_schema(spec: StreamSpec) -> dict:
    return {
        "type": "record",
        "name": spec.name,
        "namespace": "streamjoin",
        "fields": [{"name": n, "type": _AVRO_TYPES[t]} for n, t in spec.fields.items()],
    }


def join_keys(spec: StreamSpec, table: pa.Table) -> np.ndarray:
    """int64 join key: the value itself for a single int key, else a stable 64-bit hash
    (0 for streams without key fields: ring mode joins on predicates instead)."""
    if not spec.key_fields:
        return np.zeros(table.num_rows, dtype=np.int64)
    if len(spec.key_fields) == 1 and spec.fields[spec.key_fields[0]] == "int":
        return table.column(spec.key_fields[0]).to_numpy().astype(np.int64)
    import pandas as pd  # here, not at the top: 0.4 s of every process's start, and only string keys need it

    frame = pd.DataFrame({k: table.column(k).to_pandas() for k in spec.key_fields})
    return pd.util.hash_pandas_object(frame, index=False).to_numpy().view(np.int64)


def keys_are_exact(spec: StreamSpec) -> bool:
    return len(spec.key_fields) == 1 and spec.fields[spec.key_fields[0]] == "int"


def _numpy_column(col: pa.ChunkedArray, ftype: str) -> np.ndarray:
    if ftype in ("str", "bytes"):
        return fixed_width_array(col, "U" if ftype == "str" else "S")
    return col.to_numpy()


def table_to_block(spec: StreamSpec, table: pa.Table, part: np.ndarray, off: np.ndarray, arr: np.ndarray) -> Block:
    payload = {name: _numpy_column(table.column(name), t) for name, t in spec.fields.items()}
    ts = payload[spec.time_field].astype(np.int64)
    return system_block(join_keys(spec, table), ts, part, off, arr, payload)


def _bad_rows(spec: StreamSpec, table: pa.Table) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows that parsed but cannot be tuples: a mask, and per row why and the dead-letter
    reason (object arrays, "" for good rows). Malformed: a null or missing field, a
    non-finite float (results must stay valid JSON), an event time outside +-TIME_BOUND.
    Oversize: a str or bytes value longer than the stream's max_field_bytes (a column is
    stored at its longest value's width, so one long value would widen every tuple beside it
    and the window after it). Unsupported: a str value ending in U+0000 (as PostgreSQL's
    text refuses U+0000). Vectorised: one pass per column."""
    bad = np.zeros(table.num_rows, dtype=bool)
    why = np.full(table.num_rows, "", dtype=object)
    reason = np.full(table.num_rows, "", dtype=object)

    def flag(mask: np.ndarray, detail: str, kind: str = "malformed") -> None:
        fresh = mask & ~bad
        why[fresh], reason[fresh] = detail, kind
        bad[:] |= fresh

    for name, t in spec.fields.items():
        col = table.column(name)
        if col.null_count:
            flag(col.is_null().to_numpy(zero_copy_only=False), f"missing field {name!r} (or null)")
        if t == "float":
            flag(~np.isfinite(col.fill_null(0.0).to_numpy()), f"field {name!r} is not a finite number")
        if t in ("str", "bytes"):
            lengths = pc.binary_length(col).fill_null(0).to_numpy()
            flag(lengths > spec.max_field_bytes, f"field {name!r} holds more than the stream's "
                 f"max_field_bytes={spec.max_field_bytes} bytes", "oversize")
        if t == "str":
            # A str column is NumPy 'U', which ends each value at its last non-NUL character: a
            # value ending in U+0000 would join, and come out, as the value without it.
            flag(pc.ends_with(col, "\x00").fill_null(False).to_numpy(zero_copy_only=False),
                 f"field {name!r} ends in U+0000, which a text column cannot hold", UNSUPPORTED)
    ts = table.column(spec.time_field).fill_null(0).to_numpy()
    flag((ts <= -TIME_BOUND) | (ts >= TIME_BOUND), f"time field {spec.time_field!r} outside +-2^60 ms")
    return bad, why, reason


def _drop_bad_rows(spec: StreamSpec, table: pa.Table, idx: np.ndarray,
                   rejects: list[Reject]) -> tuple[np.ndarray, pa.Table]:
    """`table` (row r decoded from record idx[r]) without the rows `_bad_rows` refuses,
    which are added to `rejects`."""
    bad, why, reason = _bad_rows(spec, table)
    if not bad.any():
        return idx, table
    rejects += [Reject(int(i), str(r), str(w)) for i, w, r in zip(idx[bad], why[bad], reason[bad])]
    return idx[~bad], table.filter(pa.array(~bad))


class _Unparsable(ValueError):
    """Arrow read a set of records into a table that does not hold one valid row per record."""


def _parse_json(spec: StreamSpec, values: Sequence[bytes]) -> pa.Table:
    """One row per value, or raises (see `_parse_lines`)."""
    return _parse_lines(spec, b"\n".join(values), len(values))


def _parse_lines(spec: StreamSpec, lines: bytes, count: int) -> pa.Table:
    """One row per line of `lines` (`count` records joined by LF), or raises. Lines in the
    plainest spelling are read by engine/json_scan.py; any other batch by Arrow, whose reader
    splits lines at CR as well as LF and reads `{..} {..}` as two rows, so the row count is
    checked; it also lets invalid UTF-8 into string columns, so the table is validated."""
    plain = _plain_table(spec, lines, count)
    if plain is not None:
        return plain
    opts = pajson.ParseOptions(explicit_schema=arrow_schema(spec), unexpected_field_behavior="ignore")
    table = pajson.read_json(io.BytesIO(lines), parse_options=opts)
    if table.num_rows != count:
        raise _Unparsable(f"{table.num_rows} JSON values in {count} records")
    table.validate(full=True)
    return table


@lru_cache(maxsize=256)
def _plain_fields(fields: tuple[tuple[str, str], ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """json_scan's view of a stream's fields (names end to end, their offsets, kinds), or None
    where its plain form cannot hold them: a field of another type than int or str, a name
    JSON would escape, more than json_scan.MAX_FIELDS fields.

    fields: the stream's (name, field type) pairs, in order."""
    kinds = {"int": json_scan.INT_FIELD, "str": json_scan.STR_FIELD}
    names = [name.encode() for name, _ in fields]
    if (len(fields) > json_scan.MAX_FIELDS or any(t not in kinds for _, t in fields)
            or any(json.dumps(name) != f'"{name}"' or not name.isascii() for name, _ in fields)):
        return None
    offsets = np.zeros(len(names) + 1, np.int64)
    np.cumsum([len(n) for n in names], out=offsets[1:])
    return (np.frombuffer(b"".join(names), np.uint8).copy(), offsets,
            np.array([kinds[t] for _, t in fields], np.int64))


def _plain_table(spec: StreamSpec, lines: bytes, count: int) -> pa.Table | None:
    """The table of `count` LF-joined lines when every one is a plain flat object of the stream's
    fields (engine/json_scan.py), else None: Arrow reads the batch."""
    plain = _plain_fields(tuple(spec.fields.items()))
    if plain is None or not count or len(lines) >= 1 << 31:  # a str column's offsets are int32
        return None
    data = np.frombuffer(lines, np.uint8)
    read, ints, starts, ends = json_scan.scan_lines(data, count, *plain)
    if not read:
        return None
    columns = []
    for field, ftype in enumerate(spec.fields.values()):
        if ftype == "int":
            columns.append(pa.array(ints[field]))
        else:
            text, offsets = json_scan.gather(data, starts[field], ends[field])
            columns.append(pa.Array.from_buffers(pa.string(), count, [None, pa.py_buffer(offsets.astype(np.int32)),
                                                                      pa.py_buffer(text)]))
    return pa.Table.from_arrays(columns, schema=arrow_schema(spec))


def _isolate(spec: StreamSpec, build: Callable[[np.ndarray], pa.Table], idx: np.ndarray,
             explain: Callable[[int, Exception], str]) -> tuple[np.ndarray, pa.Table, list[Reject]]:
    """Build a table of the records `idx`; where `build` fails, bisect down to the records it
    refuses and reject those (detail from `explain(record, error)`), keeping the rest.

    build: record positions -> table with one row per position, raising on a bad record.
    Returns (positions kept, their table, rejects). Costs O(bad records x log n) builds."""
    if not len(idx):
        return idx, arrow_schema(spec).empty_table(), []
    try:
        return idx, build(idx), []
    except (pa.ArrowException, _Unparsable, OverflowError, TypeError, UnicodeDecodeError) as e:
        if len(idx) == 1:
            return idx[:0], arrow_schema(spec).empty_table(), [Reject(int(idx[0]), "malformed", explain(int(idx[0]), e))]
    half = len(idx) // 2
    a_idx, a_table, a_rejects = _isolate(spec, build, idx[:half], explain)
    b_idx, b_table, b_rejects = _isolate(spec, build, idx[half:], explain)
    return np.concatenate([a_idx, b_idx]), pa.concat_tables([a_table, b_table]), a_rejects + b_rejects


def decode_json(spec: StreamSpec, values: Sequence[bytes | None], part: np.ndarray, off: np.ndarray,
                arr: np.ndarray) -> Decoded:
    """Records holding one JSON object each -> tuples, and rejects for the rest.

    values: record values (None: a tombstone); part/off/arr: per record its partition,
    offset and arrival time. Never raises."""
    good, joined = one_line_objects(values)
    if joined is None and (unfolded := unfold_lines(values, good)) is not None:
        values = unfolded
        good, joined = one_line_objects(values)
    rejects = [Reject(int(i), "malformed", _describe_unparsable(spec, values[i])) for i in np.flatnonzero(~good)]

    def build(rows: np.ndarray) -> pa.Table:
        return _parse_json(spec, [values[i] for i in rows])  # type: ignore[misc]

    def explain(i: int, e: Exception) -> str:
        return check_one_json(spec, values[i])[0] or f"{type(e).__name__}: {e}"  # type: ignore[arg-type]

    idx = np.flatnonzero(good)
    try:
        if joined is not None:  # every record passed: the lines joined for the check are Arrow's input
            table = _parse_lines(spec, joined, len(values))
        else:
            table = build(idx) if len(idx) else arrow_schema(spec).empty_table()
    except (pa.ArrowException, _Unparsable):
        idx, table = _salvage(spec, values, idx, build, explain, rejects)
    idx, table = _drop_bad_rows(spec, table, idx, rejects)
    return Decoded(table_to_block(spec, table, part[idx], off[idx], arr[idx]), rejects, idx)


def _salvage(spec: StreamSpec, values: Sequence[bytes | None], idx: np.ndarray,
             build: Callable[[np.ndarray], pa.Table], explain: Callable[[int, Exception], str],
             rejects: list[Reject]) -> tuple[np.ndarray, pa.Table]:
    """Slow path after a failed poll: the records `idx` Arrow can take, as a table (in record
    order); the rest added to `rejects`.

    Arrow judges (a record's fate must not depend on its neighbours, or a replay of one
    group's records could decide otherwise than the poll did), but an Arrow call costs ~0.5 ms
    whatever its size, so Python's json sorts first: records it is sure Arrow (or
    `_bad_rows`) refuses are rejected without asking; those it finds fine and those it is
    unsure of are bisected, as two groups, down to the records Arrow refuses."""
    verdicts = [check_one_json(spec, values[i]) for i in idx.tolist()]  # type: ignore[arg-type]
    fine = np.array([problem is None for problem, _ in verdicts], dtype=bool)
    sure = np.array([certain for _, certain in verdicts], dtype=bool)
    rejects += [Reject(int(i), "malformed", verdicts[n][0]) for n, i in enumerate(idx) if sure[n]]  # type: ignore[arg-type]
    parts = [_isolate(spec, build, idx[fine], explain), _isolate(spec, build, idx[~fine & ~sure], explain)]
    kept = np.concatenate([p[0] for p in parts])
    rejects += [r for p in parts for r in p[2]]
    order = np.argsort(kept, kind="stable")
    return kept[order], pa.concat_tables([p[1] for p in parts]).take(order)


def _describe_unparsable(spec: StreamSpec, value: bytes | None) -> str:
    if value is None or not value.strip():
        return "empty value"
    return check_one_json(spec, value)[0] or "JSON value must be an object"


def decode_avro(spec: StreamSpec, values: Sequence[bytes | None], part: np.ndarray, off: np.ndarray,
                arr: np.ndarray) -> Decoded:
    """Records holding one schemaless Avro record each (the stream's avro_schema) -> tuples, and
    rejects. values/part/off/arr as for decode_json. Never raises."""
    # fastavro decodes record by record in C; Avro producers that need the
    # block path's speed should write blocks instead.
    schema = fastavro.parse_schema(avro_schema(spec))
    rows, keep, rejects = [], [], []
    for i, v in enumerate(values):
        try:
            rows.append(fastavro.schemaless_reader(io.BytesIO(v or b""), schema))
            keep.append(i)
        except Exception as e:  # fastavro raises many types on bad bytes
            rejects.append(Reject(i, "malformed", f"not Avro for stream {spec.name}: {type(e).__name__}: {e}"))
    idx = np.asarray(keep, dtype=np.int64)
    row_of = {i: r for r, i in enumerate(keep)}

    def build(records: np.ndarray) -> pa.Table:
        return pa.Table.from_pylist([rows[row_of[i]] for i in records.tolist()], schema=arrow_schema(spec))

    def explain(i: int, e: Exception) -> str:
        return f"Avro record does not fit stream {spec.name}: {type(e).__name__}: {e}"

    # Bytes written with another schema can still read as a record, e.g. a long past int64.
    idx, table, refused = _isolate(spec, build, idx, explain)
    rejects += refused
    idx, table = _drop_bad_rows(spec, table, idx, rejects)
    return Decoded(table_to_block(spec, table, part[idx], off[idx], arr[idx]), rejects, idx)


def read_ipc(value: bytes) -> pa.Table:
    """The table of one Arrow IPC stream record, fully validated: a damaged record can read
    without error yet hold invalid UTF-8 or offsets, which would crash a later conversion.
    Raises pa.ArrowException (OSError for some damage) on a bad record. The stream must end
    where the record does: four zero bytes put in before a batch read as an (old-style) end of
    stream, and the batches after them would be lost without an error."""
    source = pa.BufferReader(value)
    table = pa.ipc.open_stream(source).read_all()
    if source.tell() != len(value):
        raise pa.ArrowInvalid(f"the IPC stream ends at byte {source.tell()} of {len(value)}")
    table.validate(full=True)
    return table


def decode_blocks(spec: StreamSpec, values: Sequence[bytes | None], part: np.ndarray, off: np.ndarray,
                  arr: np.ndarray) -> Decoded:
    """Records holding an Arrow IPC stream of many tuples each -> tuples, and rejects.

    values/part/off/arr as for decode_json. A block is one record: a bad row anywhere (a null,
    a non-finite float, a time out of range) rejects the whole record. Never raises."""
    tables, records, offs, rejects = [], [], [], []
    want = arrow_schema(spec)
    for i, v in enumerate(values):
        try:
            expands_to = decoded_bytes(v or b"")
            if expands_to > spec.max_block_bytes:
                rejects.append(Reject(i, "oversize", f"the block holds {expands_to} bytes decompressed, more than the "
                                                     f"stream's max_block_bytes={spec.max_block_bytes}"))
                continue
            whole = read_ipc(v or b"")
            t = whole.select(list(spec.fields)).cast(want)
            index = _tuple_index(whole)
            if not 0 <= int(off[i]) < 1 << (63 - BLOCK_SHIFT):
                raise ValueError(f"offset {off[i]} does not fit beside {BLOCK_SHIFT} bits of tuple index")
        except (pa.ArrowException, OSError, KeyError, ValueError) as e:  # damaged IPC raises OSError too (IpcDamage: ValueError)
            rejects.append(Reject(i, "malformed", f"not an Arrow IPC block of stream {spec.name}: {e}"))
            continue
        tables.append(t)
        records.append(np.full(t.num_rows, i, np.int64))
        offs.append((np.int64(off[i]) << BLOCK_SHIFT) + index)
    if not tables:
        empty = np.empty(0, np.int64)
        return Decoded(table_to_block(spec, want.empty_table(), empty, empty, empty), rejects, empty)
    table, record, offsets = pa.concat_tables(tables), np.concatenate(records), np.concatenate(offs)
    bad, why, reason = _bad_rows(spec, table)
    if bad.any():
        refused, first = np.unique(record[bad], return_index=True)
        rejects += [Reject(int(i), str(r), f"a tuple of the block: {w}")
                    for i, w, r in zip(refused, why[bad][first], reason[bad][first])]
        keep = ~np.isin(record, refused)
        table, record, offsets = table.filter(pa.array(keep)), record[keep], offsets[keep]
    return Decoded(table_to_block(spec, table, part[record], offsets, arr[record]), rejects, record)


def _tuple_index(table: pa.Table) -> np.ndarray:
    """Each tuple's index in its record: its row, or for a block forwarded by the
    repartitioner (a subset of a record's tuples) the BLOCK_INDEX column it carries."""
    if table.num_rows > 1 << BLOCK_SHIFT:
        raise ValueError(f"{table.num_rows} tuples, more than a record's {1 << BLOCK_SHIFT} tuple indexes")
    if BLOCK_INDEX not in table.column_names:
        return np.arange(table.num_rows, dtype=np.int64)
    index = table.column(BLOCK_INDEX).to_numpy(zero_copy_only=False).astype(np.int64)
    if len(index) and (index.min() < 0 or index.max() >= 1 << BLOCK_SHIFT):
        raise ValueError(f"{BLOCK_INDEX} outside 0..{(1 << BLOCK_SHIFT) - 1}")
    return index


DECODERS = {"json": decode_json, "avro": decode_avro, "blocks": decode_blocks}


def _arrow_column(values: np.ndarray) -> pa.Array:
    """A block column as Arrow, byte for byte (`pa.array` would cut str and bytes values at their
    first NUL); str and bytes keep Arrow's 32-bit-offset types, which every block reader expects."""
    if values.dtype.kind == "S":
        return binary_array(values).cast(pa.binary())
    if values.dtype.kind == "U":
        return string_array(values).cast(pa.string())
    return pa.array(values)


# Schema metadata of an encoded block: the NumPy width of each fixed-width column ('S', 'U').
# Arrow values drop trailing NULs (NumPy cannot tell them from padding), so a block whose values
# all end in NUL bytes (an image whose last pixels are 0) would come back narrower; width-aware
# code (engine.udfs.pixel_similarity reads the itemsize) must see the width that was sent.
_WIDTHS = b"sj-widths"


def encode_block(block: Block) -> bytes:
    """Arrow IPC stream bytes of a block (internal hops, state, results); fixed-width
    columns keep their NumPy width through decode_block."""
    table = pa.table({k: _arrow_column(v) for k, v in block.columns.items()})
    widths = {k: v.dtype.itemsize // (4 if v.dtype.kind == "U" else 1)  # 'U' holds 4 bytes a character
              for k, v in block.columns.items() if v.dtype.kind in "SU"}
    if widths:
        table = table.replace_schema_metadata({_WIDTHS: json.dumps(widths).encode()})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return sink.getvalue().to_pybytes()


def decode_block(data: bytes) -> Block:
    """The block encode_block wrote: the same columns, dtypes and widths."""
    table = pa.ipc.open_stream(data).read_all()
    widths = _widths(table.schema.metadata)
    cols = {}
    for name in table.column_names:
        col = table.column(name)
        if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
            cols[name] = fixed_width_array(col, "U", widths.get(name))
        elif pa.types.is_binary(col.type):
            cols[name] = fixed_width_array(col, "S", widths.get(name))
        else:
            cols[name] = col.to_numpy()
    return Block(cols)


def _widths(metadata: dict[bytes, bytes] | None) -> dict[str, int]:
    """The column widths encode_block recorded (none from another writer, or unreadable: the
    values' own widths are used)."""
    try:
        widths = json.loads((metadata or {}).get(_WIDTHS, b"{}"))
    except ValueError:
        return {}
    if not isinstance(widths, dict):
        return {}
    return {k: v for k, v in widths.items() if isinstance(v, int) and 0 < v <= 1 << 24}


__all__ = [
    "ARR", "KEY", "OFF", "PART", "TS", "BLOCK_INDEX", "BLOCK_SHIFT", "DECODERS", "TIME_BOUND", "Decoded", "Reject",
    "arrow_schema", "avro_schema", "decode_block", "encode_block", "keys_are_exact", "read_ipc",
]
