"""Tombstones of an as-of join's table: a record with a null value deletes the row of its
key, as in a compacted Kafka topic. The record's key is the row's join-key text (what a
keyed producer writes, schemas/join_keys.py) and its Kafka timestamp the time of the
deletion.

`as_rows` turns each tombstone into a JSON row of its key fields at that time (the other
fields zero or empty), so that the stream's own decoder reads it like any record and its
checks (time, size, routing) hold for it too; the caller marks those rows deleted. A
tombstone whose key cannot be read back into the key fields stays a null value, which the
decoder dead-letters as malformed.
"""

from __future__ import annotations

import json
from typing import Sequence

import numpy as np

from streamjoin.settings import StreamSpec

_EMPTY = {"int": 0, "float": 0.0, "str": "", "bool": False, "bytes": ""}


def as_rows(spec: StreamSpec, values: Sequence[bytes | None], keys: Sequence[bytes | None],
            timestamps: np.ndarray) -> tuple[list[bytes | None], np.ndarray]:
    """`values` with each tombstone replaced by its row (JSON), and which ones were tombstones."""
    deleted = np.fromiter((v is None for v in values), np.bool_, len(values))
    out = list(values)
    for i in np.flatnonzero(deleted).tolist():  # tombstones only: a table's deletions are rare
        fields = key_fields(spec, keys[i])
        if fields is not None:
            row = {n: _EMPTY[t] for n, t in spec.fields.items()} | fields | {spec.time_field: int(timestamps[i])}
            out[i] = json.dumps(row).encode()
    return out, deleted


def key_fields(spec: StreamSpec, key: bytes | None) -> dict[str, object] | None:
    """The key fields' values a join-key text spells (None: it spells none, exactly)."""
    if key is None:
        return None
    try:
        text = key.decode()
    except UnicodeDecodeError:
        return None
    parts = text.split(",") if len(spec.key_fields) > 1 else [text]
    if len(parts) != len(spec.key_fields):
        return None
    out: dict[str, object] = {}
    for name, part in zip(spec.key_fields, parts):
        ftype = spec.fields[name]
        if ftype == "int":
            try:
                value: object = int(part)
            except ValueError:
                return None
            if str(value) != part:  # "+1", " 1", "01": not the canonical text of any int
                return None
        elif ftype == "bool":
            if part not in ("true", "false"):
                return None
            value = part == "true"
        else:
            value = part
        out[name] = value
    return out
