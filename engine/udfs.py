"""Built-in UDFs, registered by name in job files (`join.udfs`).

`pixel_similarity` is the PSP paper's expensive predicate: two RGB images (byte
strings of 3 x pixels) match when at least `threshold` of their bytes differ
by at most `tolerance`. Its cost is proportional to the number of pixels.
"""

from __future__ import annotations

import numpy as np

_CHUNK_BYTES = 32 << 20  # pairs compared per NumPy call, bounded so memory stays flat


def pixel_similarity(left: np.ndarray, right: np.ndarray, threshold: float = 0.9,
                     tolerance: int = 16) -> np.ndarray:
    """Per pair k, whether images left[k] and right[k] (NumPy 'S' arrays of equal length)
    are similar; the two columns may differ in width (NumPy pads with NUL bytes, and a value
    is compared as padded to the wider one)."""
    n = len(left)
    if n == 0:
        return np.zeros(0, dtype=bool)
    width = max(left.dtype.itemsize, right.dtype.itemsize)
    a, b = (np.frombuffer(np.ascontiguousarray(side.astype(f"S{width}")).tobytes(), np.uint8).reshape(n, width)
            for side in (left, right))
    need = int(np.ceil(threshold * width))
    out = np.empty(n, dtype=bool)
    step = max(1, _CHUNK_BYTES // max(width, 1))
    for lo in range(0, n, step):
        hi = min(n, lo + step)
        diff = np.abs(a[lo:hi].astype(np.int16) - b[lo:hi].astype(np.int16))
        out[lo:hi] = np.count_nonzero(diff <= tolerance, axis=1) >= need
    return out
