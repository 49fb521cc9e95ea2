"""Which hot keys are split over slots and when they merge back (hash mode,
`coordinator.hot_key_slots`): the coordinator's part of splitting a hot key (docs/modes/hash.md).
Pure: main.py stores the placement records it returns before it acts on them.

- A key the hot-key judge holds hot (hot_keys.py) is split when the job's join splits exactly
  (`refusal`) and slots are free on other workers: one free slot per alive worker other than
  the group's owner, as many such workers as there are (the split factor is one more). The
  split is an episode, numbered above every earlier one (`split/next` on the placement topic
  keeps the number across restarts), recorded before the group's owner is told.
- A split key the judge no longer holds hot merges: its record says `merging`.
- An episode ends when the worker holding its group reports it ended (its heartbeat's
  `splits`): its record is deleted and its slots are free.
Decisions are level-triggered (`reconcile` on each heartbeat), so a key still hot when its
last episode ends is split again, and a restarted coordinator carries on from the records.
A key refused is logged and metered once per hot spell; one waiting for a free slot is tried
again at every heartbeat.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

import structlog

from streamjoin.schemas.control import Heartbeat, HotSplit
from streamjoin.services import metrics
from streamjoin.services.coordinator.hot_keys import Key, Share
from streamjoin.services.coordinator.placement import NEXT_SPLIT
from streamjoin.settings import JobSettings

log = structlog.get_logger("streamjoin.coordinator")


def refusal(job: JobSettings) -> tuple[str, str] | None:
    """Why the job's hot keys are never split, as (metric reason, text), or None: they split."""
    if len(job.streams) != 2:
        return "multiway", (f"a {len(job.streams)}-way join: one stream's tuples are spread, and with more than two "
                            "streams a combination's members of the replicated streams would need a grid of sub-groups")
    if job.join.table is not None:
        return "as-of", "an as-of join: a tuple joins the one version valid at its time, which lives in one group"
    if any(s.window is not None and s.window.is_rows for s in job.streams):
        return "count-window", ("count windows: a tuple leaves the window when newer ones of its key arrive, which "
                                "a sub-group holding a share of them cannot count")
    if job.join.type == "full":
        return "full-join", ("a full join decides rows of both streams, and a row of the replicated one would meet "
                             "its partners in every sub-group")
    return None


@dataclass
class Splits:
    """The coordinator's split episodes (see the module docstring): `records` in force by episode."""

    job: JobSettings
    records: dict[int, HotSplit] = field(default_factory=dict)
    next_episode: int = 1
    refused: set[Key] = field(default_factory=set)  # hot keys refused in their current hot spell
    waiting: set[Key] = field(default_factory=set)  # hot keys waiting for a free slot (tried again each time)

    @classmethod
    def loaded(cls, job: JobSettings, records: Mapping[bytes, bytes | None]) -> "Splits":
        """The episodes the placement topic's split records describe (key -> newest value)."""
        out = cls(job)
        for key, value in records.items():
            if value is None:
                continue
            if key == NEXT_SPLIT:
                out.next_episode = max(out.next_episode, int(value))
            else:
                split = HotSplit.model_validate_json(value)
                out.records[split.episode] = split
                out.next_episode = max(out.next_episode, split.episode + 1)
        return out

    def reconcile(self, hot: Mapping[Key, Share], owners: Mapping[int, str],
                  alive: list[str]) -> list[HotSplit]:
        """The records to store so that the keys `hot` holds are split and the others merge;
        `owners`: group -> worker (slots too)."""
        if not self.job.slots:
            return []
        out = [self._merge(e) for e, r in sorted(self.records.items()) if not r.merging and (r.group, r.key) not in hot]
        self.refused &= set(hot)
        self.waiting &= set(hot)
        split = {(r.group, r.key) for r in self.records.values()}
        for key, share in sorted(hot.items()):
            if key in split or key in self.refused or key[0] >= self.job.partitions or share.code is None:
                continue
            started = self._split(key, share.code, owners, alive)
            if started is not None:
                out.append(started)
        return out

    def ended(self, beat: Heartbeat) -> list[HotSplit]:
        """The episodes `beat`'s worker reports ended for groups it holds: forgotten here, their
        records to delete."""
        done = [r for e, r in sorted(self.records.items())
                if r.group in beat.groups and beat.splits.get(e) == "ended"]
        for r in done:
            del self.records[r.episode]
            metrics.SPLIT_EPISODES.labels("merged").inc()
            metrics.SPLIT_KEYS.remove(str(r.group), r.key)
            log.info("hot key merged", group=r.group, key=r.key, episode=r.episode, slots=r.slots)
        return done

    def behind(self, beat: Heartbeat) -> bool:
        """Whether `beat`'s worker holds a group with a split it has not applied as far as its
        record says (it should be told its assignment again)."""
        return any(r.group in beat.groups and beat.splits.get(e) not in (("merging", "ended") if r.merging
                                                                         else ("split", "merging", "ended"))
                   for e, r in self.records.items())

    def of_groups(self, groups: list[int]) -> list[HotSplit]:
        """The records of the splits of `groups`."""
        return [r for _, r in sorted(self.records.items()) if r.group in groups]

    def _merge(self, episode: int) -> HotSplit:
        record = self.records[episode].model_copy(update={"merging": True})
        self.records[episode] = record
        metrics.SPLIT_EPISODES.labels("merging").inc()
        log.info("hot key merging", group=record.group, key=record.key, episode=episode, slots=record.slots)
        return record

    def _split(self, key: Key, code: int, owners: Mapping[int, str], alive: list[str]) -> HotSplit | None:
        why = refusal(self.job)
        busy = {s for r in self.records.values() for s in r.slots}
        owner = owners.get(key[0])
        chosen: dict[str, int] = {}
        for slot in self.job.slots:
            worker = owners.get(slot)
            if slot not in busy and worker in alive and worker != owner and worker not in chosen:
                chosen[worker] = slot
        if why is None and not chosen:
            if key not in self.waiting:  # tried again at every heartbeat: said once a hot spell
                self.waiting.add(key)
                metrics.SPLIT_REFUSALS.labels("no-slot").inc()
                log.warning("hot key not split yet", group=key[0], key=key[1],
                            reason=f"no free slot on an alive worker other than the group's owner {owner} (slots "
                                   f"{list(self.job.slots)}, busy {sorted(busy)})")
            return None
        if why is not None:
            self.refused.add(key)
            metrics.SPLIT_REFUSALS.labels(why[0]).inc()
            log.warning("hot key not split", group=key[0], key=key[1], reason=why[1])
            return None
        record = HotSplit(episode=self.next_episode, group=key[0], key=key[1], code=code,
                          slots=sorted(chosen.values()))
        self.next_episode += 1
        self.records[record.episode] = record
        metrics.SPLIT_EPISODES.labels("split").inc()
        metrics.SPLIT_KEYS.labels(str(record.group), record.key).set(len(record.slots) + 1)
        log.info("hot key split", group=record.group, key=record.key, episode=record.episode, slots=record.slots,
                 workers=[owner] + [owners[s] for s in record.slots], factor=len(record.slots) + 1)
        return record
