"""The job file's `worker:` section: a worker's batching, state directory, memory budget for
window state, what it spills to disk past that budget (`worker.spill`), exactly-once output,
changelog, heartbeats and metrics port."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field, model_validator

from streamjoin.settings.base import StrictModel


class SpillSpec(StrictModel):
    """Disk-based adaptation, as in the spill and memory balancing paper (section 4): when the
    window bytes a worker holds in memory cross `trigger` x `worker.memory_bytes` (theta_m), it
    pushes `push_fraction` of them to disk, choosing the groups by `victims`. RocksDB holds
    every group's window either way; a pushed group's memory is freed.

    mode: `probe` reads a pushed group's window back and probes it when the group's next batch
    arrives (results on time, a disk read per batch of a cold group); `deferred` is that paper's:
    the pushed window becomes a generation on disk that run-time batches do not probe, and the
    results joining it with other generations come from a clean-up pass (engine/cleanup.py) once
    the watermark has passed the generation's newest tuple plus the longest window (results late
    by about one window, no disk read on the hot path). Deferred needs RANGE windows on every
    stream: a count window's membership depends on tuples of every generation."""

    mode: Literal["probe", "deferred"] = Field(
        default="probe",
        description="probe: a pushed group's window is read back and probed when its next batch arrives (results "
                    "on time); deferred: it becomes a generation on disk joined by a clean-up pass once the "
                    "watermark passes it (results about a window late; RANGE windows and inner joins only)")
    victims: Literal["productivity", "lru", "most-productive"] = Field(
        default="productivity",
        description="productivity (the spill paper's 4.3): groups idle longer than inactive_ms first, then the "
                    "largest size/output ratio (no output = infinitely unproductive); lru: least recently used "
                    "first; most-productive: the smallest size/output ratio first (the spill paper's counterpart "
                    "in Figure 11)")
    trigger: float = Field(default=1.0, gt=0, le=4,
                           description="push when in-memory window bytes exceed trigger x worker.memory_bytes "
                                       "(the spill paper's section 6: M_u / M_a > theta_m)")
    push_fraction: float = Field(default=0.3, gt=0, le=1,
                                 description="share of in-memory window bytes pushed each time (the spill "
                                             "paper's 4.4: 30%)")
    inactive_ms: int = Field(
        default=300_000, gt=0,
        description="theta_t: a group with no new tuple for this long is pushed first (the spill paper uses half "
                    "the run's length; a continuous job has no length, so 5 minutes)")



class WorkerSpec(StrictModel):
    batch_ms: int = Field(default=200, gt=0, description="distribution epoch: the longest interval between "
                                                         "batches (their transactions), reached under load")
    min_batch_ms: int = Field(
        default=10, gt=0,
        description="the shortest interval between batches: the interval adapts between this and batch_ms, the "
                    "last batch's own time (the next starts once it is committed), so light input gets small, quick batches (low delay) and a "
                    "backlog large ones (fewer transactions per tuple)")
    max_batch_records: int = Field(default=200_000, gt=0,
                                   description="a batch starts as soon as this many records wait, whatever the interval")
    state_dir: Path = Field(
        default=Path("./state"),
        description="where a worker keeps its RocksDB window state (under <state_dir>/<worker-id>) and crash "
                    "markers; a disk that survives restarts spares the worker a rebuild")
    memory_bytes: int = Field(
        default=2 << 30, gt=0, validation_alias=AliasChoices("memory_bytes", "hot_bytes"),
        description="the worker's memory budget for window state (bytes of the windows held in memory; "
                    "worker.spill says what is pushed to disk past it)")
    spill: SpillSpec = Field(
        default=SpillSpec(),
        description="what a worker pushes to disk (disk-based adaptation) once its window bytes in memory cross "
                    "its budget, and how pushed windows are joined")
    exactly_once: bool = Field(
        default=True,
        description="commit each batch's results, dead letters and input offsets in one Kafka transaction "
                    "(exactly-once output); false is for brokers without transactions, and then nothing fences "
                    "a dead worker's late writes")
    changelog: bool = Field(
        default=True,
        description="hash mode: mirror each group's state writes to <job>.changelog in the cycle's transaction, so "
                    "any worker rebuilds a group from it in time that grows with the window, not the job's age; "
                    "false: a worker without the group's disk replays every batch since the job began")
    max_record_bytes: int = Field(
        default=1 << 20, gt=0,
        description="the largest input record a worker takes, in bytes; a larger one is dead-lettered as oversize")
    heartbeat_ms: int = Field(
        default=1000, gt=0,
        description="how often a worker (hash worker, ring node, SplitJoin core or merger) reports on the "
                    "control topic, in ms: the coordinator's view of who is alive and how loaded")
    stall_timeout_ms: int = Field(
        default=60_000, gt=0,
        description="a Kafka commit stuck this long ends the process; its supervisor restarts it into recovery",
    )
    hot_key_counters: int = Field(
        default=64, ge=1,
        description="hash mode: counters of each partition group's heavy-hitter summary (Misra-Gries): a key "
                    "with more than 1 / (hot_key_counters + 1) of the group's input is always counted, and "
                    "estimates are low by at most that share")
    metrics_port: int = Field(default=0, ge=0, description="0 = pick a free port")
    region: str = Field(default="local", description="the region this worker runs in (the StreamReuse paper's "
                                                   "network locality; Helm sets it from the node's topology zone)")

    @model_validator(mode="after")
    def _check_batch_interval(self) -> "WorkerSpec":
        if self.min_batch_ms > self.batch_ms:
            raise ValueError(f"worker.min_batch_ms ({self.min_batch_ms}) must not exceed worker.batch_ms "
                             f"({self.batch_ms}): the batch interval adapts between the two")
        return self
