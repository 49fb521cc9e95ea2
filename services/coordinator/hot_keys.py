"""Which join keys are hot, judged from the hash workers' heartbeats (services/hash/hot_keys.py)
with hysteresis, so that a key near the threshold does not flap:

  a key becomes hot when its share of the job's input is at least `coordinator.hot_key_share`
  and at least `coordinator.hot_key_min_tuples` of its tuples were counted;
  a hot key cools when its share falls below `coordinator.hot_key_cool_share`; while no alive
  worker holds its group (its worker died and the group is on its way to another), nothing
  measures it, and it stays hot.

The job's input is what the alive workers counted over the current and the last reorganisation
epoch. Each change is logged and the hot keys are metered (streamjoin_coordinator_hot_keys,
streamjoin_coordinator_hot_key_share).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import structlog

from streamjoin.schemas.control import Heartbeat
from streamjoin.services import metrics
from streamjoin.settings.coordinator import CoordinatorSpec

log = structlog.get_logger("streamjoin.coordinator")

Key = tuple[int, str]  # (partition group, key text)


@dataclass(frozen=True)
class Share:
    """A reported key: its share of the job's input, its tuples counted and the worker holding it."""

    share: float
    count: int
    worker: str
    code: int | None = None  # the key as the engine holds it (what a split routes by)


def shares(beats: dict[str, Heartbeat]) -> dict[Key, Share]:
    """Every key the workers of `beats` (each's latest heartbeat) reported, with its share of all
    they counted. A group reported by two workers (a move in flight) counts as its larger report."""
    counted = sum(b.keys_counted for b in beats.values())
    out: dict[Key, Share] = {}
    if not counted:
        return out
    for worker, beat in sorted(beats.items()):
        for hot in beat.hot_keys:
            key = (hot.group, hot.key)
            if key not in out or hot.count > out[key].count:
                out[key] = Share(hot.count / counted, hot.count, worker, hot.code)
    return out


def turns_hot(seen: Share, spec: CoordinatorSpec) -> bool:
    """Whether a key not hot yet is hot now: its share and its count both reach the thresholds."""
    return seen.share >= spec.hot_key_share and seen.count >= spec.hot_key_min_tuples


@dataclass
class HotKeys:
    """The coordinator's hot keys (see the module docstring)."""

    spec: CoordinatorSpec
    latest: dict[str, Heartbeat] = field(default_factory=dict)  # worker -> its latest heartbeat
    hot: dict[Key, Share] = field(default_factory=dict)

    def on_heartbeat(self, beat: Heartbeat, alive: list[str]) -> None:
        """Take `beat` in, and decide again with the latest heartbeat of each alive worker."""
        self.latest[beat.worker] = beat
        self.latest = {w: b for w, b in self.latest.items() if w in alive or w == beat.worker}
        now = shares(self.latest)
        for key, seen in sorted(now.items()):
            if key not in self.hot and turns_hot(seen, self.spec):
                log.info("hot key", group=key[0], key=key[1], share=round(seen.share, 3), tuples=seen.count,
                         worker=seen.worker)
                self.hot[key] = seen
        held = {g for b in self.latest.values() for g in b.groups}
        for key in sorted(self.hot):
            seen = now.get(key)
            if seen is None and key[0] not in held:
                continue  # its holder is gone: not measured, not cooled (a split would flap through a failover)
            if seen is None or seen.share < self.spec.hot_key_cool_share:
                log.info("hot key cooled", group=key[0], key=key[1], share=round(seen.share, 3) if seen else 0.0)
                del self.hot[key]
                metrics.HOT_KEY_SHARE.remove(str(key[0]), key[1])
            else:
                self.hot[key] = seen
                metrics.HOT_KEY_SHARE.labels(str(key[0]), key[1]).set(seen.share)
        metrics.HOT_KEYS.set(len(self.hot))
