"""Placement of partition groups on workers: the policy (pure) and its
durable record, a compacted topic keyed by group, whose latest value per key
is the placement. A restarted coordinator reads it back and changes nothing."""

from __future__ import annotations

from confluent_kafka import Producer

from streamjoin.schemas.control import Placement
from streamjoin.services import kafka
from streamjoin.settings import JobSettings


def round_robin(workers: list[str], partitions: int) -> dict[int, str]:
    ordered = sorted(workers)
    return {g: ordered[g % len(ordered)] for g in range(partitions)}


def groups_of(placement: dict[int, str], worker: str) -> list[int]:
    return sorted(g for g, w in placement.items() if w == worker)


def load(job: JobSettings, cluster: kafka.Cluster) -> tuple[dict[int, str], int]:
    """The stored placement and its epoch (0 when none has been made)."""
    placement: dict[int, str] = {}
    epoch = 0
    for m in kafka.read_partition(cluster, job.placement_topic, 0, 0, f"{job.consumer_group}-placement"):
        if m.value() is None:
            continue
        p = Placement.model_validate_json(m.value())
        placement[p.group] = p.worker
        epoch = max(epoch, p.epoch)
    return placement, epoch


def store(job: JobSettings, producer: Producer, placement: dict[int, str], epoch: int) -> None:
    for g, w in sorted(placement.items()):
        value = Placement(group=g, worker=w, epoch=epoch).model_dump_json().encode()
        producer.produce(job.placement_topic, key=str(g).encode(), value=value, partition=0)
    if producer.flush(30) > 0:
        raise RuntimeError("placement not acknowledged by the broker within 30 s")
