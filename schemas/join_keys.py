"""The canonical join-key text: what a record's key holds, what a hash-mode
result's key holds, and what Kafka's partitioner hashes (topology/partitioner.py).

The key fields' values as text joined by ",": int -> decimal ASCII, str -> its
UTF-8, bool -> true/false (what Spark's concat_ws(",", cast(string)) writes).
`key_bytes` writes one value, `key_text` whole blocks of rows.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from streamjoin.schemas.columns import string_array
from streamjoin.settings import FieldType

__all__ = ["key_bytes", "key_text"]


def key_bytes(value: object) -> bytes:
    """The record key streamjoin's producers write for a one-field join-key value
    (the canonical key text: bools as true/false, like `key_text`)."""
    if isinstance(value, (bool, np.bool_)):
        return b"true" if value else b"false"
    return str(value).encode()


def _field_text(values: np.ndarray, ftype: FieldType) -> pa.LargeStringArray:
    """One key field's values in the canonical text.

    values: a block column (int64, NumPy 'U' or object str, bool); ftype: its field type."""
    if ftype == "int":
        return pa.array(np.asarray(values, np.int64)).cast(pa.large_string())
    if ftype == "bool":
        return pa.array(np.asarray(values, np.bool_)).cast(pa.large_string())  # Arrow writes true/false
    if ftype == "str":
        return string_array(values)
    raise ValueError(f"join keys are int, str or bool fields, not {ftype}")


def key_text(columns: Sequence[tuple[np.ndarray, FieldType]]) -> pa.LargeBinaryArray:
    """The canonical join-key text of every row, as an Arrow large_binary array.

    columns: the key fields in key order, each (values, field type), equal lengths."""
    if not columns:
        raise ValueError("a join key has at least one field")
    texts = [_field_text(values, ftype) for values, ftype in columns]
    joined = texts[0] if len(texts) == 1 else pc.binary_join_element_wise(*texts, pa.scalar(",", pa.large_string()))
    return joined.cast(pa.large_binary())
