"""Placement of partition groups on workers: the policy (pure) and its
durable record, a compacted topic keyed by group, whose latest value per key
is the placement. A restarted coordinator reads it back and changes nothing.
The same topic keeps the split hot keys (keys `split/<episode>` and `split/next`:
splits.py), read back with it."""

from __future__ import annotations

from confluent_kafka import Producer

from streamjoin.schemas.control import HotSplit, Placement
from streamjoin.services.io import kafka
from streamjoin.settings import JobSettings

SPLIT_PREFIX = b"split/"  # keys of split hot keys: split/<episode> (a HotSplit; deleted when it ends), split/next
NEXT_SPLIT = SPLIT_PREFIX + b"next"  # the number the next episode gets: episodes only ever count up


def round_robin(workers: list[str], partitions: int) -> dict[int, str]:
    ordered = sorted(workers)
    return {g: ordered[g % len(ordered)] for g in range(partitions)}


def groups_of(placement: dict[int, str], worker: str) -> list[int]:
    return sorted(g for g, w in placement.items() if w == worker)


def load_records(job: JobSettings, cluster: kafka.Cluster) -> dict[int, Placement]:
    """The newest stored placement record of every group."""
    return load_all(job, cluster)[0]


def load_all(job: JobSettings, cluster: kafka.Cluster) -> tuple[dict[int, Placement], dict[bytes, bytes | None]]:
    """The newest stored placement record of every group, and the newest value of every split
    record's key (None: deleted)."""
    records: dict[int, Placement] = {}
    splits: dict[bytes, bytes | None] = {}
    for m in kafka.read_partition(cluster, job.placement_topic, 0, 0, f"{job.consumer_group}-placement"):
        if (m.key() or b"").startswith(SPLIT_PREFIX):
            splits[m.key()] = m.value()
            continue
        if m.value() is None:
            continue
        p = Placement.model_validate_json(m.value())
        records[p.group] = p
    return records, splits


def load(job: JobSettings, cluster: kafka.Cluster) -> tuple[dict[int, str], int]:
    """The stored placement (group -> owner; a group on its way, its receiver) and its epoch
    (0 when none has been made)."""
    records = load_records(job, cluster)
    return {g: r.worker for g, r in records.items()}, max((r.epoch for r in records.values()), default=0)


def store(job: JobSettings, producer: Producer, placement: dict[int, str], epoch: int) -> None:
    store_records(job, producer, [Placement(group=g, worker=w, epoch=epoch) for g, w in sorted(placement.items())])


def store_records(job: JobSettings, producer: Producer, records: list[Placement]) -> None:
    """Write `records` and wait until the broker has them all (the coordinator acts on none before)."""
    for r in records:
        producer.produce(job.placement_topic, key=str(r.group).encode(), value=r.model_dump_json().encode(),
                         partition=0)
    if producer.flush(30) > 0:
        raise RuntimeError("placement not acknowledged by the broker within 30 s")


def store_splits(job: JobSettings, producer: Producer, records: list[HotSplit], ended: list[HotSplit],
                 next_episode: int) -> None:
    """Write split `records` (and the next episode's number) and delete the `ended` ones, then
    wait until the broker has them all."""
    producer.produce(job.placement_topic, key=NEXT_SPLIT, value=str(next_episode).encode(), partition=0)
    for r in records:
        producer.produce(job.placement_topic, key=SPLIT_PREFIX + str(r.episode).encode(),
                         value=r.model_dump_json().encode(), partition=0)
    for r in ended:
        producer.produce(job.placement_topic, key=SPLIT_PREFIX + str(r.episode).encode(), value=None, partition=0)
    if producer.flush(30) > 0:
        raise RuntimeError("split records not acknowledged by the broker within 30 s")
