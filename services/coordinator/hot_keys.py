"""Which join keys are hot, judged from the hash workers' heartbeats (services/hash/hot_keys.py)
with hysteresis, so that a key near the threshold does not flap:

  a key becomes hot when its share of the job's input is at least `coordinator.hot_key_share`
  and at least `coordinator.hot_key_min_tuples` of its tuples were counted;
  a hot key cools when its share falls below `coordinator.hot_key_cool_share`, as measured by
  an alive worker that has held its group for the two epochs the share is counted over: while
  nobody holds it (its worker died, the group is on its way) or its new holder has counted less,
  the key stays as it is (a split would otherwise flap through every failover and move).

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
    since: dict[int, tuple[str, int]] = field(default_factory=dict)  # group -> (its holder, wall ms it first said so)

    def on_heartbeat(self, beat: Heartbeat, alive: list[str]) -> None:
        """Take `beat` in, and decide again with the latest heartbeat of each alive worker."""
        self.latest[beat.worker] = beat
        self.latest = {w: b for w, b in self.latest.items() if w in alive or w == beat.worker}
        for g in beat.groups:
            if self.since.get(g, ("", 0))[0] != beat.worker:
                self.since[g] = (beat.worker, beat.wall_ms)
        now = shares(self.latest)
        for key, seen in sorted(now.items()):
            if key not in self.hot and turns_hot(seen, self.spec):
                log.info("hot key", group=key[0], key=key[1], share=round(seen.share, 3), tuples=seen.count,
                         worker=seen.worker)
                self.hot[key] = seen
        for key in sorted(self.hot):
            seen = now.get(key)
            if (seen is None or seen.share < self.spec.hot_key_cool_share) and self._measured(key[0], beat.wall_ms):
                log.info("hot key cooled", group=key[0], key=key[1], share=round(seen.share, 3) if seen else 0.0)
                del self.hot[key]
                metrics.HOT_KEY_SHARE.remove(str(key[0]), key[1])
            elif seen is not None:
                self.hot[key] = seen
                metrics.HOT_KEY_SHARE.labels(str(key[0]), key[1]).set(seen.share)
        metrics.HOT_KEYS.set(len(self.hot))

    def _measured(self, group: int, now_ms: int) -> bool:
        """Whether an alive worker holds `group` and has for the two epochs its share is counted over."""
        holder, since = self.since.get(group, ("", 0))
        held = holder in self.latest and group in self.latest[holder].groups
        return held and now_ms - since >= 2 * self.spec.reorg_epoch_ms
