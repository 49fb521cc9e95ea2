"""The `spill` benchmark's simulation (bench/spill.py describes the experiments): its plans,
the generated input of the 3-way join, in-process workers (a WindowedStore on RocksDB and the
worker's batch function, no Kafka) on simulated time, moving a group between them, and one run
of a policy with its figures."""

from __future__ import annotations

import random
import shutil
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Sequence

import numpy as np
from rich.progress import Progress

from streamjoin.bench.local_records import LocalRecord
from streamjoin.engine.block import Block
from streamjoin.schemas.codecs import encode_block
from streamjoin.schemas.join_keys import key_text
from streamjoin.services import workloads
from streamjoin.services.coordinator.adapt import plan_epoch
from streamjoin.services.coordinator.epoch import History, WorkerObservation
from streamjoin.services.hash.processor import join_plan, run_cycle
from streamjoin.services.io.intake import RecordBuffer, routing_for
from streamjoin.services.io.templates import stream_templates
from streamjoin.settings import CoordinatorSpec, JobSettings, load
from streamjoin.state.partition import group_prefix
from streamjoin.state.store import Store
from streamjoin.state.windowed import WindowedStore
from streamjoin.topology.partitioner import partitions_for_keys


STREAMS = "abc"


@dataclass(frozen=True)
class Plan:
    partitions: int  # groups
    rate: float  # tuples/s per stream
    window_ms: int  # every stream's RANGE window
    batch_ms: int  # simulated event time per cycle
    seconds: float  # simulated run length
    ranges: float  # ranges per window: a tuple meets about ranges * j partners per stream
    epoch_ms: int  # reorganisation epoch (plan_epoch)
    interval_ms: int  # coordinator.memory_balance_interval_ms
    bucket_s: float  # width of a point of the curves


# The window spans the whole run, so state grows all run long (the paper's long-running queries
# whose memory grows until the end) and a spilled generation is cleaned up in the clean-up stage at
# the end (the flush); a window holds `ranges` ranges, so a tuple meets up to ranges x j partners.
FULL = Plan(partitions=24, rate=800, window_ms=120_000, batch_ms=1000, seconds=120, ranges=2.0, epoch_ms=5000,
            interval_ms=5000, bucket_s=5.0)
QUICK = Plan(partitions=12, rate=200, window_ms=12_000, batch_ms=1000, seconds=12, ranges=2.0, epoch_ms=2000,
             interval_ms=2000, bucket_s=2.0)
THETA_PAPER = CoordinatorSpec.model_fields["memory_balance_theta"].default  # the job default, the spill paper's 0.8
PUSH_FRACTION = 0.3  # the spill paper's 4.4: 30%


# ---------------------------------------------------------------- input


@dataclass
class Inputs:
    """Every batch's tuples, per stream: (group of each tuple, its columns)."""

    batches: list[list[tuple[np.ndarray, dict[str, np.ndarray]]]]
    tuples: int


def make_job(plan: Plan, path: Path, ratios: Sequence[float], budget: int, victims: str = "productivity",
             disk_adaptation: str = "lazy-disk", theta: float = THETA_PAPER) -> JobSettings:
    """The 3-way job of every experiment; theta: coordinator.memory_balance_theta (theta_d)."""
    streams = [{"name": n, "fields": {"k": "int", "ts": "int"}, "time_field": "ts", "key_fields": ["k"],
                "format": "blocks", "window": {"range_ms": plan.window_ms}} for n in STREAMS]
    tuple_range = max(1, round(plan.rate * plan.window_ms / 1000 / plan.ranges))
    return load(None, job="spill", partitions=plan.partitions, streams=streams, join={"allowed_lateness_ms": 0},
                worker={"state_dir": str(path), "memory_bytes": max(1, budget), "changelog": False,
                        "spill": {"mode": "deferred", "victims": victims, "push_fraction": PUSH_FRACTION,
                                  "inactive_ms": int(plan.seconds * 1000 / 2)}},
                coordinator={"placement": "adaptive", "reorg_epoch_ms": plan.epoch_ms,
                             "memory_balance_theta": theta, "memory_balance_interval_ms": plan.interval_ms,
                             "disk_adaptation": disk_adaptation, "scale_cooldown_ms": 10**15},
                workload={"kind": "productivity", "rate": plan.rate, "tuple_range": tuple_range,
                          "join_ratios": list(ratios), "random_state": 3})


def make_inputs(job: JobSettings, plan: Plan) -> Inputs:
    """The run's tuples, drawn once per experiment so both runs see the same input."""
    batches, total = [], 0
    for b in range(int(plan.seconds * 1000 // plan.batch_ms)):
        t0, t1 = b * plan.batch_ms, (b + 1) * plan.batch_ms
        per_stream = []
        for i in range(len(STREAMS)):
            rng = np.random.default_rng([job.workload.random_state, i, b])
            cols = workloads.generate(job, i, rng, t0, t1, job.workload.rate)
            groups = partitions_for_keys(key_text([(cols["k"], "int")]), job.partitions).astype(np.int64)
            per_stream.append((groups, cols))
            total += len(groups)
        batches.append(per_stream)
    return Inputs(batches, total)


def flush_batch(job: JobSettings, t_ms: int) -> list[tuple[np.ndarray, dict[str, np.ndarray]]]:
    """Per group and stream one tuple at `t_ms`, far past every window: streams a and c share a key,
    b has another, so nothing joins, but every group's watermark passes every generation."""
    pools = workloads.group_keys(job.partitions, 2)
    groups = np.arange(job.partitions, dtype=np.int64)
    return [(groups, {"k": pools[:, i % 2].copy(), "ts": np.full(job.partitions, t_ms, np.int64)})
            for i in range(len(STREAMS))]


# ---------------------------------------------------------------- in-process workers


@dataclass
class Counters:
    runtime_results: int = 0
    cleanup_results: int = 0
    cleanup_seconds: float = 0.0
    cleanup_generations: int = 0
    pushes: int = 0
    pushed_bytes: int = 0
    cycle_seconds: float = 0.0
    peak_memory: int = 0


class SimWorker:
    def __init__(self, name: str, job: JobSettings, path: Path) -> None:
        self.name, self.job = name, job
        self.plan = join_plan(job)
        self.store = WindowedStore(Store(path), self.plan, stream_templates(job), job.worker.memory_bytes,
                                   spill=job.worker.spill)
        self.groups: set[int] = set()
        self.counters = Counters()
        self.epoch_results = 0
        self.epoch_pushed = False
        self.routings = [routing_for(job, job.partitions)] * len(job.streams)
        self.topics = [job.topic_of(s) for s in job.streams]

    def cycle(self, batch: list[tuple[np.ndarray, dict[str, np.ndarray]]], offsets: dict[tuple[int, int], int],
              now_ms: int) -> tuple[int, int]:
        """One batch of every group this worker holds: commit, statistics, the budget check.
        Returns (run-time results, clean-up results)."""
        began = time.perf_counter()
        mine = np.array(sorted(self.groups), np.int64)
        buffers = {i: RecordBuffer() for i in range(len(self.job.streams))}
        for i, (groups, cols) in enumerate(batch):
            take = np.isin(groups, mine)
            if not take.any():
                continue
            g_sel, k_sel, ts_sel = groups[take], cols["k"][take], cols["ts"][take]
            order = np.argsort(g_sel, kind="stable")
            g_sel, k_sel, ts_sel = g_sel[order], k_sel[order], ts_sel[order]
            bounds = np.flatnonzero(np.r_[True, g_sel[1:] != g_sel[:-1], True])
            for a, b in zip(bounds[:-1], bounds[1:]):
                group = int(g_sel[a])
                value = encode_block(Block({"k": k_sel[a:b], "ts": ts_sel[a:b]}))
                offset = offsets.get((i, group), 0)
                offsets[(i, group)] = offset + 1
                buffers[i].add(LocalRecord(self.topics[i], group, offset, str(int(k_sel[a])).encode(), value,
                                    int(ts_sel[b - 1])), group)
        runtime = cleaned = 0
        for b in run_cycle(self.job, self.plan, self.store, buffers, self.routings, now_ms):
            assert not b.dead, [d.reason for d in b.dead]
            tx = self.store.rocksdb.transaction()
            self.store.stage(tx, b.group, b.state, b.appended)
            tx.commit()
            self.store.observe(b.group, now_ms, sum(len(x) for x in b.appended), len(b.results))
            c = b.cleanup
            if c is not None:
                cleaned += c.results
                self.counters.cleanup_seconds += c.seconds
                self.counters.cleanup_generations += c.generations
            runtime += len(b.results) - (c.results if c is not None else 0)
        self.counters.peak_memory = max(self.counters.peak_memory, self.store.hot_size)
        self._pushed(self.store.keep_budget(now_ms))
        self.counters.runtime_results += runtime
        self.counters.cleanup_results += cleaned
        self.epoch_results += runtime + cleaned
        self.counters.cycle_seconds += time.perf_counter() - began
        return runtime, cleaned

    def _pushed(self, pushed: list[tuple[int, int]]) -> None:
        if pushed:
            self.counters.pushes += len(pushed)
            self.counters.pushed_bytes += sum(size for _, size in pushed)
            self.epoch_pushed = True

    def push(self, target: int, now_ms: int) -> None:
        self._pushed(self.store.push(target, now_ms))

    def observation(self) -> WorkerObservation:
        pending = frozenset(self.store.pending_generations()) & frozenset(self.groups)
        return WorkerObservation(
            worker=self.name, alive=True, role="active", group_bytes=self.store.group_bytes(self.groups),
            memory_bytes=self.store.hot_size, memory_budget=self.job.worker.memory_bytes,
            spilled_bytes=self.store.spilled_bytes(self.groups), spilled_groups=pending,
            group_results=self.store.group_results(self.groups),
            results=self.epoch_results, pushed=self.epoch_pushed)

    def close(self) -> None:
        self.store.rocksdb.close()


def move_group(group: int, sender: SimWorker, receiver: SimWorker) -> int:
    """Carry out a move in-process: the group's stored keys to the receiver, gone from the sender.
    Returns the bytes copied."""
    values = dict(sender.store.rocksdb.scan(group_prefix(group)))
    receiver.store.install(group, values, {}, 0)  # its statistics stay behind, as a real move's do
    tx = sender.store.rocksdb.transaction()
    for key in values:
        tx.delete(key)
    tx.commit()
    sender.store.forget(group)
    sender.groups.discard(group)
    receiver.groups.add(group)
    return sum(len(v) for v in values.values())


# ---------------------------------------------------------------- one run


@dataclass
class RunSpec:
    label: str
    ratios: tuple[float, ...]
    placement: dict[int, int]  # group -> worker index
    workers: int
    budget: int  # per worker
    victims: str = "productivity"
    policy: str | None = None  # None: no plan_epoch; else coordinator.disk_adaptation
    theta: float = THETA_PAPER  # coordinator.memory_balance_theta (theta_d)
    notes: list[str] = field(default_factory=list)


def simulate(plan: Plan, spec: RunSpec, inputs: Inputs, workdir: Path, progress: Progress) -> dict:
    root = Path(tempfile.mkdtemp(prefix=f"{spec.label}-", dir=workdir))
    job = make_job(plan, root, spec.ratios, spec.budget, spec.victims, spec.policy or "lazy-disk", spec.theta)
    workers = [SimWorker(f"w{i}", job, root / f"w{i}") for i in range(spec.workers)]
    for g, w in spec.placement.items():
        workers[w].groups.add(g)
    offsets: dict[tuple[int, int], int] = {}
    history = History(last_scale_ms=0)
    rng = random.Random(3)
    per_batch = int(plan.epoch_ms // plan.batch_ms)
    series_t, series_runtime, series_cleanup = [], [], []
    moves = push_orders = moved_bytes = 0
    memory_over_time: list[list[int]] = []
    task = progress.add_task(spec.label, total=len(inputs.batches) + 1)
    began = time.perf_counter()
    for n, batch in enumerate(inputs.batches):
        now = (n + 1) * plan.batch_ms
        runtime = cleaned = 0
        for w in workers:
            r, c = w.cycle(batch, offsets, now)
            runtime, cleaned = runtime + r, cleaned + c
        series_t.append(now / 1000)
        series_runtime.append(runtime)
        series_cleanup.append(cleaned)
        if (n + 1) % per_batch == 0:
            memory_over_time.append([w.store.hot_size for w in workers])
            if spec.policy is not None:
                decided = plan_epoch([w.observation() for w in workers], job.coordinator, now, history, rng,
                                     PUSH_FRACTION)
                history = replace(history.after(decided), in_flight=False)  # moves complete at once here
                by_name = {w.name: w for w in workers}
                for w in workers:
                    w.epoch_results, w.epoch_pushed = 0, False
                for m in decided.moves:
                    moved_bytes += move_group(m.group, by_name[m.source], by_name[m.target])
                    moves += 1
                if decided.push is not None:
                    by_name[decided.push.worker].push(decided.push.bytes, now)
                    push_orders += 1
            else:
                for w in workers:
                    w.epoch_results, w.epoch_pushed = 0, False
        progress.advance(task)
    run_seconds = time.perf_counter() - began
    # The flush: far past every window, so every generation is due and cleaned up.
    far = int(plan.seconds * 1000) + 10 * plan.window_ms
    flush = flush_batch(job, far)
    flush_runtime = flush_cleanup = 0
    flush_began = time.perf_counter()
    flush_before = [w.counters.cleanup_seconds for w in workers]
    for w in workers:
        r, c = w.cycle(flush, offsets, far)
        flush_runtime, flush_cleanup = flush_runtime + r, flush_cleanup + c
    flush_seconds = time.perf_counter() - flush_began
    progress.advance(task)
    pending = sum(sum(w.store.pending_generations().values()) for w in workers)
    per_worker = [{"worker": w.name, "groups": len(w.groups), "budget_bytes": job.worker.memory_bytes,
                   "peak_memory_bytes": w.counters.peak_memory, "runtime_results": w.counters.runtime_results,
                   "cleanup_results": w.counters.cleanup_results,
                   "cleanup_seconds": round(w.counters.cleanup_seconds, 4),
                   "final_cleanup_seconds": round(w.counters.cleanup_seconds - before, 4),
                   "cleanup_generations": w.counters.cleanup_generations, "pushes": w.counters.pushes,
                   "pushed_bytes": w.counters.pushed_bytes, "spilled_bytes_at_end": None,
                   "cycle_seconds": round(w.counters.cycle_seconds, 3)}
                  for w, before in zip(workers, flush_before)]
    runtime_total = sum(w.counters.runtime_results for w in workers)
    cleanup_total = sum(w.counters.cleanup_results for w in workers)
    for w in workers:
        w.close()
    shutil.rmtree(root, ignore_errors=True)
    cleanup_busiest = max(p["cleanup_seconds"] for p in per_worker)
    return {
        "label": spec.label,
        "policy": spec.policy or "none",
        "victims": spec.victims,
        "results": runtime_total + cleanup_total,
        "runtime_results": runtime_total,
        "cleanup_results": cleanup_total,
        "cleanup_results_at_flush": flush_cleanup,
        "cleanup_seconds": cleanup_busiest,
        "cleanup_seconds_sum": round(sum(p["cleanup_seconds"] for p in per_worker), 4),
        "cleanup_generations": sum(p["cleanup_generations"] for p in per_worker),
        "pushes": sum(p["pushes"] for p in per_worker),
        "pushed_bytes": sum(p["pushed_bytes"] for p in per_worker),
        "moves": moves,
        "moved_bytes": moved_bytes,
        "push_orders": push_orders,
        "pending_generations_after_flush": pending,
        "run_wall_seconds": round(run_seconds, 3),
        "flush_wall_seconds": round(flush_seconds, 3),
        "per_worker": per_worker,
        "memory_bytes_per_epoch": memory_over_time,
        "over_time": _buckets(series_t, series_runtime, series_cleanup, plan.bucket_s),
    }


def _buckets(t: list[float], runtime: list[int], cleanup: list[int], width: float) -> dict:
    """Results per simulated second, in buckets of `width` seconds (run time and clean-up)."""
    edges = np.arange(0, (max(t) if t else 0) + width, width)
    idx = np.clip(np.searchsorted(edges, np.asarray(t), side="left") - 1, 0, None)
    n = len(edges) - 1 if len(edges) > 1 else 1
    rt = np.bincount(idx, weights=runtime, minlength=n)[:n]
    cu = np.bincount(idx, weights=cleanup, minlength=n)[:n]
    return {"t_s": [round(float(e + width), 3) for e in edges[:n]],
            "runtime_results_per_s": [round(float(x) / width, 1) for x in rt],
            "cleanup_results_per_s": [round(float(x) / width, 1) for x in cu]}
