"""How many bytes an Arrow IPC stream record holds once its body buffers are decompressed, read
from its message headers before anything is decompressed.

A compressed (LZ4/ZSTD) block a few kilobytes long can expand to gigabytes, and pyarrow's
reader has no limit to give it, so the decoder asks here first and dead-letters a record
past the stream's bound. Each message's metadata is a flatbuffer (Arrow's Message.fbs):
Message { version, header_type, header, bodyLength }, the header a RecordBatch { length,
nodes, buffers: [Buffer { offset, length }], compression } or a DictionaryBatch { id, data:
RecordBatch }. A compressed buffer starts with its uncompressed length as an int64 (-1: the
buffer was left uncompressed). Only those fields are read; a header that cannot be read is
reported as damage (the record is malformed).
"""

from __future__ import annotations

import struct

import pyarrow as pa

_RECORD_BATCH, _DICTIONARY_BATCH = 3, 4  # MessageHeader union tags


class IpcDamage(ValueError):
    """The record's IPC message headers cannot be read."""


def decoded_bytes(value: bytes) -> int:
    """The bytes of every body buffer of the IPC stream `value` once decompressed. Raises
    IpcDamage (or pa.ArrowException) on a stream whose messages cannot be read."""
    total = 0
    try:
        for message in pa.ipc.MessageReader.open_stream(pa.py_buffer(value)):
            if message.body is not None and message.body.size:
                total += _message_bytes(message.metadata.to_pybytes(), message.body)
    except (struct.error, IndexError) as e:
        raise IpcDamage(f"unreadable IPC message header: {e}") from e
    return total


def _message_bytes(meta: bytes, body: pa.Buffer) -> int:
    root = _table(meta, _deref(meta, 0))
    kind_at, header_at = _field(root, 1), _field(root, 2)
    kind = meta[kind_at] if kind_at is not None else 0
    if header_at is None or kind not in (_RECORD_BATCH, _DICTIONARY_BATCH):
        return body.size
    batch = _table(meta, _deref(meta, header_at))
    if kind == _DICTIONARY_BATCH:
        data_at = _field(batch, 1)
        if data_at is None:
            return body.size
        batch = _table(meta, _deref(meta, data_at))
    buffers_at, compression_at = _field(batch, 2), _field(batch, 3)
    if buffers_at is None or compression_at is None:
        return body.size  # uncompressed: the body is what it holds
    vector = _deref(meta, buffers_at)
    count = struct.unpack_from("<I", meta, vector)[0]
    if count * 16 > len(meta):
        raise IpcDamage(f"{count} buffers in a {len(meta)}-byte header")
    total = 0
    for k in range(count):  # bounded by the header's size, itself bounded by the record's
        offset, length = struct.unpack_from("<qq", meta, vector + 4 + 16 * k)
        if length < 8:
            total += max(length, 0)
            continue
        if not 0 <= offset <= body.size - 8:
            raise IpcDamage(f"buffer {k} at {offset} outside a {body.size}-byte body")
        size = struct.unpack_from("<q", body, offset)[0]
        total += length - 8 if size == -1 else max(size, 0)
    return total


def _deref(buf: bytes, at: int) -> int:
    return at + struct.unpack_from("<I", buf, at)[0]


def _table(buf: bytes, at: int) -> tuple[int, list[int]]:
    """A flatbuffer table: its position and its fields' offsets from its vtable (0: absent)."""
    vtable = at - struct.unpack_from("<i", buf, at)[0]
    if not 0 <= vtable < len(buf):
        raise IpcDamage(f"a vtable at {vtable}, outside the header")
    size = struct.unpack_from("<H", buf, vtable)[0]
    if size < 4 or size % 2:
        raise IpcDamage(f"a vtable of {size} bytes")
    return at, [at + o if o else 0 for o in struct.unpack_from(f"<{(size - 4) // 2}H", buf, vtable + 4)]


def _field(table: tuple[int, list[int]], index: int) -> int | None:
    fields = table[1]
    return fields[index] or None if index < len(fields) else None
