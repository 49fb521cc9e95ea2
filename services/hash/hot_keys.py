"""Which join keys carry a large share of a hash worker's input: a heavy-hitter summary per
partition group (engine/heavy_hitters.py) over the current and the last reorganisation epoch,
reported in the worker's heartbeats and judged by the coordinator
(services/coordinator/hot_keys.py).

A worker reports each key at or above `coordinator.hot_key_cool_share` of its own input. A key
lives in one group and a group on one worker, so its share of that worker's input is at least
its share of the job's: no key the coordinator would call hot goes unreported.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from streamjoin.engine.block import KEY, Block
from streamjoin.engine.heavy_hitters import KeyCounts
from streamjoin.schemas.control import HotKey
from streamjoin.schemas.join_keys import key_text
from streamjoin.settings import JobSettings


class KeyCounter:
    """The worker's summaries, one per partition group it joins, rotated each reorganisation epoch."""

    def __init__(self, job: JobSettings) -> None:
        self.capacity = job.worker.hot_key_counters
        self.epoch_ms = job.coordinator.reorg_epoch_ms
        self.report_share = job.coordinator.hot_key_cool_share
        self.key_columns = [[(f, s.fields[f]) for f in s.key_fields] for s in job.streams]
        self.current: dict[int, KeyCounts] = {}
        self.last: dict[int, KeyCounts] = {}
        self.texts: dict[int, dict[int, str]] = {}  # group -> key (KEY column value) -> its text
        self.epoch_start: int | None = None

    def observe(self, group: int, blocks: Sequence[Block], now_ms: int) -> None:
        """Count a batch of `group`: per stream, the tuples it took into its window."""
        self._rotate(now_ms)
        counts = self.current.setdefault(group, KeyCounts(self.capacity))
        for stream, block in enumerate(blocks):
            if len(block):
                counts.add(block[KEY])
                self._name(group, stream, block, counts)

    def report(self, groups: set[int], now_ms: int) -> tuple[int, list[HotKey]]:
        """The tuples counted in `groups` over the current and the last epoch, and the keys at or
        above the report share of them, largest first."""
        self._rotate(now_ms)
        summaries = {g: self._both(g) for g in sorted(groups)}
        counted = sum(s.seen for s in summaries.values())
        if not counted:
            return 0, []
        found = []
        for group, summary in summaries.items():
            big = summary.counts >= self.report_share * counted
            names = self.texts.get(group, {})
            found += [HotKey(group=group, key=names.get(int(k), str(int(k))), count=int(c), code=int(k))
                      for k, c in zip(summary.keys[big], summary.counts[big])]
        return counted, sorted(found, key=lambda h: (-h.count, h.group, h.key))

    def forget(self, group: int) -> None:
        """`group` left this worker: its counts go with it."""
        for held in (self.current, self.last, self.texts):
            held.pop(group, None)

    def _both(self, group: int) -> KeyCounts:
        now, before = self.current.get(group), self.last.get(group)
        if now is None or before is None:
            return now or before or KeyCounts(self.capacity)
        return now.merged(before)

    def _rotate(self, now_ms: int) -> None:
        if self.epoch_start is None:
            self.epoch_start = now_ms
        elapsed = now_ms - self.epoch_start
        if elapsed < self.epoch_ms:
            return
        # A worker that counted nothing for a whole epoch has no last epoch to report.
        self.last = self.current if elapsed < 2 * self.epoch_ms else {}
        self.current, self.epoch_start = {}, now_ms
        for group, names in list(self.texts.items()):
            kept = {int(k) for held in (self.current, self.last) if group in held for k in held[group].keys}
            self.texts[group] = {k: v for k, v in names.items() if k in kept}

    def _name(self, group: int, stream: int, block: Block, counts: KeyCounts) -> None:
        """Remember the text of the summary's keys that have none yet, from their first row in
        `block` (a few keys a batch: the summary holds at most `capacity`)."""
        names = self.texts.setdefault(group, {})
        unnamed = counts.keys[~np.isin(counts.keys, np.fromiter(names, np.int64, len(names)))]
        if not len(unnamed):
            return
        hit = np.flatnonzero(np.isin(block[KEY], unnamed))
        if not len(hit):
            return
        keys, first = np.unique(block[KEY][hit], return_index=True)
        rows = hit[first]
        texts = key_text([(block[f][rows], ftype) for f, ftype in self.key_columns[stream]]).to_pylist()
        names.update({int(k): t.decode("utf-8", "replace") for k, t in zip(keys, texts)})
