"""Codecs between Kafka records and blocks.

Per-record formats (what ordinary producers write): JSON and Avro, one tuple
per record. Block format (high-rate producers and every internal hop): one
Arrow IPC stream per record holding many tuples.

JSON is decoded a whole poll at a time by Arrow's C++ JSON reader; only when
that fails does the slow path look at records one by one to name the bad ones.
Records that cannot become tuples come back as `Reject`s with a reason, for
the dead-letter topic; they never raise.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from typing import Sequence

import fastavro
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.json as pajson

from streamjoin.engine.block import ARR, KEY, OFF, PART, TS, Block, system_block
from streamjoin.schemas.columns import binary_array, string_array
from streamjoin.settings import StreamSpec

_ARROW_TYPES = {"int": pa.int64(), "float": pa.float64(), "str": pa.string(), "bool": pa.bool_(), "bytes": pa.binary()}
_PY_TYPES = {"int": (int,), "float": (int, float), "str": (str,), "bool": (bool,), "bytes": (str,)}
_AVRO_TYPES = {"int": "long", "float": "double", "str": "string", "bool": "boolean", "bytes": "bytes"}
# Block-format records hold many tuples at one Kafka offset; a tuple's offset
# column is (record offset << BLOCK_SHIFT) | index so tuple ids stay unique.
BLOCK_SHIFT = 20
# A block the repartitioner forwards holds some of a record's tuples, each with its index in that record.
BLOCK_INDEX = "_sj_index"


@dataclass(frozen=True)
class Reject:
    index: int  # position in the polled batch
    reason: str  # short machine-readable reason: malformed, oversize, unknown-stream, late
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
    frame = pd.DataFrame({k: table.column(k).to_pandas() for k in spec.key_fields})
    return pd.util.hash_pandas_object(frame, index=False).to_numpy().view(np.int64)


def keys_are_exact(spec: StreamSpec) -> bool:
    return len(spec.key_fields) == 1 and spec.fields[spec.key_fields[0]] == "int"


def _numpy_column(col: pa.ChunkedArray, ftype: str) -> np.ndarray:
    if ftype in ("str", "bytes"):
        arr = col.to_numpy(zero_copy_only=False)
        return arr.astype("U") if ftype == "str" else arr.astype("S")
    return col.to_numpy()


def table_to_block(spec: StreamSpec, table: pa.Table, part: np.ndarray, off: np.ndarray, arr: np.ndarray) -> Block:
    payload = {name: _numpy_column(table.column(name), t) for name, t in spec.fields.items()}
    ts = payload[spec.time_field].astype(np.int64)
    return system_block(join_keys(spec, table), ts, part, off, arr, payload)


def _null_rows(table: pa.Table) -> np.ndarray:
    mask = np.zeros(table.num_rows, dtype=bool)
    for col in table.columns:
        if col.null_count:
            mask |= col.is_null().to_numpy(zero_copy_only=False)
    return mask


def _check_one_json(spec: StreamSpec, value: bytes) -> str | None:
    """Slow path, used only when a whole poll failed to parse: why is this record bad?"""
    try:
        obj = json.loads(value)
    except (ValueError, UnicodeDecodeError) as e:
        return f"not JSON: {e}"
    if not isinstance(obj, dict):
        return f"JSON value must be an object, got {type(obj).__name__}"
    for name, t in spec.fields.items():
        if name not in obj or obj[name] is None:
            return f"missing field {name!r}"
        v = obj[name]
        if not isinstance(v, _PY_TYPES[t]) or (t in ("int", "float") and isinstance(v, bool)):
            return f"field {name!r} should be {t}, got {type(v).__name__}"
    return None


def _parse_json(spec: StreamSpec, values: Sequence[bytes]) -> pa.Table:
    opts = pajson.ParseOptions(explicit_schema=arrow_schema(spec), unexpected_field_behavior="ignore")
    return pajson.read_json(io.BytesIO(b"\n".join(values)), parse_options=opts)


def decode_json(spec: StreamSpec, values: Sequence[bytes | None], part: np.ndarray, off: np.ndarray,
                arr: np.ndarray) -> Decoded:
    rejects: list[Reject] = []
    good = np.ones(len(values), dtype=bool)
    for i, v in enumerate(values):  # cheap scan for values the line-oriented reader cannot take
        if v is None or b"\n" in v or not v.strip():
            good[i] = False
    try:
        idx = np.flatnonzero(good)
        table = _parse_json(spec, [values[i] for i in idx])
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        idx, table = _salvage(spec, values, good, rejects)
    else:
        rejects += [Reject(int(i), "malformed", _describe_unparsable(spec, values[i])) for i in np.flatnonzero(~good)]
    nulls = _null_rows(table)
    if nulls.any():
        for i in idx[nulls]:
            rejects.append(Reject(int(i), "malformed", _check_one_json(spec, values[i]) or "null field"))
        table = table.filter(pa.array(~nulls))
        idx = idx[~nulls]
    return Decoded(table_to_block(spec, table, part[idx], off[idx], arr[idx]), rejects, idx)


def _describe_unparsable(spec: StreamSpec, value: bytes | None) -> str:
    if value is None or not value.strip():
        return "empty value"
    return _check_one_json(spec, value) or "JSON spread over several lines"


def _salvage(spec: StreamSpec, values: Sequence[bytes | None], good: np.ndarray,
             rejects: list[Reject]) -> tuple[np.ndarray, pa.Table]:
    for i in range(len(values)):
        if not good[i]:
            rejects.append(Reject(i, "malformed", _describe_unparsable(spec, values[i])))
            continue
        problem = _check_one_json(spec, values[i])  # type: ignore[arg-type]
        if problem is not None:
            good[i] = False
            rejects.append(Reject(i, "malformed", problem))
    idx = np.flatnonzero(good)
    return idx, _parse_json(spec, [values[i] for i in idx]) if len(idx) else arrow_schema(spec).empty_table()


def decode_avro(spec: StreamSpec, values: Sequence[bytes | None], part: np.ndarray, off: np.ndarray,
                arr: np.ndarray) -> Decoded:
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
    table = pa.Table.from_pylist(rows, schema=arrow_schema(spec)) if rows else arrow_schema(spec).empty_table()
    return Decoded(table_to_block(spec, table, part[idx], off[idx], arr[idx]), rejects, idx)


def read_ipc(value: bytes) -> pa.Table:
    """The table of one Arrow IPC stream record, fully validated: a damaged record can read
    without error yet hold invalid UTF-8 or offsets, which would crash a later conversion.
    Raises pa.ArrowException (OSError for some damage) on a bad record."""
    table = pa.ipc.open_stream(value).read_all()
    table.validate(full=True)
    return table


def decode_blocks(spec: StreamSpec, values: Sequence[bytes | None], part: np.ndarray, off: np.ndarray,
                  arr: np.ndarray) -> Decoded:
    tables, records, offs, rejects = [], [], [], []
    want = arrow_schema(spec)
    for i, v in enumerate(values):
        try:
            whole = read_ipc(v or b"")
            t = whole.select(list(spec.fields)).cast(want)
            index = _tuple_index(whole)
        except (pa.ArrowException, OSError, KeyError, ValueError) as e:  # damaged IPC raises OSError too
            rejects.append(Reject(i, "malformed", f"not an Arrow IPC block of stream {spec.name}: {e}"))
            continue
        tables.append(t)
        records.append(np.full(t.num_rows, i, np.int64))
        offs.append((np.int64(off[i]) << BLOCK_SHIFT) + index)
    if not tables:
        empty = np.empty(0, np.int64)
        return Decoded(table_to_block(spec, want.empty_table(), empty, empty, empty), rejects, empty)
    table = pa.concat_tables(tables)
    record = np.concatenate(records)
    nulls = _null_rows(table)
    block = table_to_block(spec, table, part[record], np.concatenate(offs), arr[record])
    if nulls.any():
        # A block is one record: a null anywhere rejects the rows, reported against the record.
        block, record = block.filter(~nulls), record[~nulls]
    return Decoded(block, rejects, record)


def _tuple_index(table: pa.Table) -> np.ndarray:
    """Each tuple's index in its record: its row, or for a block forwarded by the
    repartitioner (a subset of a record's tuples) the BLOCK_INDEX column it carries."""
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


def encode_block(block: Block) -> bytes:
    """Arrow IPC stream bytes of a block (internal hops, state, results)."""
    table = pa.table({k: _arrow_column(v) for k, v in block.columns.items()})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return sink.getvalue().to_pybytes()


def decode_block(data: bytes) -> Block:
    table = pa.ipc.open_stream(data).read_all()
    cols = {}
    for name in table.column_names:
        col = table.column(name)
        if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
            cols[name] = col.to_numpy(zero_copy_only=False).astype("U")
        elif pa.types.is_binary(col.type):
            cols[name] = col.to_numpy(zero_copy_only=False).astype("S")
        else:
            cols[name] = col.to_numpy()
    return Block(cols)


__all__ = [
    "ARR", "KEY", "OFF", "PART", "TS", "BLOCK_INDEX", "BLOCK_SHIFT", "DECODERS", "Decoded", "Reject",
    "arrow_schema", "avro_schema", "decode_block", "encode_block", "keys_are_exact", "read_ipc",
]
