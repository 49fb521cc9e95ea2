"""A UDF that fails on purpose, importable by ring workers in integration tests."""

from __future__ import annotations

import numpy as np


def close_unless_poison(left: np.ndarray, right: np.ndarray, within: int = 500) -> np.ndarray:
    """|left - right| <= within; raises on the poison value 13 on either side."""
    if (left == 13).any() or (right == 13).any():
        raise ValueError("poison value 13")
    return np.abs(left - right) <= within


def wrong_shape(left: np.ndarray, right: np.ndarray) -> np.ndarray:
    return np.ones(len(left) + 1, dtype=bool)
