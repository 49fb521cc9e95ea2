"""Built-in UDFs, registered by name in job files (`join.udfs`).

`pixel_similarity` is seed 004's expensive predicate: two RGB images (byte
strings of 3 x pixels) match when at least `threshold` of their bytes differ
by at most `tolerance`. Its cost is proportional to the number of pixels.
"""

from __future__ import annotations

import numpy as np

_CHUNK_BYTES = 32 << 20  # pairs compared per NumPy call, bounded so memory stays flat


def pixel_similarity(left: np.ndarray, right: np.ndarray, threshold: float = 0.9,
                     tolerance: int = 16) -> np.ndarray:
    n = len(left)
    if n == 0:
        return np.zeros(0, dtype=bool)
    width = left.dtype.itemsize
    a = np.frombuffer(np.ascontiguousarray(left).tobytes(), np.uint8).reshape(n, width)
    b = np.frombuffer(np.ascontiguousarray(right).tobytes(), np.uint8).reshape(n, width)
    need = int(np.ceil(threshold * width))
    out = np.empty(n, dtype=bool)
    step = max(1, _CHUNK_BYTES // max(width, 1))
    for lo in range(0, n, step):
        hi = min(n, lo + step)
        diff = np.abs(a[lo:hi].astype(np.int16) - b[lo:hi].astype(np.int16))
        out[lo:hi] = np.count_nonzero(diff <= tolerance, axis=1) >= need
    return out
