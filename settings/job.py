"""`JobSettings`, the one typed settings object every service reads: the job file's sections
together, the checks that span sections, and what the job derives from them.

Every service reads a `JobSettings` (made by `streamjoin.settings.load`); nothing else reads
`os.environ`."""

from __future__ import annotations

import os
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from streamjoin.settings import kafka as kafka_settings
from streamjoin.settings.coordinator import CoordinatorSpec
from streamjoin.settings.dev import FaultSpec, WorkloadSpec
from streamjoin.settings.join import JoinSpec
from streamjoin.settings.kafka import RESERVED_KAFKA_SETTINGS, ConsumerSpec, KafkaSecret, KafkaValue, TransactionSpec
from streamjoin.settings.output import AVRO_NAME, RESERVED_RESULT_NAMES, OutputSpec
from streamjoin.settings.queries import QueriesSpec
from streamjoin.settings.ring import RingSpec
from streamjoin.settings.splitjoin import SplitJoinSpec
from streamjoin.settings.streams import HASH_KEY_TYPES, FieldType, StreamSpec
from streamjoin.settings.topics import KEEP_FOREVER, TopicNames, TopicsSpec
from streamjoin.settings.worker import WorkerSpec


class JobSettings(TopicNames, BaseModel):
    """A job: its sections as the job file names them, checked together (`_consistent`). Topic
    names come from `TopicNames` (streamjoin.settings.topics)."""

    # hide_input_in_errors: a validation error's text would otherwise repeat the input, secrets included.
    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)

    job: str = Field(
        default="demo", pattern=r"^[a-zA-Z0-9_-]+$",
        description="the job's name: its internal topics (`<job>.commits`, `<job>.changelog`, ...) and its "
                    "consumer group (`streamjoin-<job>`) carry it, so two jobs on one cluster never share one")
    bootstrap: str | None = Field(
        default=None,
        description="Kafka bootstrap servers (host:port, comma-separated); unset: a command that needs a cluster "
                    "exits 2 asking for one, and `streamjoin demo` starts an embedded broker")
    partitions: int = Field(
        default=60, gt=0, le=1000,
        description="partitions of every topic the job creates and the number of partition groups (hash mode's "
                    "unit of placement, moves and recovery); an input topic with another partition count is read "
                    "as partitions j with j mod partitions = g")
    streams: list[StreamSpec] = Field(
        min_length=2, max_length=8,
        description="the streams to join, 2 to 8 with unique names: each one's topic, record format, fields, time "
                    "and key fields, window and source filter")
    join: JoinSpec = Field(
        default=JoinSpec(),
        description="what to join and how: join type and mode, lateness, idle inputs, read-ahead, predicate terms "
                    "and UDFs (ring and SplitJoin modes), repartitioning and start offsets")
    worker: WorkerSpec = Field(
        default=WorkerSpec(),
        description="each join worker's batching, state directory, memory budget and spill, exactly-once output, "
                    "changelog, heartbeats and metrics port")
    coordinator: CoordinatorSpec = Field(
        default=CoordinatorSpec(),
        description="the coordinator: failure detection and failover, placement (sticky or adaptive) and the "
                    "adaptive policy's load balancing, scaling and memory balancing")
    ring: RingSpec = Field(
        default=RingSpec(),
        description="the PSP ring (join.mode: ring): its size, rounds in flight, slice balancing, relocation on a "
                    "resize, standbys and crash recovery")
    splitjoin: SplitJoinSpec = Field(
        default=SplitJoinSpec(),
        description="SplitJoin (join.mode: splitjoin): its cores, the most a scale may ask for, punctuation "
                    "precision and release interval")
    workload: WorkloadSpec = Field(
        default=WorkloadSpec(),
        description="the generated workload that `streamjoin sources` (the demo, the benchmarks, the tests) "
                    "writes to the job's input topics; a production job leaves it out")
    output: OutputSpec = Field(default=OutputSpec(), description="where and how results are written: their format "
                                                                 "and topic")
    faults: FaultSpec = Field(
        default=FaultSpec(),
        description="fault injection for crash tests and drills: protocol steps at which a named process kills "
                    "itself; empty in production")
    queries: QueriesSpec = Field(
        default=QueriesSpec(),
        description="the continuous-query service (`streamjoin queries`): regions and their latencies, how far "
                    "operators are shared, its HTTP API and how operator versions start")
    topics: TopicsSpec = Field(
        default_factory=TopicsSpec,
        description="replication, min.insync.replicas, retention, cleanup policy and other configs per topic role")
    kafka: dict[str, KafkaValue | KafkaSecret] = Field(
        default_factory=dict,
        description="librdkafka properties for every client the job creates (security.protocol, sasl.*, ssl.*, "
                    "timeouts); a value may be {file: PATH} or {env: NAME}; secrets are masked "
                    "(streamjoin.settings.kafka); STREAMJOIN_KAFKA__SASL_PASSWORD sets sasl.password")
    transactions: TransactionSpec = Field(
        default=TransactionSpec(),
        description="how long the job's transactional producers and the broker wait on a transaction before "
                    "giving up on it")
    consumers: ConsumerSpec = Field(
        default=ConsumerSpec(),
        description="how long the broker may hold the job's consumers' empty fetches: data and control plane")

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
        self._check_windows()
        self._check_join_type()
        if self.join.mode == "hash":
            self._check_hash_mode()
        else:
            self._check_predicate()
        self._check_hot_key_slots()
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

    def _check_windows(self) -> None:
        """A window join needs a window on every stream; an as-of join has none (its state is
        bounded by the lateness) and its own limits (`_check_asof`)."""
        if self.join.table is not None:
            self._check_asof()
            return
        missing = [i for i, s in enumerate(self.streams) if s.window is None]
        if missing:
            raise ValueError(f"streams.{missing[0]}.window: every stream of a window join needs a window "
                             "(range_ms, rows, tumbling_ms or hopping_ms); only an as-of join (join.table) has none")
        self._check_instances()

    def _check_instances(self) -> None:
        """Tumbling and hopping windows: a result is a combination inside one instance, so every
        stream needs the same instances; hash mode runs them (engine/window_instances.py)."""
        instances = [s.window.instance for s in self.streams]  # type: ignore[union-attr]
        if all(i is None for i in instances):
            return
        differ = next((i for i, w in enumerate(instances) if w != instances[0]), None)
        if differ is not None:
            raise ValueError(f"streams.{differ}.window: a tumbling or hopping window join needs the same window on "
                             f"every stream (streams.0.window is {self._window_text(0)}, streams.{differ}.window "
                             f"{self._window_text(differ)})")
        if self.join.mode != "hash":
            raise ValueError(f"join.mode {self.join.mode}: tumbling and hopping windows need join.mode hash (their "
                             "instances are joined per key in partition groups)")

    def _window_text(self, stream: int) -> str:
        window = self.streams[stream].window
        assert window is not None
        return ", ".join(f"{k}: {v}" for k, v in window.model_dump(exclude_none=True).items())

    @property
    def window_instance(self) -> tuple[int, int] | None:
        """A tumbling or hopping window join's (size, slide) in ms, the same on every stream; None
        for RANGE and ROWS windows and as-of joins."""
        window = self.streams[0].window
        return window.instance if window is not None else None

    def _check_asof(self) -> None:
        names = [s.name for s in self.streams]
        if self.join.table not in names:
            raise ValueError(f"join.table {self.join.table!r} names no stream of the job ({names})")
        if len(self.streams) != 2 or self.join.mode != "hash":
            raise ValueError("join.table: an as-of join joins one stream with one table, in join.mode hash")
        if self.join.type not in ("inner", "left"):
            raise ValueError(f"join.table: an as-of join is inner or left (a tuple with no valid version is dropped "
                             f"or null-padded), not {self.join.type}")
        windowed = [i for i, s in enumerate(self.streams) if s.window is not None]
        if windowed:
            raise ValueError(f"streams.{windowed[0]}.window: an as-of join has no window (a tuple joins the version "
                             "valid at its time, however old); leave it out")
        if self.join.idle_timeout_ms or self.join.repartition_watermarks:
            raise ValueError("join.idle_timeout_ms and join.repartition_watermarks must be unset for an as-of join: "
                             "a tuple is joined only once the table's watermark has passed it, which an idleness "
                             "rule would decide by the wall clock")
        if self.worker.spill.mode == "deferred":
            raise ValueError("join.table: an as-of join needs worker.spill.mode probe (its versions are one state)")

    @property
    def table_index(self) -> int | None:
        """An as-of join: the index of its table among the streams (None: a window join)."""
        names = [s.name for s in self.streams]
        return names.index(self.join.table) if self.join.table in names else None

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
            counted = [s.name for s in self.streams if s.window is not None and s.window.is_rows]
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

    def _check_hot_key_slots(self) -> None:
        """Splitting hot keys runs in hash mode's groups, and only where every tuple of a group is
        in its window in memory (a deferred generation is joined by its own group alone)."""
        if not self.coordinator.hot_key_slots:
            return
        if self.join.mode != "hash":
            raise ValueError(f"coordinator.hot_key_slots needs join.mode hash: it splits a partition group's key "
                             f"over other groups, which {self.join.mode} mode does not have")
        if self.worker.spill.mode == "deferred":
            raise ValueError("coordinator.hot_key_slots needs worker.spill.mode probe: a deferred generation's tuples "
                             "are joined only by their own group's clean-up, so a slot could never meet them")

    @property
    def slots(self) -> range:
        """Hash mode's slot groups (coordinator.hot_key_slots), numbered after the partition groups."""
        return range(self.partitions, self.partitions + self.coordinator.hot_key_slots)

    @property
    def group_count(self) -> int:
        """Partition groups and slots: the partitions of every per-group topic (commits, changelog,
        dead letters, results)."""
        return self.partitions + self.coordinator.hot_key_slots

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
        """The longest time window over the streams, a RANGE or an instance size (0 when all
        windows count rows)."""
        return max((s.window.span_ms or 0 for s in self.streams if s.window is not None), default=0)

    def start_offset(self, topic: str, partition: int) -> int:
        """Where a group with no checkpoint starts reading `topic`'s `partition` (0: the beginning)."""
        return self.join.start_offsets.get(topic, {}).get(partition, 0)

    def result_fields(self, stream: StreamSpec) -> dict[str, FieldType]:
        """The fields of `stream` each result carries: all of them, except in ring mode the bytes
        fields (images), which predicates read but results leave out."""
        return {n: t for n, t in stream.fields.items() if self.join.mode == "hash" or t != "bytes"}

    @property
    def consumer_group(self) -> str:
        return f"streamjoin-{self.job}"

    @property
    def emits_on_watermark(self) -> bool:
        """Count windows are final only once the watermark passes a result's time."""
        return any(s.window is not None and s.window.is_rows for s in self.streams)
