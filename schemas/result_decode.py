"""The validating reader of result records: JSON, Avro or blocks values back
into the result block's columns (schemas/result_format.py), every malformed
value a reject with its reason, never an exception. A window join's record
whose window_end is not its window_start plus the job's instance size is
malformed too.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from functools import partial
from typing import Literal, Sequence

import fastavro
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson

from streamjoin.engine.result_ids import (ABSENT, EVENT_TIME, PRODUCED_MS, RESULT_ID_HI, RESULT_ID_LO, WINDOW_END,
                                          WINDOW_START, parse_result_id_hex)
from streamjoin.schemas.codecs import BLOCK_SHIFT, Reject, read_ipc
from streamjoin.schemas.columns import base64_decode, fixed_width_array, flat
from streamjoin.schemas.result_format import INDEX_MASK, ResultLayout, StreamLayout, result_columns, results_avro_schema
from streamjoin.settings import FieldType

__all__ = ["DecodedResults", "decode_results"]

_ARROW = {"int": pa.int64(), "float": pa.float64(), "str": pa.string(), "bool": pa.bool_(), "bytes": pa.binary()}
_HEX_ID = r"^[0-9a-f]{32}$"
_FILLER = {"int": 0, "float": 0.0, "str": "", "bool": False, "bytes": b""}  # an absent member's values, as the engine's


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
    window = [(WINDOW_START, pa.int64()), (WINDOW_END, pa.int64())] if layout.window_ms is not None else []
    return pa.schema([("result_id", pa.string()), ("event_time", pa.int64()), *window, ("produced_ms", pa.int64()),
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
    if layout.window_ms is not None:
        out.append((_window_problem(layout, table), f"window_end is not window_start + {layout.window_ms}"))
    for s in layout.streams:
        ref = f"inputs.{s.name}"
        out.append((pc.not_equal(table.column(f"{ref}.topic"), s.topic).fill_null(False).to_numpy(zero_copy_only=False),
                    f"{ref}.topic is not {s.topic}"))
        out.append((_outside(table.column(f"{ref}.partition"), 0, 2**31 - 1), f"{ref}.partition out of range"))
        top = 2**63 - 1 if not s.blocks else 2**(63 - BLOCK_SHIFT) - 1
        out.append((_outside(table.column(f"{ref}.offset"), 0, top), f"{ref}.offset out of range"))
        if s.blocks:
            out.append((_outside(table.column(f"{ref}.index"), 0, INDEX_MASK), f"{ref}.index out of range"))
    return out


def _window_problem(layout: ResultLayout, table: pa.Table) -> np.ndarray:
    """Rows of a window join's results whose end is not their start plus the instance size
    (in int64: a start near the top of the range has no such end, and is malformed)."""
    start = table.column(WINDOW_START).fill_null(0).to_numpy().astype(np.int64)
    end = table.column(WINDOW_END).fill_null(0).to_numpy().astype(np.int64)
    with np.errstate(over="ignore"):
        return (end - start != layout.window_ms) | (end < start)


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
    cols = {RESULT_ID_HI: hi, RESULT_ID_LO: lo, EVENT_TIME: _numpy(table.column("event_time"), "int")}
    if layout.window_ms is not None:
        cols |= {name: _numpy(table.column(name), "int") for name in (WINDOW_START, WINDOW_END)}
    cols[PRODUCED_MS] = _numpy(table.column("produced_ms"), "int")
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
        if problem is None and layout.window_ms is not None and _window_problem(layout, table).any():
            problem = f"window_end is not window_start + {layout.window_ms}"
        if problem:
            rejects.append(Reject(i, "malformed", problem))
            continue
        tables.append(table)
    table = pa.concat_tables(tables) if tables else schema.empty_table()
    return DecodedResults({name: _numpy(table.column(name), t) for name, t in result_columns(layout).items()}, rejects)
