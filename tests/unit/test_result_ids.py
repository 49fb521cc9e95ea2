"""Result ids (engine/result_ids.py) against the module docstring's formula in plain Python."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from streamjoin.engine.result_ids import result_id_hex, result_ids
from tests.profiles import examples

MASK = (1 << 64) - 1


def _fnv1a64(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for byte in data:
        h = ((h ^ byte) * 0x100000001B3) & MASK
    return h


def _splitmix(z: int) -> int:
    z = (z + 0x9E3779B97F4A7C15) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def _fmix(z: int) -> int:
    z = (z + 0xD6E8FEB86659FD93) & MASK
    z = ((z ^ (z >> 33)) * 0xFF51AFD7ED558CCD) & MASK
    z = ((z ^ (z >> 33)) * 0xC4CEB9FE1A85EC53) & MASK
    return z ^ (z >> 33)


def _half(seed: int, topic_hash, finalise, refs: list[tuple[str, int, int]]) -> int:  # type: ignore[no-untyped-def]
    h = seed
    for topic, partition, offset in refs:
        for value in (topic_hash(topic), partition & MASK, offset & MASK):
            h = finalise(h ^ value)
    return h


def expected_id(refs: list[tuple[str, int, int]]) -> str:
    hi = _half(0xCBF29CE484222325, lambda t: _fnv1a64(t.encode()), _splitmix, refs)
    lo = _half(0x84222325CBF29CE4, lambda t: _fnv1a64(b"\x01" + t.encode()), _fmix, refs)
    return f"{hi:016x}{lo:016x}"


@settings(max_examples=examples(200), deadline=None)
@given(topics=st.lists(st.text(min_size=1, max_size=8), min_size=1, max_size=3),
       rows=st.integers(0, 6), data=st.data())
def test_ids_are_the_documented_formula(topics: list[str], rows: int, data: st.DataObject) -> None:
    """Any topics, partitions (ABSENT -1 included) and offsets up to int64's limits."""
    partitions = [np.array(data.draw(st.lists(st.integers(-1, 2 ** 31 - 1), min_size=rows, max_size=rows)), np.int32)
                  for _ in topics]
    offsets = [np.array(data.draw(st.lists(st.integers(-1, 2 ** 63 - 1), min_size=rows, max_size=rows)), np.int64)
               for _ in topics]
    hi, lo = result_ids(topics, partitions, offsets)
    got = [bytes(text).decode() for text in result_id_hex(hi, lo).tolist()]
    assert got == [expected_id([(t, int(p[r]), int(o[r])) for t, p, o in zip(topics, partitions, offsets)])
                   for r in range(rows)]
