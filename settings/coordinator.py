"""The job file's `coordinator:` section: failure detection and failover, placement (sticky
or adaptive), and the adaptive policy's load balancing, scaling and memory balancing."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from streamjoin.settings.base import StrictModel


class CoordinatorSpec(StrictModel):
    """Placement and adaptation (hash mode). The adaptive policy's parameters default to the
    papers' values: the hash-partitioned cluster join paper's section VI-A Table 2 and section V-A
    (load balancing, degree of declustering), the spill and memory balancing paper's sections
    5.1-5.2 (memory balancing)."""

    heartbeat_timeout_ms: int = Field(
        default=10_000, gt=0,
        description="a worker heard within this long is alive (it may get groups or a ring slice); when no "
                    "heartbeat at all arrived for this long, the coordinator takes itself as cut off and declares "
                    "nobody dead")
    worker_timeout_ms: int = Field(
        default=30_000, gt=0,
        description="a worker silent this long is dead: with failover: reassign its groups go to live workers "
                    "(rebuilt from the changelog), and a move it was sending completes without it")
    failover: Literal["reassign", "wait"] = Field(
        default="reassign",
        description="reassign: a dead worker's groups move to live workers; wait: they wait for that worker "
                    "to come back with its disk (a StatefulSet pod)")
    expected_workers: int = Field(
        default=1, gt=0,
        description="how many workers must be alive before the coordinator makes the first placement "
                    "(round-robin over them) or lays out the ring: set it to the fleet's size")
    metrics_port: int = Field(default=0, ge=0,
                              description="the coordinator's /metrics and /healthz port (0 = any free port)")
    placement: Literal["sticky", "adaptive"] = Field(
        default="sticky",
        description="sticky: a group stays where it is placed until an operator moves it or its worker dies. "
                    "adaptive: the cluster join paper's load balancing and degree of declustering and the spill "
                    "paper's memory balancing decide moves (services/coordinator/adapt.py), carried out through "
                    "the migration protocol at the end of each reorganisation epoch; `streamjoin rebalance "
                    "--dry-run` shows the plan")
    buffer_bytes: int = Field(
        default=1 << 20, gt=0,
        description="a worker's buffer capacity: occupancy = mean backlog bytes over the reorganisation "
                    "epoch / buffer_bytes (the cluster join paper's IV-C; 1 MB in its section VI-A)")
    reorg_epoch_ms: int = Field(
        default=20_000, gt=0,
        description="reorganisation epoch: how often load is rebalanced, and the span backlog is averaged "
                    "over (the cluster join paper's Table 2: 20 s)")
    supplier_occupancy: float = Field(
        default=0.5, gt=0, le=1,
        description="a worker above this occupancy is a supplier and yields a group (the cluster join paper's Table 2)")
    consumer_occupancy: float = Field(
        default=0.01, ge=0, lt=1,
        description="a worker below this occupancy is a consumer and may receive a group (the cluster join "
                    "paper's Table 2)")
    yield_group: Literal["random", "heaviest"] = Field(
        default="random",
        description="which group a supplier yields: a random one (the cluster join paper's IV-C) or the one "
                    "with the most window state bytes")
    scale_lambda: float = Field(
        default=1.0, gt=0,
        description="scale out when suppliers > scale_lambda x consumers; scale in when there is no "
                    "supplier (the cluster join paper's V-A)")
    scale_cooldown_ms: int = Field(
        default=60_000, ge=0,
        description="least time between two changes of the number of active workers (not in the cluster join paper: "
                    "three reorganisation epochs, so a change's moves show in the backlog before the next)")
    memory_balance_theta: float = Field(
        default=0.8, ge=0, le=1,
        description="move state from the fullest to the emptiest worker when M_least / M_most is below this "
                    "(the spill paper's 5.1, theta_d); 0 turns memory balancing off")
    memory_balance_interval_ms: int = Field(
        default=45_000, ge=0,
        description="least time between two memory balancings (the spill paper's 5.2: 45 s)")
    disk_adaptation: Literal["local", "lazy-disk", "active-disk"] = Field(
        default="lazy-disk",
        description="how memory balancing and the workers' spill work together (the spill paper's section 6). "
                    "local: each worker spills on its own and balancing ignores it; lazy-disk: balancing never "
                    "moves a group with generations on disk and never starts in an epoch in which a worker "
                    "pushed; active-disk: lazy-disk, and when memory is balanced but output rates per group "
                    "diverge (max/min > output_rate_theta) the worker with the lowest rate is told to push its "
                    "least productive groups, at most M_q - M_c bytes")
    output_rate_theta: float = Field(
        default=2.0, gt=1,
        description="active-disk: Max_rate / Min_rate of the workers' output rates per group above which the "
                    "slowest is told to push (the spill paper's section 6, theta_f; it gives no value)")
    hot_key_share: float = Field(
        default=0.1, gt=0, le=1,
        description="hash mode: a join key that carries at least this share of the job's input (counted over "
                    "the current and the last reorganisation epoch) is hot: logged, shown by `streamjoin "
                    "status` and metered (streamjoin_coordinator_hot_keys)")
    hot_key_min_tuples: int = Field(
        default=10_000, ge=1,
        description="a key is hot only once at least this many of its tuples were counted over the current and "
                    "the last reorganisation epoch: a busy key of a quiet job needs no attention")
    hot_key_cool_share: float = Field(
        default=0.05, gt=0, le=1,
        description="a hot key stays hot until its share falls below this (below hot_key_share, so that a key "
                    "near the threshold does not flap)")

    hot_key_slots: int = Field(
        default=0, ge=0, le=256,
        description="hash mode: sub-group slots for splitting hot keys (0: keys are never split). A hot key of a "
                    "2-way time-window join is spread over its group and up to this many slots placed on other "
                    "workers, and merged back once it cools; the per-group topics get partitions + hot_key_slots "
                    "partitions, so set it before the job's topics are created")

    @model_validator(mode="after")
    def _thresholds_ordered(self) -> "CoordinatorSpec":
        if self.hot_key_cool_share >= self.hot_key_share:
            raise ValueError(f"coordinator.hot_key_cool_share ({self.hot_key_cool_share}) must be below "
                             f"coordinator.hot_key_share ({self.hot_key_share}): a key cools below the share "
                             "that made it hot")
        if self.consumer_occupancy >= self.supplier_occupancy:
            raise ValueError(f"coordinator.consumer_occupancy ({self.consumer_occupancy}) must be below "
                             f"coordinator.supplier_occupancy ({self.supplier_occupancy}): a worker cannot be "
                             "both a consumer and a supplier")
        if self.worker_timeout_ms < self.heartbeat_timeout_ms:
            raise ValueError(f"coordinator.worker_timeout_ms ({self.worker_timeout_ms}) must be at least "
                             f"coordinator.heartbeat_timeout_ms ({self.heartbeat_timeout_ms}): a worker is "
                             "declared dead only after it stopped counting as alive")
        return self
