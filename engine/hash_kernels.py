"""Kafka's murmur2 over many keys at once, as a numba loop: each key is a few words, and a
NumPy formulation needs a sort by length and one masked pass per word index (measured: the
routing check, which hashes every input tuple's key, was 4-5% of a worker's main loop)."""

from __future__ import annotations

import numba
import numpy as np

__all__ = ["murmur2_flat"]

_SEED, _M, _MASK = np.uint64(0x9747B28C), np.uint64(0x5BD1E995), np.uint64(0xFFFFFFFF)
_8, _13, _15, _16, _24 = np.uint64(8), np.uint64(13), np.uint64(15), np.uint64(16), np.uint64(24)


@numba.njit(cache=True, nogil=True)
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
