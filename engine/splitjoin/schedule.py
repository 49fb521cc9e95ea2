"""Which core stores a tuple, over a run whose number of cores changes.

A `Schedule` is a list of epochs: from global sequence number `first_g` on, the
job has `cores` storage cores, and a tuple of stream j with per-stream sequence
number s (1-based, `_sseq`) is stored by core `s mod cores`. Every core derives
the owner itself from numbers every core computes identically, so no one hands
tuples out (the SplitJoin paper's round-robin storage, section 3)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Epoch:
    first_g: int  # the first global sequence number stored under this modulus
    cores: int


@dataclass(frozen=True)
class Schedule:
    epochs: tuple[Epoch, ...]
    switches: int = 0  # how many switches made it: of two schedules of one run, the one with more is newer

    def __post_init__(self) -> None:
        if not self.epochs or self.epochs[0].first_g != 0:
            raise ValueError("a schedule starts with an epoch at sequence 0")
        firsts = [e.first_g for e in self.epochs]
        if firsts != sorted(set(firsts)):
            raise ValueError(f"epochs must start at increasing sequence numbers, got {firsts}")
        if any(e.cores < 1 for e in self.epochs):
            raise ValueError("every epoch needs at least one core")

    @classmethod
    def fixed(cls, cores: int) -> "Schedule":
        return cls((Epoch(0, cores),))

    def switched(self, first_g: int, cores: int) -> "Schedule":
        """This schedule with `cores` from `first_g` on: a new last epoch, or the last one
        replaced when it starts at `first_g` too (two switches met at the same tuple)."""
        last = self.epochs[-1]
        if first_g < last.first_g:
            raise ValueError(f"a switch at {first_g} is behind the last one at {last.first_g}")
        kept = self.epochs[:-1] if first_g == last.first_g else self.epochs
        return Schedule(kept + (Epoch(first_g, cores),), self.switches + 1)

    def before(self, g: int) -> tuple[Epoch, ...]:
        """The epochs that start below `g`."""
        return tuple(e for e in self.epochs if e.first_g < g)

    def cores_at(self, g: int) -> int:
        return self.epochs[self._epoch_index(np.array([g]))[0]].cores

    def owners(self, g: np.ndarray, sseq: np.ndarray) -> np.ndarray:
        """The storing core of each tuple (global sequence `g`, per-stream sequence `sseq`)."""
        cores = np.array([e.cores for e in self.epochs], np.int64)[self._epoch_index(g)]
        return sseq % cores

    def _epoch_index(self, g: np.ndarray) -> np.ndarray:
        firsts = np.array([e.first_g for e in self.epochs], np.int64)
        return np.searchsorted(firsts, g, side="right") - 1

    def first_epoch_of(self, core: int) -> int | None:
        """Where `core` first stores: the start of the first epoch that has it (None: never)."""
        return next((e.first_g for e in self.epochs if core < e.cores), None)

    def stores_after(self, core: int, g: int) -> int | None:
        """Where `core` stores next from sequence `g` on: `g` when the epoch current at `g` has
        it, else the start of the first later epoch that has it (None: it never stores again)."""
        if core < self.cores_at(g):
            return g
        return next((e.first_g for e in self.epochs if e.first_g > g and core < e.cores), None)

    @property
    def max_cores(self) -> int:
        return max(e.cores for e in self.epochs)
