"""The one typed settings object: a YAML job file, overlaid by environment
(`STREAMJOIN_*`, nested with `__`) and then by CLI flags.

Every service reads a `JobSettings`; nothing else reads `os.environ`.
A bad file, variable or flag raises `SettingsError`, whose message names the
field and what would fix it; the CLI turns that into exit code 2.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from streamjoin.settings import kafka as kafka_settings
from streamjoin.settings.kafka import KafkaSecret, KafkaValue
from streamjoin.settings.topics import KEEP_FOREVER, TopicsSpec

FieldType = Literal["int", "float", "str", "bool", "bytes"]
HASH_KEY_TYPES = ("int", "str", "bool")
# airline workload: the real carrier codes and cities services/workloads.py draws from.
AIRLINE_MAX_CARRIERS = 20
AIRLINE_MAX_CITIES = 40
RESERVED_RESULT_NAMES = frozenset({"result_id", "event_time", "produced_ms", "inputs"})
AVRO_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# librdkafka properties exactness or the design depends on: a job's `kafka:` section may not set them.
RESERVED_KAFKA_SETTINGS = {
    "bootstrap.servers": "give `bootstrap` instead",
    "group.id": "offsets are committed per job",
    "transactional.id": "one per worker, for exactly-once output",
    "enable.auto.commit": "offsets are committed with each cycle's output",
    "enable.auto.offset.store": "offsets are committed with each cycle's output",
    "isolation.level": "exactly-once reads read_committed",
    "enable.idempotence": "exactly-once output needs the idempotent producer",
    "partitioner": "results and repartitioned records use Kafka's murmur2 partitioner",
}


class SettingsError(ValueError):
    """A configuration problem a user must fix; message says which field and how."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class WindowSpec(_Strict):
    """Exactly one of `range_ms` (time-based RANGE) or `rows` (count-based ROWS, per key)."""

    range_ms: int | None = Field(default=None, gt=0)
    rows: int | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _one_kind(self) -> "WindowSpec":
        if (self.range_ms is None) == (self.rows is None):
            raise ValueError("give exactly one of range_ms (time window) or rows (count window)")
        return self

    @property
    def is_rows(self) -> bool:
        return self.rows is not None


def _fits(field_type: FieldType, value: object) -> bool:
    """Whether a filter literal can equal a value of `field_type` (bool is not an int here)."""
    if isinstance(value, bool):
        return field_type == "bool"
    if isinstance(value, int):
        return field_type in ("int", "float")
    if isinstance(value, float):
        return field_type == "float"
    return field_type == "str" and isinstance(value, str)


class StreamSpec(_Strict):
    name: str = Field(pattern=r"^[a-z][a-z0-9_]*$")
    topic: str | None = None
    format: Literal["json", "avro", "blocks"] = "json"
    fields: dict[str, FieldType]
    time_field: str
    key_fields: list[str] = Field(default_factory=list, description="join key (hash mode needs one); Kafka record key")
    window: WindowSpec
    where: dict[str, list[int | float | str | bool]] = Field(
        default_factory=dict,
        description="hash mode: a source filter, field -> allowed values (ANDed over fields); a tuple outside it "
                    "is skipped before the join (counted, not dead-lettered). The query service pushes its "
                    "operators' selection covers here (seed 002 section 3.1, cascading relaxation)")
    max_field_bytes: int = Field(
        default=4096, gt=0, le=1 << 24,
        description="the longest str or bytes value a tuple may hold (UTF-8 bytes for str); a record with a "
                    "longer one is dead-lettered as oversize. A stream's values are held at the width of its "
                    "longest one, so this bounds what one record can add to the memory of a window")
    max_block_bytes: int = Field(
        default=64 << 20, gt=0, le=1 << 34,
        description="blocks format: the most bytes a record's Arrow IPC buffers may hold once decompressed "
                    "(LZ4/ZSTD bodies); a record that would expand past it is dead-lettered as oversize before "
                    "anything is decompressed")

    @model_validator(mode="after")
    def _fields_exist(self) -> "StreamSpec":
        if self.time_field not in self.fields:
            raise ValueError(f"time_field {self.time_field!r} is not one of fields {sorted(self.fields)}")
        if self.fields[self.time_field] != "int":
            raise ValueError(f"time_field {self.time_field!r} must be an int field (epoch milliseconds)")
        missing = [k for k in self.key_fields if k not in self.fields]
        if missing:
            raise ValueError(f"key_fields {missing} are not among fields {sorted(self.fields)}")
        unknown = [k for k in self.where if k not in self.fields]
        if unknown:
            raise ValueError(f"where names fields {unknown} that are not among fields {sorted(self.fields)}")
        empty = [k for k, values in self.where.items() if not values]
        if empty:
            raise ValueError(f"where lists no values for {empty}: the stream would never join")
        mistyped = [k for k, values in self.where.items() if not all(_fits(self.fields[k], v) for v in values)]
        if mistyped:
            raise ValueError(f"where values of {mistyped} do not fit their field types "
                             f"({ {k: self.fields[k] for k in mistyped} }); bytes fields cannot be filtered")
        return self


class PredicateTerm(_Strict):
    """One condition between two streams' fields, each named "stream.field".

    No `within` and no `udf`: equality. `within: d`: abs(left - right) <= d
    (a band). `udf: name`: the mask returned by the UDF registered under
    `join.udfs[name]`, called with aligned NumPy arrays of the two fields and
    `args` as keyword arguments."""

    left: str = Field(pattern=r"^[a-z][a-z0-9_]*\.[A-Za-z_][A-Za-z0-9_]*$")
    right: str = Field(pattern=r"^[a-z][a-z0-9_]*\.[A-Za-z_][A-Za-z0-9_]*$")
    within: float | None = Field(default=None, ge=0)
    udf: str | None = None
    args: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _one_kind(self) -> "PredicateTerm":
        if self.within is not None and self.udf is not None:
            raise ValueError("a term is a band (`within`) or a UDF (`udf`), not both")
        if self.left.split(".")[0] == self.right.split(".")[0]:
            raise ValueError(f"a term relates two different streams, got {self.left} and {self.right}")
        return self

    @property
    def kind(self) -> Literal["eq", "band", "udf"]:
        return "udf" if self.udf is not None else "band" if self.within is not None else "eq"


JoinType = Literal["inner", "left", "right", "full", "semi", "anti"]


class JoinSpec(_Strict):
    type: JoinType = Field(
        default="inner",
        description="inner: combinations only; left/right/full: also each row of the first/second/both streams "
                    "that no partner joined, null-padded, once the watermark proves none can come; semi: each row of "
                    "the first stream once, on its first match; anti: each row of the first stream no partner "
                    "joined, once proven. Not inner: hash mode, two streams")
    mode: Literal["hash", "ring", "splitjoin"] = Field(
        default="hash", description="hash: partition groups by key (seeds 000/003); ring: PSP time slices (seed 004); "
                                    "splitjoin: broadcast cores, results in input order (seed 001)")
    allowed_lateness_ms: int = Field(default=2000, ge=0)
    idle_timeout_ms: int | None = Field(
        default=None, ge=0,
        description="an input (ring: source partition; hash: a group's stream) with no record for this long stops "
                    "holding the watermark back, so the others make progress; a record arriving on it later behind "
                    "the watermark is dead-lettered as late. None or 0: off (wait for every input, exact)")
    max_read_ahead_ms: int | None = Field(
        default=10_000, ge=0,
        description="hash mode: a group's stream whose newest event time is more than this ahead of its slowest "
                    "stream that still has records to read is paused until that one catches up (event-time "
                    "aligned intake, as Kafka Streams picks the partition with the lowest head), so a backlog "
                    "drain keeps the window at its size instead of buffering one stream whole. None: off")
    predicate: list[PredicateTerm] = Field(
        default_factory=list, description="ring mode: ANDed terms (equality, band, UDF); hash mode joins on keys")
    udfs: dict[str, str] = Field(default_factory=dict, description="UDF name -> 'module:callable'")
    order: dict[str, list[str]] = Field(
        default_factory=dict,
        description="ring mode: per arriving stream, the order in which it probes the others "
                    "(default: ascending rate x window x selectivity, seed 004 section 5.4)")
    repartition: Literal["auto", "never"] = Field(
        default="auto",
        description="hash mode: a record whose partition is not murmur2(join key) mod partitions is re-routed "
                    "through <job>.<stream>.by-key (auto) or dead-lettered as misrouted (never)")
    repartition_watermarks: bool = Field(
        default=False,
        description="hash mode, repartition auto: a group tells the groups it re-routes to how far it has read "
                    "each source partition (progress notes on the by-key topics), and a group's watermark follows "
                    "every source partition of its inputs, so a re-routed tuple is late only against its own "
                    "partition, however far a group read ahead (a backlog). Costs a note per stream and group pair "
                    "per batch, and a partition with no records holds the watermark until idle_timeout_ms. The "
                    "query service turns it on for its operator versions")
    start_offsets: dict[str, dict[int, int]] = Field(
        default_factory=dict,
        description="hash mode: source topic -> partition -> the offset a group with no checkpoint starts "
                    "reading at (default: the beginning). The query service starts an operator version this "
                    "way, about a window before its switch barrier (a window-bounded backfill)")
    start_event_ms: int | None = Field(
        default=None,
        description="hash mode: tuples with an event time before this are skipped before the join (counted in "
                    "streamjoin_filtered_tuples{reason=before_start}): no result the job is read for can hold "
                    "them. The query service sets it on an operator version: its barrier minus its longest RANGE")
    max_future_ms: int | None = Field(
        default=300_000, ge=0,
        description="a record whose event time is more than this ahead of the worker's clock is dead-lettered "
                    "(reason future) and never moves a watermark; 0 or null = no limit")

    @model_validator(mode="after")
    def _watermarks_need_repartition(self) -> "JoinSpec":
        if self.repartition_watermarks and (self.mode != "hash" or self.repartition != "auto"):
            raise ValueError("join.repartition_watermarks needs join.mode: hash and join.repartition: auto "
                             "(nothing else re-routes tuples)")
        return self


class OutputSpec(_Strict):
    """Where and how results are written: one Kafka record per result (json, avro),
    or Arrow IPC blocks of many results for high-rate internal consumers."""

    format: Literal["json", "avro", "blocks"] = "json"
    topic: str | None = Field(default=None, description="results topic (default <job>.results)")


class RingSpec(_Strict):
    """PSP ring (seed 004): N nodes each hold one time slice of every stream's window."""

    nodes: int | Literal["auto"] = Field(
        default="auto", description="ring size N at start; auto = the cost model's latency-minimising N")
    max_nodes: int = Field(default=8, ge=1, le=64)
    max_rounds_in_flight: Annotated[int, Field(ge=1, le=64)] | Literal["auto"] = Field(
        default="auto",
        description="rounds in the ring at once: 1 = PSP (one round at a time), more = PSP-I interleaving; auto = "
                    "as many as keep every node busy (engine/psp/cost_model.py rounds_in_flight: 1 + (M-1) x N, "
                    "at most 16, following the ring's size)")
    slice_cap_tuples: int | None = Field(
        default=None, gt=0, description="workload smoothing: count bound on each non-tail node's slice per stream")
    relocation: Literal["passive", "aggressive"] = Field(
        default="passive", description="on a resize: slice bounds move gradually, or state moves at once")
    passive_rounds: int = Field(default=20, ge=1, description="rounds over which passive relocation moves bounds")
    round_ms: int = Field(default=100, gt=0, description="how often the head releases a round by watermark")
    head_weight: Annotated[float, Field(ge=0.0, le=1.0)] | Literal["auto"] = Field(
        default="auto",
        description="the head's slice of the window relative to another node's: the head also reads, sequences and "
                    "logs every tuple, so in a ring of several nodes an equal slice (1) makes it the slowest node; "
                    "0 = it keeps nothing past the round it releases; auto = what evens the loads for the ring's "
                    "size (engine/psp/cost_model.py balanced_head_weight: 0.82 at N=2, 0.64 at 4, 0.27 at 8)")
    standby_after_ms: int | None = Field(
        default=None, gt=0,
        description="a ring node silent this long is replaced by a standby (an alive worker outside the layout), "
                    "if there is one; until then the ring waits for it to restart. Unset: "
                    "coordinator.heartbeat_timeout_ms")
    recovery: bool = Field(
        default=True,
        description="crash recovery: the head logs every round before it enters the ring and the ring checkpoints "
                    "every checkpoint_ms; a restarted node rolls the ring back to the last checkpoint and the logged "
                    "rounds run again. false: no log, no checkpoints, and a restarted node stops the ring (fenced)")
    checkpoint_ms: int = Field(
        default=30_000, gt=0,
        description="how often the ring checkpoints (with recovery): the head stops releasing until the rounds in "
                    "flight are back, then a mark collects every node's slice ranges; what a rollback re-drives "
                    "is at most this much of rounds. Each checkpoint drains the ring, so a short interval costs "
                    "throughput on large windows (band, 15 minutes, N=1: 5 s cost 34%, 30 s 11%)")


class SplitJoinSpec(_Strict):
    """SplitJoin (seed 001): every core reads every tuple, stores each stream's every k-th tuple
    (per-stream sequence number mod k = its position) and probes every tuple against what it
    stores; the merger puts the cores' results in input order by their punctuations."""

    cores: int = Field(default=2, ge=1, le=64, description="k at start; `streamjoin splitjoin scale` changes it")
    max_cores: int = Field(
        default=16, ge=1, le=64,
        description="partitions of the core-output and core-changelog topics: the most cores a scale may ask for")
    punctuate_every: int = Field(
        default=1, ge=0,
        description="punctuation precision: 1 = after every input tuple, n = every n tuples, 0 = none (unordered)")
    batch_ms: int = Field(default=50, gt=0, description="how often a core releases what the input order lets go")


class SpillSpec(_Strict):
    """Disk-based adaptation, seed 003 section 4: when the window bytes a worker holds in memory
    cross `trigger` x `worker.memory_bytes` (theta_m), it pushes `push_fraction` of them to disk,
    choosing the groups by `victims`. RocksDB holds every group's window either way; a pushed
    group's memory is freed.

    mode: `probe` reads a pushed group's window back and probes it when the group's next batch
    arrives (results on time, a disk read per batch of a cold group); `deferred` is seed 003's:
    the pushed window becomes a generation on disk that run-time batches do not probe, and the
    results joining it with other generations come from a clean-up pass (engine/cleanup.py) once
    the watermark has passed the generation's newest tuple plus the longest window (results late
    by about one window, no disk read on the hot path). Deferred needs RANGE windows on every
    stream: a count window's membership depends on tuples of every generation."""

    mode: Literal["probe", "deferred"] = "probe"
    victims: Literal["productivity", "lru", "most-productive"] = Field(
        default="productivity",
        description="productivity (seed 003 4.3): groups idle longer than inactive_ms first, then the largest "
                    "size/output ratio (no output = infinitely unproductive); lru: least recently used first; "
                    "most-productive: the smallest size/output ratio first (the paper's counterpart in Figure 11)")
    trigger: float = Field(default=1.0, gt=0, le=4,
                           description="push when in-memory window bytes exceed trigger x worker.memory_bytes "
                                       "(seed 003 6: M_u / M_a > theta_m)")
    push_fraction: float = Field(default=0.3, gt=0, le=1,
                                 description="share of in-memory window bytes pushed each time (seed 003 4.4: 30%)")
    inactive_ms: int = Field(
        default=300_000, gt=0,
        description="theta_t: a group with no new tuple for this long is pushed first (the paper uses half the "
                    "run's length; a continuous job has no length, so 5 minutes)")


class QueriesSpec(_Strict):
    """StreamReuse (seed 002): the continuous-query service (`streamjoin queries`). The job's
    `streams` are the catalog queries may name; each shared operator runs as a hash-mode job
    of its own. Regions and their latency matrix are what the network-usage cost model weighs."""

    regions: list[str] = Field(default_factory=lambda: ["local"], min_length=1,
                               description="region names, in the order of latency_ms's rows")
    latency_ms: list[list[float]] = Field(
        default_factory=list,
        description="regions x regions link latency (ms) weighing bytes that cross them; empty: 0 within a "
                    "region, 1 between two")
    source_regions: dict[str, str] = Field(default_factory=dict,
                                           description="stream -> the region its producers are in (default: the first)")
    reuse: Literal["relax", "exact", "none"] = Field(
        default="relax",
        description="relax: widen a running operator and compensate (seed 002); exact: share only operators "
                    "that answer a query unchanged; none: one operator per query")
    port: int = Field(default=8470, ge=0, le=65535, description="the HTTP API's port (0 = any free port)")
    host: str = Field(default="127.0.0.1", description="the HTTP API's address")
    operator_workers: int = Field(default=1, ge=1, le=64, description="workers of each operator's job")
    operator_partitions: int = Field(default=4, ge=1, le=1000, description="partition groups of each operator's job")
    backfill_margin_ms: int = Field(
        default=60_000, ge=0,
        description="a new operator version seeks its sources by record timestamp to (barrier - window - "
                    "lateness - this): how far an event time may run ahead of its record's timestamp")
    barrier_delay_ms: int = Field(
        default=1_000, ge=0,
        description="a switch's event-time barrier lies at least this far past the newest result routed")

    @model_validator(mode="before")
    @classmethod
    def _retired_settings(cls, data: Any) -> Any:
        """Accepted and ignored: `catchup_ms`, which job files written for earlier releases may
        set (an operator version is exact however late it starts: join.repartition_watermarks)."""
        if isinstance(data, dict) and "catchup_ms" in data:
            data = {k: v for k, v in data.items() if k != "catchup_ms"}
        return data

    @model_validator(mode="after")
    def _regions(self) -> "QueriesSpec":
        n = len(self.regions)
        if len(set(self.regions)) != n:
            raise ValueError(f"queries.regions has duplicates: {self.regions}")
        if self.latency_ms and (len(self.latency_ms) != n or any(len(row) != n for row in self.latency_ms)):
            raise ValueError(f"queries.latency_ms must be {n} x {n} (one row and column per region)")
        if any(v < 0 or v != v for row in self.latency_ms for v in row):
            raise ValueError("queries.latency_ms holds non-negative numbers")
        unknown = sorted(set(self.source_regions.values()) - set(self.regions))
        if unknown:
            raise ValueError(f"queries.source_regions names regions {unknown} not in queries.regions {self.regions}")
        return self

    def latency(self, a: str, b: str) -> float:
        """The latency weight between regions `a` and `b`."""
        i, j = self.regions.index(a), self.regions.index(b)
        if self.latency_ms:
            return float(self.latency_ms[i][j])
        return 0.0 if i == j else 1.0


class WorkerSpec(_Strict):
    batch_ms: int = Field(default=200, gt=0, description="distribution epoch: the longest interval between "
                                                         "batches (their transactions), reached under load")
    min_batch_ms: int = Field(
        default=10, gt=0,
        description="the shortest interval between batches: the interval adapts between this and batch_ms, the "
                    "last batch's own time (the next starts once it is committed), so light input gets small, quick batches (low delay) and a "
                    "backlog large ones (fewer transactions per tuple)")
    max_batch_records: int = Field(default=200_000, gt=0,
                                   description="a batch starts as soon as this many records wait, whatever the interval")
    state_dir: Path = Path("./state")
    memory_bytes: int = Field(
        default=2 << 30, gt=0, validation_alias=AliasChoices("memory_bytes", "hot_bytes"),
        description="the worker's memory budget for window state (bytes of the windows held in memory; "
                    "worker.spill says what is pushed to disk past it); `hot_bytes` is its old name")
    spill: SpillSpec = SpillSpec()
    exactly_once: bool = True
    changelog: bool = Field(
        default=True,
        description="hash mode: mirror each group's state writes to <job>.changelog in the cycle's transaction, so "
                    "any worker rebuilds a group from it in time that grows with the window, not the job's age; "
                    "false: a worker without the group's disk replays every batch since the job began")
    max_record_bytes: int = Field(default=1 << 20, gt=0)
    heartbeat_ms: int = Field(default=1000, gt=0)
    stall_timeout_ms: int = Field(
        default=60_000, gt=0,
        description="a Kafka commit stuck this long ends the process; its supervisor restarts it into recovery",
    )
    metrics_port: int = Field(default=0, ge=0, description="0 = pick a free port")
    region: str = Field(default="local", description="the region this worker runs in (seed 002's network locality; "
                                                   "Helm sets it from the node's topology zone)")

    @model_validator(mode="after")
    def _check_batch_interval(self) -> "WorkerSpec":
        if self.min_batch_ms > self.batch_ms:
            raise ValueError(f"worker.min_batch_ms ({self.min_batch_ms}) must not exceed worker.batch_ms "
                             f"({self.batch_ms}): the batch interval adapts between the two")
        return self


class CoordinatorSpec(_Strict):
    """Placement and adaptation (hash mode). The adaptive policy's parameters default to the
    papers' values: seed 000 section VI-A Table 2 and section V-A (load balancing, degree of
    declustering), seed 003 sections 5.1-5.2 (memory balancing)."""

    heartbeat_timeout_ms: int = Field(default=10_000, gt=0)
    worker_timeout_ms: int = Field(
        default=30_000, gt=0,
        description="a worker silent this long is dead: with failover: reassign its groups go to live workers "
                    "(rebuilt from the changelog), and a move it was sending completes without it")
    failover: Literal["reassign", "wait"] = Field(
        default="reassign",
        description="reassign: a dead worker's groups move to live workers; wait: they wait for that worker "
                    "to come back with its disk (a StatefulSet pod)")
    expected_workers: int = Field(default=1, gt=0)
    metrics_port: int = Field(default=0, ge=0)
    placement: Literal["sticky", "adaptive"] = Field(
        default="sticky",
        description="sticky: a group stays where it is placed until an operator moves it or its worker dies. "
                    "adaptive: seed 000's load balancing and degree of declustering and seed 003's memory "
                    "balancing decide moves (services/coordinator/adapt.py), carried out through the migration "
                    "protocol at the end of each reorganisation epoch; `streamjoin rebalance --dry-run` shows the plan")
    buffer_bytes: int = Field(
        default=1 << 20, gt=0,
        description="a worker's buffer capacity: occupancy = mean backlog bytes over the reorganisation "
                    "epoch / buffer_bytes (seed 000 IV-C; 1 MB in its section VI-A)")
    reorg_epoch_ms: int = Field(
        default=20_000, gt=0,
        description="reorganisation epoch: how often load is rebalanced, and the span backlog is averaged "
                    "over (seed 000 Table 2: 20 s)")
    supplier_occupancy: float = Field(
        default=0.5, gt=0, le=1,
        description="a worker above this occupancy is a supplier and yields a group (seed 000 Table 2)")
    consumer_occupancy: float = Field(
        default=0.01, ge=0, lt=1,
        description="a worker below this occupancy is a consumer and may receive a group (seed 000 Table 2)")
    yield_group: Literal["random", "heaviest"] = Field(
        default="random",
        description="which group a supplier yields: a random one (seed 000 IV-C) or the one with the most "
                    "window state bytes")
    scale_lambda: float = Field(
        default=1.0, gt=0,
        description="scale out when suppliers > scale_lambda x consumers; scale in when there is no "
                    "supplier (seed 000 V-A)")
    scale_cooldown_ms: int = Field(
        default=60_000, ge=0,
        description="least time between two changes of the number of active workers (not in the paper: "
                    "three reorganisation epochs, so a change's moves show in the backlog before the next)")
    memory_balance_theta: float = Field(
        default=0.8, ge=0, le=1,
        description="move state from the fullest to the emptiest worker when M_least / M_most is below this "
                    "(seed 003 5.1, theta_d); 0 turns memory balancing off")
    memory_balance_interval_ms: int = Field(
        default=45_000, ge=0,
        description="least time between two memory balancings (seed 003 5.2: 45 s)")
    disk_adaptation: Literal["local", "lazy-disk", "active-disk"] = Field(
        default="lazy-disk",
        description="how memory balancing and the workers' spill work together (seed 003 6). local: each worker "
                    "spills on its own and balancing ignores it; lazy-disk: balancing never moves a group with "
                    "generations on disk and never starts in an epoch in which a worker pushed; active-disk: "
                    "lazy-disk, and when memory is balanced but output rates per group diverge (max/min > "
                    "output_rate_theta) the worker with the lowest rate is told to push its least productive "
                    "groups, at most M_q - M_c bytes")
    output_rate_theta: float = Field(
        default=2.0, gt=1,
        description="active-disk: Max_rate / Min_rate of the workers' output rates per group above which the "
                    "slowest is told to push (seed 003 6, theta_f; the paper gives no value)")

    @model_validator(mode="after")
    def _thresholds_ordered(self) -> "CoordinatorSpec":
        if self.consumer_occupancy >= self.supplier_occupancy:
            raise ValueError(f"coordinator.consumer_occupancy ({self.consumer_occupancy}) must be below "
                             f"coordinator.supplier_occupancy ({self.supplier_occupancy}): a worker cannot be "
                             "both a consumer and a supplier")
        if self.worker_timeout_ms < self.heartbeat_timeout_ms:
            raise ValueError(f"coordinator.worker_timeout_ms ({self.worker_timeout_ms}) must be at least "
                             f"coordinator.heartbeat_timeout_ms ({self.heartbeat_timeout_ms}): a worker is "
                             "declared dead only after it stopped counting as alive")
        return self


# The protocol steps a process can be made to crash at (FaultSpec), each between two durable
# actions of seed 003's migration protocol (services/coordinator/moves.py says which), or of
# the SplitJoin merger's transaction (services/splitjoin/merger.py). A process named like a key
# here has that key's steps; any other name is a worker id.
CRASH_STEPS = {
    "coordinator": ("move-stored", "release-stored", "failover-stored"),
    "merger": ("merger-written",),
    "worker": ("sender-committed", "receiver-fenced", "receiver-restored", "receiver-recovered", "spill-written",
               "core-output-written", "core-checkpointed"),  # the last two: a SplitJoin core's release transaction
}


class FaultSpec(_Strict):
    """Fault injection for crash tests and drills: each entry 'PROCESS:STEP' makes the named
    process (`coordinator`, `merger`, or a worker id) kill itself with SIGKILL the first time it reaches
    STEP; a marker file under `<worker.state_dir>/faults/` records the crash, so the restarted
    process goes on. Empty (the default) in production."""

    crash_at: list[str] = Field(
        default_factory=list,
        description="'coordinator:STEP', 'merger:STEP' or 'WORKER_ID:STEP'; coordinator steps: "
                    f"{', '.join(CRASH_STEPS['coordinator'])}; merger steps: {', '.join(CRASH_STEPS['merger'])}; "
                    f"worker steps: {', '.join(CRASH_STEPS['worker'])}")

    @field_validator("crash_at")
    @classmethod
    def _known_steps(cls, v: list[str]) -> list[str]:
        for entry in v:
            process, _, step = entry.partition(":")
            steps = CRASH_STEPS.get(process, CRASH_STEPS["worker"])
            if not re.fullmatch(r"[A-Za-z0-9_.-]+", process) or step not in steps:
                raise ValueError(f"{entry!r} is not PROCESS:STEP with a step of {process or 'the process'} "
                                 f"({', '.join(steps)})")
        return v


class WorkloadSpec(_Strict):
    """Generated workloads, all with Poisson arrivals:
    equijoin  seed 000: b-model keys over `domain`, `tuple_bytes`-sized JSON tuples;
    band      the handshake/SplitJoin band join: numbers uniform in 1..`value_max`;
    images    seed 004: RGB images of `pixels` pixels (Arrow blocks), drawn from
              round(1 / `selectivity`) scenes, so that share of pairs is similar;
    seed003   seed 003's partition groups of different productivity: each stream's one
              join key lands uniformly in the `partitions` groups, and group g gets
              join ratio j = join_ratios[g % len(join_ratios)]: within one range of
              `tuple_range` tuples (tuple_range / rate seconds) a tuple meets about j
              same-key tuples of each other stream (j^2 results in a 3-way join).
              Groups start on worker g % workers, so with 3 workers [4, 1, 1] makes
              worker 0's groups the productive ones (Figure 21), [4, 2, 1] thirds of
              the groups (Figure 11).
    airline   seed 002's Delta OIS example: streams flights, checkins, baggage and
              weather over one flight catalogue of `carriers` carriers (Zipf shares,
              exponent `carrier_skew`: a few big ones), about `flights_per_carrier`
              flights each, `terminals` terminals and `cities` destinations; each
              stream's rate is `rate` times its `rate_factors` entry."""

    kind: Literal["equijoin", "band", "images", "seed003", "airline"] = "equijoin"
    rate: float = Field(default=1500.0, gt=0, description="tuples/s per stream")
    skew: float = Field(default=0.7, ge=0.5, lt=1.0, description="b-model bias")
    domain: int = Field(default=1 << 20, gt=1, description="join-key domain size (power of two)")
    tuple_bytes: int = Field(default=64, ge=32)
    seconds: float = Field(default=30.0, gt=0)
    seed: int = 7
    value_max: int = Field(default=10_000, gt=0, description="band: values uniform in 1..value_max")
    pixels: int = Field(default=10_000, gt=0, description="images: pixels per image (3 bytes each)")
    selectivity: float = Field(default=0.1, gt=0, le=1, description="images: share of image pairs that match")
    tuple_range: int = Field(default=30_000, gt=0,
                             description="seed003: distinct join values per range of tuples, over all groups")
    join_ratios: list[float] = Field(default_factory=lambda: [4.0, 2.0, 1.0], min_length=1,
                                     description="seed003: group g's join ratio is join_ratios[g % len]")
    carriers: int = Field(default=12, ge=1, le=AIRLINE_MAX_CARRIERS, description="airline: carriers in the catalogue")
    carrier_skew: float = Field(default=1.0, ge=0, le=4,
                                description="airline: Zipf exponent of the carriers' shares of flights (0 = even)")
    flights_per_carrier: int = Field(default=40, ge=1, le=10_000,
                                     description="airline: mean flights per carrier (a carrier's share sets its own)")
    terminals: int = Field(default=5, ge=1, le=26, description="airline: terminals A, B, ... the gates lie in")
    cities: int = Field(default=30, ge=1, le=AIRLINE_MAX_CITIES, description="airline: destination (weather) cities")
    rate_factors: dict[str, float] = Field(
        default_factory=dict,
        description="stream name -> multiple of `rate` that stream is generated at (default 1): streams of one "
                    "workload need not share a rate (airline: weather reports are rarer than check-ins)")

    @field_validator("domain")
    @classmethod
    def _power_of_two(cls, v: int) -> int:
        if v & (v - 1):
            raise ValueError(f"domain must be a power of two for the b-model, e.g. {1 << v.bit_length()}")
        return v

    @field_validator("rate_factors")
    @classmethod
    def _finite_factors(cls, v: dict[str, float]) -> dict[str, float]:
        bad = {name: f for name, f in v.items() if not 0 < f < float("inf")}
        if bad:
            raise ValueError(f"rate factors are positive finite multiples of workload.rate, got {bad}")
        return v

    @field_validator("join_ratios")
    @classmethod
    def _positive(cls, v: list[float]) -> list[float]:
        # NaN fails both comparisons; infinity would size a group's key domain to nothing.
        bad = [r for r in v if not 0 < r < float("inf")]
        if bad:
            raise ValueError(f"join ratios are positive finite numbers (a group's same-key partners per stream per "
                             f"range), got {bad}")
        return v


class JobSettings(BaseModel):
    # hide_input_in_errors: a validation error's text would otherwise repeat the input, secrets included.
    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)

    job: str = Field(default="demo", pattern=r"^[a-zA-Z0-9_-]+$")
    bootstrap: str | None = Field(default=None, description="Kafka bootstrap; none = embedded broker")
    partitions: int = Field(default=60, gt=0, le=1000)
    streams: list[StreamSpec] = Field(min_length=2, max_length=8)
    join: JoinSpec = JoinSpec()
    worker: WorkerSpec = WorkerSpec()
    coordinator: CoordinatorSpec = CoordinatorSpec()
    ring: RingSpec = RingSpec()
    splitjoin: SplitJoinSpec = SplitJoinSpec()
    workload: WorkloadSpec = WorkloadSpec()
    output: OutputSpec = OutputSpec()
    faults: FaultSpec = FaultSpec()
    queries: QueriesSpec = QueriesSpec()
    topics: TopicsSpec = Field(
        default_factory=TopicsSpec,
        description="replication, min.insync.replicas, retention, cleanup policy and other configs per topic role")
    kafka: dict[str, KafkaValue | KafkaSecret] = Field(
        default_factory=dict,
        description="librdkafka properties for every client the job creates (security.protocol, sasl.*, ssl.*, "
                    "timeouts); a value may be {file: PATH} or {env: NAME}; secrets are masked "
                    "(streamjoin.settings.kafka); STREAMJOIN_KAFKA__SASL_PASSWORD sets sasl.password")

    @field_validator("kafka", mode="before")
    @classmethod
    def _read(cls, v: Any) -> Any:
        """Dotted names; references read and secrets wrapped (streamjoin.settings.kafka)."""
        if not isinstance(v, dict):
            return v
        return {name: kafka_settings.held(name, x, os.environ) for name, x in kafka_settings.overlay(v).items()}

    @field_validator("kafka")
    @classmethod
    def _not_ours(cls, v: dict[str, KafkaValue | KafkaSecret]) -> dict[str, KafkaValue | KafkaSecret]:
        taken = sorted(set(v) & set(RESERVED_KAFKA_SETTINGS))
        if taken:
            raise ValueError("; ".join(f"{k} is set by streamjoin ({RESERVED_KAFKA_SETTINGS[k]})" for k in taken))
        return v

    def kafka_client(self) -> dict[str, KafkaValue]:
        """The librdkafka properties every client of this job gets, secrets revealed: for librdkafka only."""
        return {k: v.get_secret_value() if isinstance(v, KafkaSecret) else v for k, v in self.kafka.items()}

    def job_file_data(self) -> dict[str, Any]:
        """These settings as a job file's mapping that another process loads back to the same settings:
        a secret by its reference ({env:}, {file:}) where it has one (children inherit the environment and
        see the same files), by value where it was given inline."""
        data = self.model_dump(mode="json")
        data["kafka"] = {k: v.written() if isinstance(v, KafkaSecret) else v for k, v in self.kafka.items()}
        return data

    @model_validator(mode="after")
    def _consistent(self) -> "JobSettings":
        names = [s.name for s in self.streams]
        if len(set(names)) != len(names):
            raise ValueError(f"stream names must be unique, got {names}")
        self._check_names()
        unknown = sorted(set(self.workload.rate_factors) - set(names))
        if unknown:
            raise ValueError(f"workload.rate_factors names streams {unknown} the job does not have ({names})")
        self._check_retention()
        self._check_reorg_epoch()
        self._check_join_type()
        if self.join.mode == "hash":
            self._check_hash_mode()
        else:
            self._check_predicate()
        if self.join.mode == "ring":
            self._check_ring_mode()
        if self.join.mode == "splitjoin":
            self._check_splitjoin_mode()
        return self

    def _check_names(self) -> None:
        taken = [s.name for s in self.streams if s.name in RESERVED_RESULT_NAMES]
        if taken:
            raise ValueError(f"stream names {taken} are taken by the result record's own fields "
                             f"{sorted(RESERVED_RESULT_NAMES)}")
        if self.output.format == "avro":
            bad = [f"{s.name}.{f}" for s in self.streams for f in s.fields if not AVRO_NAME.fullmatch(f)]
            if bad:
                raise ValueError(f"output.format avro needs Avro names ([A-Za-z_][A-Za-z0-9_]*) for fields, got {bad}")

    def _check_retention(self) -> None:
        """Input and by-key topics are what a window is rebuilt from: their retention must hold a
        record for its stream's time window plus the allowed lateness (late records carry older times)."""
        needed = self.longest_time_window_ms + self.join.allowed_lateness_ms
        roles = ("input", "by_key") if self.join.mode == "hash" else ("input",)  # by-key topics exist in hash mode only
        for role in roles:
            retention = self.topics.effective(role).retention_ms
            if retention is not None and retention != KEEP_FOREVER and retention < needed:
                raise ValueError(f"topics.{role}.retention_ms {retention} is shorter than the longest time window plus "
                                 f"join.allowed_lateness_ms ({needed} ms): records would expire while a window "
                                 "still needs them")

    def _check_reorg_epoch(self) -> None:
        """Occupancy averages the backlog a worker's heartbeats report over an epoch: it needs one."""
        if self.coordinator.reorg_epoch_ms < self.worker.heartbeat_ms:
            raise ValueError(f"coordinator.reorg_epoch_ms ({self.coordinator.reorg_epoch_ms}) is shorter than "
                             f"worker.heartbeat_ms ({self.worker.heartbeat_ms}): an epoch would hold no backlog "
                             "sample of a worker")

    def _check_join_type(self) -> None:
        """Outer, semi and anti joins decide a row when its window expires, which hash mode's
        per-group windows know exactly; the other modes are refused, with why."""
        if self.join.type == "inner":
            return
        if self.join.mode != "hash":
            raise ValueError(f"join.type {self.join.type} needs join.mode hash: in {self.join.mode} mode a tuple's "
                             "partners are spread over nodes or cores that never learn each other's matches, so "
                             "an unmatched row cannot be proven exactly")
        if len(self.streams) != 2:
            raise ValueError(f"join.type {self.join.type} joins two streams, got {len(self.streams)}: a multi-way "
                             "outer join is not supported")
        if self.worker.spill.mode == "deferred":
            raise ValueError(f"join.type {self.join.type} needs worker.spill.mode probe: a deferred generation's "
                             "matches are found only at its clean-up, after its rows' deadline")

    def _check_hash_mode(self) -> None:
        if self.worker.spill.mode == "deferred":
            counted = [s.name for s in self.streams if s.window.range_ms is None]
            if counted:
                raise ValueError(f"worker.spill.mode deferred needs RANGE windows; streams {counted} have count "
                                 "windows, whose membership depends on every generation (use mode: probe)")
        if self.join.predicate:
            raise ValueError("join.predicate is for join.mode: ring; hash mode joins on the streams' key_fields")
        missing = [s.name for s in self.streams if not s.key_fields]
        if missing:
            raise ValueError(f"hash mode joins on keys: give key_fields for streams {missing}")
        unhashable = [f"{s.name}.{k}" for s in self.streams for k in s.key_fields if s.fields[k] not in HASH_KEY_TYPES]
        if unhashable:
            raise ValueError(f"hash mode joins on equal keys of types {list(HASH_KEY_TYPES)}; key fields {unhashable} "
                             "are not (equality on floats or raw bytes is fragile: cast them upstream)")
        key_types = {tuple(s.fields[k] for k in s.key_fields) for s in self.streams}
        if len(key_types) != 1:
            raise ValueError(f"all streams must have key fields of the same types for an equi-join, got {key_types}")

    def _check_predicate(self) -> None:
        """Ring and SplitJoin modes: terms name existing fields, bands numeric ones, UDFs registered ones."""
        fields = {s.name: s.fields for s in self.streams}
        for i, term in enumerate(self.join.predicate):
            for side in (term.left, term.right):
                stream, field = side.split(".", 1)
                if stream not in fields or field not in fields[stream]:
                    raise ValueError(f"join.predicate.{i}: {side} names no field of a stream {sorted(fields)}")
                if term.kind == "band" and fields[stream][field] not in ("int", "float"):
                    raise ValueError(f"join.predicate.{i}: band term needs numeric fields, {side} is "
                                     f"{fields[stream][field]}")
            if term.udf is not None and term.udf not in self.join.udfs:
                raise ValueError(f"join.predicate.{i}: unknown UDF {term.udf!r}; register it under join.udfs "
                                 f"(known: {sorted(self.join.udfs) or 'none'})")

    def _check_ring_mode(self) -> None:
        fields = {s.name: s.fields for s in self.streams}
        for stream, order in self.join.order.items():
            others = sorted(n for n in fields if n != stream)
            if stream not in fields or sorted(order) != others:
                raise ValueError(f"join.order.{stream}: must list the other streams {others} once each")
        if isinstance(self.ring.nodes, int) and not 1 <= self.ring.nodes <= self.ring.max_nodes:
            raise ValueError(f"ring.nodes={self.ring.nodes} is impossible: give 1..ring.max_nodes "
                             f"({self.ring.max_nodes}) or 'auto'")

    def _check_splitjoin_mode(self) -> None:
        if len(self.streams) != 2:
            raise ValueError(f"join.mode splitjoin joins two streams (a pair belongs to the core of its older "
                             f"member), got {len(self.streams)}: use join.mode ring for multi-way joins")
        if self.join.idle_timeout_ms:
            raise ValueError("join.idle_timeout_ms must be unset in splitjoin mode: every core merges the sources "
                             "itself and a wall-clock idleness rule would give cores different sequences; an idle "
                             "partition is moved by a mark record (`streamjoin splitjoin tick`)")
        if self.splitjoin.cores > self.splitjoin.max_cores:
            raise ValueError(f"splitjoin.cores ({self.splitjoin.cores}) is above splitjoin.max_cores "
                             f"({self.splitjoin.max_cores})")

    @property
    def longest_time_window_ms(self) -> int:
        """The longest RANGE window over the streams (0 when all windows count rows)."""
        return max((s.window.range_ms or 0 for s in self.streams), default=0)

    def topic_of(self, stream: StreamSpec) -> str:
        return stream.topic or f"{self.job}.{stream.name}"

    @property
    def input_topics(self) -> list[str]:
        return [self.topic_of(s) for s in self.streams]

    def start_offset(self, topic: str, partition: int) -> int:
        """Where a group with no checkpoint starts reading `topic`'s `partition` (0: the beginning)."""
        return self.join.start_offsets.get(topic, {}).get(partition, 0)

    @property
    def results_topic(self) -> str:
        return self.output.topic or f"{self.job}.results"

    @property
    def commits_topic(self) -> str:
        """Internal: what recovery needs (batch boundaries, watermarks, ring releases), never on the results topic."""
        return f"{self.job}.commits"

    @property
    def changelog_topic(self) -> str:
        """Internal (hash mode): partition g holds group g's state writes (services/worker/changelog)."""
        return f"{self.job}.changelog"

    def by_key_topic(self, stream: StreamSpec) -> str:
        """Internal (hash mode): `stream`'s records re-routed to the partition of their join key."""
        return f"{self.job}.{stream.name}.by-key"

    def result_fields(self, stream: StreamSpec) -> dict[str, FieldType]:
        """The fields of `stream` each result carries: all of them, except in ring mode the bytes
        fields (images), which predicates read but results leave out."""
        return {n: t for n, t in stream.fields.items() if self.join.mode == "hash" or t != "bytes"}

    @property
    def dead_letter_topic(self) -> str:
        return f"{self.job}.dead-letter"

    @property
    def control_topic(self) -> str:
        return f"{self.job}.control"

    @property
    def queries_topic(self) -> str:
        """The query service's registry (compacted: the latest record per query and operator version)."""
        return f"{self.job}.queries"

    @property
    def placement_topic(self) -> str:
        return f"{self.job}.placement"

    @property
    def core_output_topic(self) -> str:
        """Internal (splitjoin mode): partition i holds core i's results and punctuations, for the merger."""
        return f"{self.job}.splitjoin.out"

    @property
    def core_changelog_topic(self) -> str:
        """Internal (splitjoin mode): partition i holds core i's stored blocks and checkpoints."""
        return f"{self.job}.splitjoin.changelog"

    @property
    def merger_topic(self) -> str:
        """Internal (splitjoin mode): the merger's checkpoints, written with the results they cover."""
        return f"{self.job}.merger"

    @property
    def ring_log_topic(self) -> str:
        """Ring mode: every round the head released, in order (one partition), for crash recovery."""
        return f"{self.job}.ring-rounds"

    @property
    def ring_epochs_topic(self) -> str:
        """Ring mode: node starts (each one a new ring epoch) and checkpoints, in order (one partition)."""
        return f"{self.job}.ring-epochs"

    def hop_topic(self, node: str) -> str:
        """Ring mode: the one-partition topic a ring node reads (FIFO from its predecessor)."""
        return f"{self.job}.ring.{node}"

    @property
    def consumer_group(self) -> str:
        return f"streamjoin-{self.job}"

    @property
    def emits_on_watermark(self) -> bool:
        """Count windows are final only once the watermark passes a result's time."""
        return any(s.window.is_rows for s in self.streams)


def _deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _explain(err: ValidationError, origin: str) -> str:
    lines = [f"invalid settings in {origin}:"]
    for e in err.errors():
        where = ".".join(str(p) for p in e["loc"]) or "(top level)"
        lines.append(f"  - {where}: {e['msg']}")
    lines.append("fix the named field(s) in the job file, the STREAMJOIN_* variable or the flag")
    return "\n".join(lines)


def load(path: Path | str | None = None, **overrides: Any) -> JobSettings:
    """Read the job file (if any), overlay env, then `overrides` (CLI flags, None = not given)."""
    data: dict[str, Any] = {}
    origin = "defaults"
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise SettingsError(f"job file {p} does not exist: pass the path of a YAML job file (example: streamjoin/jobs/seed000.yaml)")
        try:
            raw = yaml.safe_load(p.read_text())
        except yaml.YAMLError as e:
            raise SettingsError(f"job file {p} is not valid YAML: {e}") from e
        if not isinstance(raw, dict):
            raise SettingsError(f"job file {p} must hold a mapping at top level, got {type(raw).__name__}")
        data, origin = raw, str(p)
    flags = {k: v for k, v in overrides.items() if v is not None}
    try:
        env_only = _EnvOnly().model_dump(exclude_unset=True)
        merged = _deep_merge(_deep_merge(data, env_only), flags)
        # The kafka: sections overlay per property, never merging one reference into another.
        kafka = kafka_settings.overlay(data.get("kafka"), kafka_settings.from_environment(os.environ),
                                       flags.get("kafka"))
        return JobSettings(**(merged | {"kafka": kafka}))
    except ValidationError as e:
        # from None: the ValidationError's own text would show the input, secrets included.
        raise SettingsError(_explain(e, origin)) from None


class _EnvOnly(BaseSettings):
    """Reads only the environment, so env can be merged beneath CLI flags and above the file."""

    model_config = SettingsConfigDict(env_prefix="STREAMJOIN_", env_nested_delimiter="__", extra="ignore")

    job: str | None = None
    bootstrap: str | None = None
    partitions: int | None = None
    join: dict[str, Any] | None = None
    worker: dict[str, Any] | None = None
    coordinator: dict[str, Any] | None = None
    ring: dict[str, Any] | None = None
    splitjoin: dict[str, Any] | None = None
    workload: dict[str, Any] | None = None
    output: dict[str, Any] | None = None
    faults: dict[str, Any] | None = None
    queries: dict[str, Any] | None = None
    topics: dict[str, Any] | None = None
    # kafka: read by streamjoin.settings.kafka.from_environment, which keeps secrets as {env:} references.
