"""Fuzz target of the slots' record decoder (schemas/split_records.py), `split` in
tests/fuzz/fuzz.py.

The input's first byte says what the rest spoils of a good record to a slot: even, its value
(the rest laid over the good value's bytes, XOR, and appended where longer); odd, its
`sj-split` header (the rest is the header's text). Whatever the bytes, `decode_split` must
return a SplitRecord whose blocks have the slot's columns, or a reason, never raise; the good
record must read back as written.
"""

from __future__ import annotations

import numpy as np

from streamjoin.engine.block import system_block
from streamjoin.schemas.split_records import SPLIT_HEADER, SplitRecord, decode_split, encode_split

_TUPLES = system_block(np.array([1, 2]), np.array([5, 6]), np.array([0, 0]), np.array([3, 4]), np.array([0, 0]),
                       {"k": np.array([1, 2]), "v": np.array(["a", "bb"])})
TEMPLATES = [_TUPLES.take(np.empty(0, np.int64))] * 2
GOOD = SplitRecord(2, 1, 9, 1_000, True, False, [_TUPLES, _TUPLES.take(np.array([1]))])


def check_split_record(data: bytes) -> None:
    _, value, headers = encode_split(GOOD)
    good = decode_split(value, headers, TEMPLATES)
    assert isinstance(good, SplitRecord) and good.blocks[0]["_off"].tolist() == [3, 4], "the good record was lost"
    if not data:
        return
    mode, rest = data[0], data[1:]
    if mode % 2 == 0:
        spoiled = bytes(a ^ b for a, b in zip(value, rest)) + value[len(rest):] + rest[len(value):]
        out = decode_split(spoiled, headers, TEMPLATES)
    else:
        out = decode_split(value, [(SPLIT_HEADER, rest)], TEMPLATES)
    assert isinstance(out, (SplitRecord, str)), type(out)
    if isinstance(out, str):
        assert out, "a refusal without a reason"
    else:
        assert [b.names for b in out.blocks] == [t.names for t in TEMPLATES], "a record with other columns taken"
