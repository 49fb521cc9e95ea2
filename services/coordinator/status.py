"""`streamjoin status`: the placement, the group moves in flight and each worker's latest
heartbeat (its role, epoch, backlog, and spill: window bytes in memory against its budget,
bytes on disk, generations and the clean-up backlog); for a ring job, whether the ring failed
(a node restarted, a stale epoch, a failed delivery) and why; the hot keys: those the alive
workers' latest heartbeats show at or above coordinator.hot_key_share of the input; and the hot
keys split over slots, with their split factor and the workers of their sub-groups."""

from __future__ import annotations

import time

from confluent_kafka import TopicPartition

from streamjoin.schemas import control
from streamjoin.services.io import kafka
from streamjoin.services.coordinator import placement as placing
from streamjoin.services.coordinator.hot_keys import shares, turns_hot
from streamjoin.services.coordinator.splits import Splits
from streamjoin.settings import JobSettings


def heartbeats_since(job: JobSettings, cluster: kafka.Cluster, window_s: float) -> list[control.Heartbeat]:
    """Every heartbeat written to the control topic in the last `window_s` seconds, oldest first."""
    c = cluster.consumer(f"{job.consumer_group}-status")
    try:
        since = int((time.time() - window_s) * 1000)
        start = c.offsets_for_times([TopicPartition(job.control_topic, 0, since)], timeout=10)[0].offset
    finally:
        c.close()
    messages = kafka.read_partition(cluster, job.control_topic, 0, max(start, 0), f"{job.consumer_group}-status")
    decoded = (control.decode_control(m.value()) for m in messages)
    return [msg for msg in decoded if isinstance(msg, control.Heartbeat)]


def latest_heartbeats(job: JobSettings, cluster: kafka.Cluster, window_s: float = 30.0) -> dict[str, control.Heartbeat]:
    """Each worker's newest heartbeat of the last `window_s` seconds."""
    return {beat.worker: beat for beat in heartbeats_since(job, cluster, window_s)}


def snapshot(job: JobSettings, cluster: kafka.Cluster) -> dict:
    records, split_records = placing.load_all(job, cluster)
    placement = {g: r.worker for g, r in records.items()}
    epoch = max((r.epoch for r in records.values()), default=0)
    moving = [{"group": g, "from": r.moving_from, "to": r.worker} for g, r in sorted(records.items()) if r.moving_from]
    beats = latest_heartbeats(job, cluster)
    now_ms = time.time() * 1000
    workers = sorted(set(placement.values()) | set(beats))
    rows = []
    for w in workers:
        b = beats.get(w)
        rows.append({
            "worker": w,
            "alive": b is not None and now_ms - b.wall_ms < job.coordinator.heartbeat_timeout_ms,
            "role": "active" if placing.groups_of(placement, w) else "standby",
            "placed_groups": placing.groups_of(placement, w),
            "held_groups": b.groups if b else [],
            "epoch": b.epoch if b else None,
            "backlog_bytes": b.backlog_bytes if b else None,
            "lag": b.lag if b else None,
            "state_bytes": b.state_bytes if b else None,
            "state_tuples": b.state_tuples if b else None,
            # Spill (the spill paper, sections 4 and 6): what memory holds against
            # worker.memory_bytes, and what waits on disk.
            "memory_bytes": b.memory_bytes if b else None,
            "memory_budget": b.memory_budget if b else None,
            "spilled_bytes": b.spilled_bytes if b else None,
            "spilled_groups": b.spilled_groups if b else [],
            "generations": b.generations if b else None,
            "cleanup_backlog_bytes": b.cleanup_backlog_bytes if b else None,
            "keys_counted": b.keys_counted if b else None,  # hot keys: tuples counted, two epochs
            "ring_failed": b.ring_failed if b else None,
            "ring_recovery": b.ring_recovery if b else None,
        })
    alive = {r["worker"]: beats[r["worker"]] for r in rows if r["alive"]}
    hot = [{"group": g, "key": k, "share": round(v.share, 4), "tuples": v.count, "worker": v.worker}
           for (g, k), v in shares(alive).items() if turns_hot(v, job.coordinator)]
    failed = sorted({b.ring_failed for b in beats.values() if b.ring_failed})
    epochs = [b.ring_recovery["epoch"] for b in beats.values() if "epoch" in b.ring_recovery]
    return {"job": job.job, "epoch": epoch, "groups_placed": len(placement), "moving": moving, "workers": rows,
            "hot_keys": sorted(hot, key=lambda h: -h["share"]), "split_keys": split_keys(job, split_records, placement),
            "ring_failed": ", ".join(failed), "ring_epoch": int(max(epochs)) if epochs else None}


def split_keys(job: JobSettings, records: dict[bytes, bytes | None], placement: dict[int, str]) -> list[dict]:
    """Each split hot key in force: its group, key, episode, factor (sub-groups), whether it is
    merging, its slots and the workers of its sub-groups (the group's first)."""
    out = []
    for split in Splits.loaded(job, records).records.values():
        out.append({"group": split.group, "key": split.key, "episode": split.episode, "factor": len(split.slots) + 1,
                    "merging": split.merging, "slots": split.slots,
                    "workers": [placement.get(g) for g in [split.group, *split.slots]]})
    return out
