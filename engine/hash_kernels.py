"""Hashes over many rows at once, as numba loops:

- Kafka's murmur2 of many keys: each key is a few words, and a NumPy formulation needs a sort
  by length and one masked pass per word index (measured: the routing check, which hashes every
  input tuple's key, was 4-5% of a worker's main loop; 45 -> 5.5 ns a key);
- result ids (engine/result_ids.py): twelve finaliser rounds of seven NumPy passes each for a
  2-way join's id, about 290 ns a result, where one loop keeps each row in registers."""

from __future__ import annotations

import numpy as np

from streamjoin.engine.jit import kernel

__all__ = ["murmur2_flat", "id_half"]

_SEED, _M, _MASK = np.uint64(0x9747B28C), np.uint64(0x5BD1E995), np.uint64(0xFFFFFFFF)
_8, _13, _15, _16, _24 = np.uint64(8), np.uint64(13), np.uint64(15), np.uint64(16), np.uint64(24)


@kernel
def murmur2_flat(data: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Kafka's `Utils.murmur2` (seed 0x9747b28c) of every key, as uint32 (view it as int32 for
    Kafka's signed value).

    data: the keys' bytes end to end (uint8); offsets: key i is data[offsets[i]:offsets[i + 1]]
    (uint64). Arithmetic is in uint64, masked to 32 bits where Java's int would wrap."""
    keys = len(offsets) - 1
    hashes = np.empty(keys, np.uint32)
    for key in range(keys):
        at, end = offsets[key], offsets[key + 1]
        h = (_SEED ^ (end - at)) & _MASK
        while end - at >= np.uint64(4):
            k = (np.uint64(data[at]) | (np.uint64(data[at + np.uint64(1)]) << _8)
                 | (np.uint64(data[at + np.uint64(2)]) << _16) | (np.uint64(data[at + np.uint64(3)]) << _24))
            k = (k * _M) & _MASK
            k ^= k >> _24
            k = (k * _M) & _MASK
            h = ((h * _M) & _MASK) ^ k
            at += np.uint64(4)
        tail = end - at
        if tail == np.uint64(3):
            h ^= np.uint64(data[at + np.uint64(2)]) << _16
        if tail >= np.uint64(2):
            h ^= np.uint64(data[at + np.uint64(1)]) << _8
        if tail >= np.uint64(1):
            h ^= np.uint64(data[at])
            h = (h * _M) & _MASK
        h ^= h >> _13
        h = (h * _M) & _MASK
        h ^= h >> _15
        hashes[key] = np.uint32(h)
    return hashes


@kernel
def _finalise(x: np.uint64, constants: np.ndarray) -> np.uint64:
    z = x + constants[0]
    z = (z ^ (z >> constants[1])) * constants[2]
    z = (z ^ (z >> constants[3])) * constants[4]
    return z ^ (z >> constants[5])


@kernel
def id_half(seed: np.uint64, topic_hashes: np.ndarray, constants: np.ndarray, partitions: np.ndarray,
            offsets: np.ndarray) -> np.ndarray:
    """One half of every result's id (engine/result_ids.py's formula): per row, from `seed`, for
    each stream s in order, h = f(h ^ topic_hashes[s]), then f(h ^ partition), then f(h ^ offset),
    with f the finaliser whose six uint64 constants are `constants` (add, shift, multiply,
    shift, multiply, shift); all arithmetic mod 2**64.

    partitions, offsets: (streams, rows) as uint64 (the int64 refs' bits)."""
    rows = partitions.shape[1]
    hashes = np.empty(rows, np.uint64)
    for row in range(rows):
        h = seed
        for stream in range(len(topic_hashes)):
            h = _finalise(h ^ topic_hashes[stream], constants)
            h = _finalise(h ^ partitions[stream, row], constants)
            h = _finalise(h ^ offsets[stream, row], constants)
        hashes[row] = h
    return hashes
