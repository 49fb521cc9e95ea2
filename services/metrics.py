"""Prometheus metrics and the health endpoint every service serves.

Names are the contract with ops/ (rules, dashboards): change them together.
"""

from __future__ import annotations

import threading
from typing import Iterator
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, make_wsgi_app
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector

REGISTRY = CollectorRegistry()


class BlockHistogram(Collector):
    """A Prometheus histogram fed a whole NumPy block at a time (one call per
    batch, not per result), exposed in the standard histogram format."""

    def __init__(self, name: str, documentation: str, buckets: tuple[float, ...],
                 registry: CollectorRegistry) -> None:
        self.name, self.documentation = name, documentation
        self._edges = np.asarray(buckets, dtype=np.float64)
        self._counts = np.zeros(len(buckets) + 1, dtype=np.int64)
        self._sum = 0.0
        self._lock = threading.Lock()
        registry.register(self)

    def observe_many(self, values: np.ndarray) -> None:
        if not len(values):
            return
        # Bucket `le=e` counts values <= e: the first edge >= v is v's bucket.
        counts = np.bincount(np.searchsorted(self._edges, values, side="left"), minlength=len(self._counts))
        with self._lock:
            self._counts += counts
            self._sum += float(values.sum())

    def collect(self) -> Iterator[HistogramMetricFamily]:
        with self._lock:
            cumulative = np.cumsum(self._counts)
            total = self._sum
        buckets = [(repr(float(e)), float(c)) for e, c in zip(self._edges, cumulative[:-1])]
        buckets.append(("+Inf", float(cumulative[-1])))
        yield HistogramMetricFamily(self.name, self.documentation, buckets=buckets, sum_value=total)


TUPLES_IN = Counter("streamjoin_tuples_in", "Input tuples accepted into the join", ["stream"], registry=REGISTRY)
READ_AHEAD = Counter("streamjoin_read_ahead_records", "Input records taken while the broker acknowledged the "
                     "cycle before (hash workers read the next batch during those waits)", registry=REGISTRY)
RESULTS_OUT = Counter("streamjoin_results_out", "Join results produced", registry=REGISTRY)
DEAD_LETTER = Counter("streamjoin_dead_letter", "Records sent to the dead-letter topic", ["reason"], registry=REGISTRY)
FILTERED = Counter("streamjoin_filtered_tuples", "Tuples skipped before the join: outside their stream's source "
                   "filter (reason where) or older than join.start_event_ms (reason before_start)",
                   ["stream", "reason"], registry=REGISTRY)
STATE_BYTES = Gauge("streamjoin_window_state_bytes", "Window state bytes per partition group", ["group"],
                    registry=REGISTRY)
STATE_TUPLES = Gauge("streamjoin_window_state_tuples", "Window tuples per partition group", ["group"],
                     registry=REGISTRY)
STATE_TUPLES_PEAK = Gauge("streamjoin_window_state_tuples_peak",
                          "The most window tuples this worker has held in memory at once (all groups), since start",
                          registry=REGISTRY)
PAUSED_PARTITIONS = Gauge("streamjoin_intake_paused_partitions",
                          "Input partitions paused because their stream reads too far ahead in event time "
                          "(join.max_read_ahead_ms)", registry=REGISTRY)
INTAKE_PAUSES = Counter("streamjoin_intake_pauses_total",
                        "Input partitions paused by event-time aligned intake", registry=REGISTRY)
HOT_BYTES = Gauge("streamjoin_hot_state_bytes", "Window bytes held in memory (the rest is in RocksDB only)",
                  registry=REGISTRY)
HOT_LIMIT = Gauge("streamjoin_hot_state_limit_bytes", "worker.memory_bytes: the in-memory budget for windows",
                  registry=REGISTRY)
# Spill (the spill paper, section 4; worker.spill).
SPILLED_BYTES = Gauge("streamjoin_spilled_bytes", "Window bytes of owned groups held on disk only", registry=REGISTRY)
GENERATIONS = Gauge("streamjoin_spill_generations", "Spilled generations not cleaned up yet (deferred spill)",
                    registry=REGISTRY)
CLEANUP_BACKLOG = Gauge("streamjoin_cleanup_backlog_bytes", "Bytes of spilled generations awaiting clean-up",
                        registry=REGISTRY)
PUSHES = Counter("streamjoin_spill_pushes_total", "Groups pushed to disk, by what asked (budget, coordinator)",
                 ["reason"], registry=REGISTRY)
PUSHED_BYTES = Counter("streamjoin_spill_pushed_bytes_total", "Window bytes pushed to disk", registry=REGISTRY)
CLEANUPS = Counter("streamjoin_cleanups_total", "Generations cleaned up (deferred spill)", registry=REGISTRY)
CLEANUP_RESULTS = Counter("streamjoin_cleanup_results_total", "Results produced by clean-up passes",
                          registry=REGISTRY)
CLEANUP_SECONDS = Histogram("streamjoin_cleanup_seconds", "Time of one generation's clean-up pass",
                            registry=REGISTRY)
LAG = Gauge("streamjoin_consumer_lag", "Records in the worker's input partitions not yet joined", registry=REGISTRY)
GROUPS = Gauge("streamjoin_assigned_groups", "Partition groups this worker owns", registry=REGISTRY)
BATCH_SECONDS = Histogram("streamjoin_batch_seconds", "Time to join one batch (all groups of one poll)",
                          buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10), registry=REGISTRY)
DELAY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60)
DELAY_SECONDS = BlockHistogram("streamjoin_production_delay_seconds",
                               "Result wall time minus wall arrival of its newest input", DELAY_BUCKETS, REGISTRY)
UNMATCHED = Counter("streamjoin_unmatched_rows_total", "Null-padded rows emitted for rows proven unmatched "
                    "(join.type left, right, full, anti)", registry=REGISTRY)
ASOF_VERSIONS = Gauge("streamjoin_asof_versions", "As-of joins: table versions a group holds (those a future tuple "
                      "can still need)", ["group"], registry=REGISTRY)
ASOF_WAITING = Gauge("streamjoin_asof_waiting_tuples", "As-of joins: stream tuples a group holds until the table's "
                     "watermark passes them", ["group"], registry=REGISTRY)
AWAITING_DECISION = Gauge("streamjoin_rows_awaiting_decision", "Live rows of the decided streams (join.type not "
                          "inner) that no result has held yet: each waits for a match or for the watermark to pass "
                          "its deadline (an input that holds the watermark back holds them)", registry=REGISTRY)
UNMATCHED_DELAY_SECONDS = BlockHistogram(
    "streamjoin_unmatched_delay_seconds", "Emission wall time of an unmatched row minus its deadline (event time + "
    "window + allowed lateness, time windows; meaningful when event time follows the wall clock)",
    DELAY_BUCKETS, REGISTRY)
REPARTITIONED = Counter("streamjoin_repartitioned_records", "Misrouted records forwarded to their group's "
                        "by-key partition (join.repartition: auto)", ["stream"], registry=REGISTRY)
SPLIT_SENT = Counter("streamjoin_split_sent_tuples", "Tuples of split hot keys a group sent its slots, by kind: "
                     "fragmented (its share of the spread stream: joined in the slot only) and replicated (the other "
                     "stream's, sent to every slot, the window's copy at the split included)", ["kind"],
                     registry=REGISTRY)
SPLIT_SKIPPED = Counter("streamjoin_split_records_skipped", "Records a slot read on <job>.split and skipped as taken "
                        "before (a retried write) or of an episode older than the one it serves", registry=REGISTRY)
REPARTITION_DUPLICATES = Counter("streamjoin_repartition_duplicates", "Forwarded records seen again after a retried "
                                 "cycle, and skipped", registry=REGISTRY)
RECOVERED_BATCHES = Counter("streamjoin_recovered_batches", "Batches replayed at start to catch state up",
                            registry=REGISTRY)
RECOVERIES = Counter("streamjoin_recoveries", "Recovery runs completed (groups taken on at start or by assignment, "
                     "groups of a failed cycle), whether or not a batch needed replaying", registry=REGISTRY)
CHANGELOG_RECORDS = Counter("streamjoin_changelog_records", "Changelog records of group state: written by cycles "
                            "and replays, read by restores", ["op"], registry=REGISTRY)
CHANGELOG_BYTES = Counter("streamjoin_changelog_written_bytes", "Bytes of group state written to the changelog",
                          registry=REGISTRY)
CHANGELOG_RESTORES = Counter("streamjoin_changelog_restores", "Groups whose state was rebuilt from the changelog "
                             "(no local copy, or an older one)", registry=REGISTRY)
RESTORE_SECONDS = Histogram("streamjoin_restore_seconds", "Time to rebuild one recovery's groups from the changelog",
                            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120), registry=REGISTRY)
MIGRATIONS = Counter("streamjoin_migrations", "Group moves by outcome: done (the receiver holds the group), "
                     "refused (a move or drain request that could not start), failover (a dead worker's group "
                     "given to a live one)", ["outcome"], registry=REGISTRY)
MIGRATIONS_IN_FLIGHT = Gauge("streamjoin_migrations_in_flight", "Group moves started and not yet held by their "
                             "receiver", registry=REGISTRY)
MIGRATION_PAUSE_SECONDS = Histogram("streamjoin_migration_pause_seconds", "From a move's start to its receiver "
                                    "holding the group (the sender's last cycle, the handover, the restore)",
                                    buckets=(0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120), registry=REGISTRY)
MIGRATED_BYTES = Counter("streamjoin_migrated_bytes", "Window bytes of the groups moved (as their senders last "
                         "reported them)", registry=REGISTRY)
FENCED = Counter("streamjoin_fenced_workers", "Dead workers whose transactions this worker fenced before "
                 "recovering the groups they held", registry=REGISTRY)
WORKERS_ALIVE = Gauge("streamjoin_coordinator_workers_alive", "Workers with a recent heartbeat", registry=REGISTRY)
GROUPS_PLACED = Gauge("streamjoin_coordinator_groups_placed", "Partition groups with an owner", registry=REGISTRY)
HOT_KEYS = Gauge("streamjoin_coordinator_hot_keys", "Join keys the coordinator holds hot: at least "
                 "coordinator.hot_key_share of the job's input, until they fall below hot_key_cool_share",
                 registry=REGISTRY)
HOT_KEY_SHARE = Gauge("streamjoin_coordinator_hot_key_share", "Each hot key's share of the job's input, by "
                      "partition group and key (the series goes when the key cools)", ["group", "key"],
                      registry=REGISTRY)
SPLIT_KEYS = Gauge("streamjoin_coordinator_split_keys", "Hot keys split over slots (coordinator.hot_key_slots), "
                   "by partition group and key: the split factor (sub-groups: the group and its slots) while the "
                   "split or its merge is in force (the series goes when the merge ends)", ["group", "key"],
                   registry=REGISTRY)
SPLIT_REFUSALS = Counter("streamjoin_coordinator_split_refusals_total", "Hot keys left unsplit, by reason: "
                         "multiway, as-of, count-window, full-join (the join cannot split exactly), no-slot (no free "
                         "slot on another alive worker)", ["reason"], registry=REGISTRY)
SPLIT_EPISODES = Counter("streamjoin_coordinator_split_episodes_total", "Hot key splits by step: split (started), "
                         "merging (the key cooled), merged (ended, its slots free)", ["step"], registry=REGISTRY)
PUSH_ORDERS = Counter("streamjoin_coordinator_push_orders_total", "Push orders sent to workers (active-disk, the "
                      "spill paper's section 6: the worker with the lowest output rate per group pushes state to disk)",
                      registry=REGISTRY)
RING_MESSAGES = Counter("streamjoin_ring_messages", "Ring messages handled by this node", ["kind"],
                        registry=REGISTRY)
RING_SLICE_TUPLES = Gauge("streamjoin_ring_slice_tuples", "Tuples in this ring node's slices (incl. marked)",
                          ["stream"], registry=REGISTRY)
RING_RESPONSE_SECONDS = BlockHistogram(
    "streamjoin_ring_response_seconds",
    "Ring mode: result produced minus the release of its round by the head (PSP's response latency)",
    DELAY_BUCKETS, REGISTRY)
RING_FAILED = Gauge("streamjoin_ring_failed", "1 once the ring stopped producing results, by reason "
                    "(node-restarted, stale-epoch, delivery)", ["reason"], registry=REGISTRY)
RING_STALE = Counter("streamjoin_ring_stale_messages", "Hop messages dropped: sent in an older ring epoch (before "
                     "a rollback), or by another incarnation of their node than the ring started with (recovery off)",
                     registry=REGISTRY)
RING_EPOCH = Gauge("streamjoin_ring_epoch", "The ring epoch this node is in (the offset of its RingStart on the "
                   "epochs topic; every node start opens one)", registry=REGISTRY)
RING_RECOVERIES = Counter("streamjoin_ring_recoveries_total", "Rollbacks of this node to the last ring checkpoint",
                          registry=REGISTRY)
RING_REDRIVEN = Counter("streamjoin_ring_rounds_redriven_total", "Logged rounds the head released again after a "
                        "rollback", registry=REGISTRY)
RING_RECOVERY_SECONDS = Gauge("streamjoin_ring_recovery_seconds", "Last rollback at the head: seconds from its start "
                              "until every re-driven round was back", registry=REGISTRY)
RING_CHECKPOINTS = Counter("streamjoin_ring_checkpoints_total", "Ring checkpoints the head wrote", registry=REGISTRY)
RING_LOGGED_BYTES = Counter("streamjoin_ring_logged_bytes_total", "Bytes of rounds the head wrote to the round log",
                            registry=REGISTRY)
RING_ROUNDS = Counter("streamjoin_ring_rounds", "Rounds the ring head closed", registry=REGISTRY)
RING_REPLACED = Counter("streamjoin_ring_replaced_total", "ring nodes handed to a standby", registry=REGISTRY)
RING_HANDLE_SECONDS = Histogram("streamjoin_ring_handle_seconds", "Time to handle one ring message",
                                buckets=(.0005, .001, .005, .01, .05, .1, .5, 1, 5), registry=REGISTRY)
OFFSETS_RECOMMITTED = Counter("streamjoin_offsets_recommitted", "Idle input partitions whose committed offset was "
                              "behind the worker's position (reason=marker: only transaction markers since; "
                              "reason=lost: a batch's committed offset read back older)", ["reason"],
                              registry=REGISTRY)
# SplitJoin cores: one core per process, so no core label.
SPLITJOIN_CORE_TUPLES_IN = Counter("streamjoin_splitjoin_core_tuples_in_total", "Input tuples the core's input order "
                                   "released to it (every core sees every tuple)", ["stream"], registry=REGISTRY)
SPLITJOIN_CORE_STORED = Counter("streamjoin_splitjoin_core_tuples_stored_total", "Tuples the core stored in its "
                                "sub-window (its share under the storage schedule)", ["stream"], registry=REGISTRY)
SPLITJOIN_CORE_RESULTS = Counter("streamjoin_splitjoin_core_results_total", "Results the core wrote to its "
                                 "core-output partition", registry=REGISTRY)
SPLITJOIN_CORE_THROUGH = Gauge("streamjoin_splitjoin_core_through", "Input sequence number below which every result "
                               "the core probes for has been found", registry=REGISTRY)
SPLITJOIN_CORE_PUNCTUATION = Gauge("streamjoin_splitjoin_core_punctuation", "The core's latest punctuation (through "
                                   "at splitjoin.punctuate_every precision)", registry=REGISTRY)
SPLITJOIN_CORE_HELD = Gauge("streamjoin_splitjoin_core_held_tuples", "Tuples the core's input order read and has not "
                            "released yet (waiting for the watermark)", registry=REGISTRY)
SPLITJOIN_CORE_STATE_TUPLES = Gauge("streamjoin_splitjoin_core_state_tuples", "Tuples in the core's sub-window",
                                    ["stream"], registry=REGISTRY)
SPLITJOIN_CORE_STATE_BYTES = Gauge("streamjoin_splitjoin_core_state_bytes", "Bytes of the core's sub-windows",
                                   registry=REGISTRY)
SPLITJOIN_CORE_RELEASES = Counter("streamjoin_splitjoin_core_releases_total", "Releases the core wrote (one Kafka "
                                  "transaction each; releases that changed nothing are not written)", registry=REGISTRY)
SPLITJOIN_CORE_RESTORES = Counter("streamjoin_splitjoin_core_restores_total", "Core starts and restarts by where its "
                                  "state came from: own (its changelog checkpoint), bootstrap (core 0's snapshot of "
                                  "the scale mark that added it), fresh (the sources' beginning)", ["source"],
                                  registry=REGISTRY)
# SplitJoin merger (the SplitJoin paper, section 5).
SPLITJOIN_MERGER_RESULTS = Counter("streamjoin_splitjoin_merger_results_total",
                                   "Results the SplitJoin merger wrote to the results topic, in input order",
                                   registry=REGISTRY)
SPLITJOIN_MERGER_FRONTIER = Gauge("streamjoin_splitjoin_merger_frontier",
                                  "Input sequence number below which every result has been written",
                                  registry=REGISTRY)
SPLITJOIN_MERGER_HELD = Gauge("streamjoin_splitjoin_merger_held_results",
                              "Results read from the cores and waiting for the frontier", registry=REGISTRY)
SPLITJOIN_MERGER_HOLDING = Gauge("streamjoin_splitjoin_merger_holding_core",
                                 "1 for the core(s) holding the frontier back (the lowest mark), else 0", ["core"],
                                 registry=REGISTRY)
SPLITJOIN_MERGER_LATENCY = BlockHistogram(
    "streamjoin_splitjoin_merger_added_latency_seconds",
    "The merger's added latency: the wall time a result was written minus its produced_ms (when its core made it)",
    DELAY_BUCKETS, REGISTRY)
SPLITJOIN_MERGER_UNREADABLE = Counter("streamjoin_splitjoin_merger_unreadable_records_total",
                                      "Core-output records the merger could not read (skipped, logged with "
                                      "partition and offset)", registry=REGISTRY)
SPLITJOIN_MERGER_DROPPED = Counter(
    "streamjoin_splitjoin_merger_dropped_total",
    "What the merger read and did not write again, by reason: duplicate (results an aborted core attempt wrote "
    "and its retry re-sent), released (results re-read after a restart, written before it), rewritten (results "
    "an aborted merger attempt wrote, visible on brokers that show aborted records), unfinished (pieces of a "
    "release its core abandoned)", ["reason"], registry=REGISTRY)
SPLITJOIN_MERGER_RESTORES = Counter("streamjoin_splitjoin_merger_restores_total",
                                    "Merger starts that restored a checkpoint", registry=REGISTRY)
BROKER_ERRORS = Counter("streamjoin_broker_errors", "Kafka errors seen (retried)", ["kind"], registry=REGISTRY)


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # scrapes are not news
        pass


class HealthState:
    """What /healthz reports: ok once the service is running its loop."""

    def __init__(self) -> None:
        self.ready = False
        self.detail = "starting"


def serve(port: int, health: HealthState, host: str = "0.0.0.0") -> WSGIServer:
    """Serve /metrics (Prometheus text) and /healthz on `port` (0 = any free port)."""
    metrics_app = make_wsgi_app(REGISTRY)

    def app(environ, start_response):  # type: ignore[no-untyped-def]
        if environ.get("PATH_INFO") == "/healthz":
            status = "200 OK" if health.ready else "503 Service Unavailable"
            start_response(status, [("Content-Type", "text/plain")])
            return [health.detail.encode()]
        return metrics_app(environ, start_response)

    server = make_server(host, port, app, handler_class=_Quiet)
    threading.Thread(target=server.serve_forever, daemon=True, name="metrics").start()
    return server


def serve_url(port: int, health: HealthState) -> str:
    """`serve` on `port` (0 = any free port); the URL a heartbeat reports for scraping."""
    return f"http://127.0.0.1:{serve(port, health).server_port}/metrics"
