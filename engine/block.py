"""A block of tuples: equal-length NumPy columns. Everything on the hot path
moves as blocks; nothing here loops over tuples in Python.

System columns every stream block carries (payload fields sit beside them):
  KEY  int64   join key (the value for one int key, else a 64-bit hash)
  TS   int64   event time, epoch ms
  PART int32   source partition (= partition group)
  OFF  int64   source offset
  ARR  int64   wall-clock arrival, epoch ms (the Kafka record timestamp)
Tumbling and hopping window joins add one (engine/window_instances.py):
  WIN  int64   the start of the window instance a tuple's copy belongs to
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping

import numpy as np

KEY, TS, PART, OFF, ARR = "_key", "_ts", "_part", "_off", "_arr"
SYSTEM_COLUMNS = (KEY, TS, PART, OFF, ARR)
WIN = "_win"  # window joins only: a copy's instance start; stored in blocks, so the name is part of the format
_SYSTEM_DTYPES = {KEY: np.int64, TS: np.int64, PART: np.int32, OFF: np.int64, ARR: np.int64}


@dataclass(frozen=True)
class Block:
    columns: Mapping[str, np.ndarray] = field(default_factory=dict)

    def __post_init__(self) -> None:
        lengths = {len(v) for v in self.columns.values()}
        if len(lengths) > 1:
            raise ValueError(f"block columns differ in length: {lengths}")

    def __len__(self) -> int:
        for v in self.columns.values():
            return len(v)
        return 0

    def __getitem__(self, name: str) -> np.ndarray:
        return self.columns[name]

    @property
    def names(self) -> list[str]:
        return list(self.columns)

    @property
    def nbytes(self) -> int:
        # Strings are fixed-width NumPy unicode columns, so this is exact.
        return sum(v.nbytes for v in self.columns.values())

    def take(self, idx: np.ndarray) -> "Block":
        return Block({k: v[idx] for k, v in self.columns.items()})

    def filter(self, mask: np.ndarray) -> "Block":
        return Block({k: v[mask] for k, v in self.columns.items()})


def concat(blocks: Iterable[Block]) -> Block:
    blocks = [b for b in blocks if b.columns]
    if not blocks:
        return Block()
    names = blocks[0].names
    return Block({n: np.concatenate([b[n] for b in blocks]) for n in names})


def system_block(key: np.ndarray, ts: np.ndarray, part: np.ndarray, off: np.ndarray, arr: np.ndarray,
                 payload: Mapping[str, np.ndarray] | None = None) -> Block:
    cols = {KEY: key, TS: ts, PART: part, OFF: off, ARR: arr}
    cols = {k: np.asarray(v, dtype=_SYSTEM_DTYPES[k]) for k, v in cols.items()}
    cols.update(payload or {})
    return Block(cols)
