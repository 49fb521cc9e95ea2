"""Heavy hitters: the keys that carry a large share of a stream of keys, in bounded memory.

A Misra-Gries summary with `capacity` counters, merged a whole batch at a time (the summaries
are mergeable: Agarwal et al., "Mergeable summaries", PODS 2012): the batch's exact counts
(one `np.unique`) are added to the summary's, and when more than `capacity` keys remain,
the (capacity+1)-th largest count is subtracted from every count and the keys left at zero
or below are dropped. With n keys counted, every estimate `c` of a key whose true count is
`f` satisfies

    f - n / (capacity + 1)  <=  c  <=  f

so a key whose true share exceeds 1 / (capacity + 1) is always in the summary, and an
estimate never overstates: a key reported at share s has a true share of at least s.
A batch costs a sort of the batch and of at most `capacity` counters, whatever was counted
before.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class KeyCounts:
    """A Misra-Gries summary of int64 keys (join keys or their hashes)."""

    capacity: int
    keys: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))  # sorted
    counts: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    seen: int = 0  # keys counted in all

    def add(self, keys: np.ndarray) -> None:
        """Count a batch of keys."""
        if not len(keys):
            return
        batch_keys, batch_counts = np.unique(np.asarray(keys, np.int64), return_counts=True)
        self._merge(batch_keys, batch_counts.astype(np.int64), len(keys))

    def merged(self, other: "KeyCounts") -> "KeyCounts":
        """A new summary of both summaries' keys (the capacity of this one)."""
        out = KeyCounts(self.capacity, self.keys.copy(), self.counts.copy(), self.seen)
        out._merge(other.keys, other.counts, other.seen)
        return out

    def heavy(self, share: float) -> tuple[np.ndarray, np.ndarray]:
        """The keys whose estimated count is at least `share` of all keys counted, and those
        counts, largest first."""
        if not self.seen:
            return np.empty(0, np.int64), np.empty(0, np.int64)
        keep = self.counts >= share * self.seen
        order = np.argsort(-self.counts[keep], kind="stable")
        return self.keys[keep][order], self.counts[keep][order]

    def _merge(self, keys: np.ndarray, counts: np.ndarray, seen: int) -> None:
        all_keys = np.concatenate([self.keys, keys])
        all_counts = np.concatenate([self.counts, counts])
        merged_keys, where = np.unique(all_keys, return_inverse=True)
        merged_counts = np.zeros(len(merged_keys), np.int64)
        np.add.at(merged_counts, where, all_counts)
        if len(merged_keys) > self.capacity:
            cut = np.partition(merged_counts, len(merged_counts) - self.capacity - 1)[-self.capacity - 1]
            merged_counts = merged_counts - cut
            keep = merged_counts > 0
            merged_keys, merged_counts = merged_keys[keep], merged_counts[keep]
        self.keys, self.counts, self.seen = merged_keys, merged_counts, self.seen + seen
