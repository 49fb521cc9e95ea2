"""One hash-mode cycle, top to bottom (`Cycle.run`): the pending records joined
(processor.run_cycle), the outcome written in one Kafka transaction through the
cycle's writers (emit.py's `Emitter`, io/transactions.py), then RocksDB's copy
committed. The cycle is also the one place a committed batch's checkpoint learns
where its records landed (`record_positions`; recovery's replay goes through it too).

A cycle writes, in this order:
  1. dead letters and forwards (misrouted records on their way to their
     group's by-key partition, then the progress notes: progress.py), then flushes;
  2. one commit record per (group, batch) on `<job>.commits`, then flushes;
  3. the records to the slots of split hot keys (`<job>.split`: services/hash/split.py) and
     the batches' results, one record per result (or Arrow blocks), then
     flushes (the checkpoint records where they end);
  4. the groups' state writes on `<job>.changelog` (`worker.changelog`), each
     group's checkpoint last;
  5. the input offsets, and commits the transaction (with `exactly_once:
     false`: flushes, then commits the offsets).
The flushes make "visible" imply "durable before" even on a broker that
shows aborted transactions to read_committed readers (Tansu does): a visible
checkpoint in the changelog implies its batch's results, a visible result its
batch's commit record, which implies the batch's dead letters and forwards; a visible
record to a slot implies its batch's commit record, so the batch is decided, with the input
boundary a replay reaches again.
Recovery (recovery.py) relies on exactly that.

While the broker acknowledges (the flushes, the offsets and the commit: on
Tansu tens to hundreds of milliseconds a cycle), the caller's `meanwhile`
work runs instead of a blocked wait: the worker reads the next cycle's
records then (Worker._read_ahead).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import structlog
from confluent_kafka import Consumer, KafkaException, TopicPartition

from streamjoin.engine.window_join import JoinPlan
from streamjoin.schemas.control import HotSplit
from streamjoin.services import faults, metrics
from streamjoin.services.hash.emit import Emitter, stall_watchdog
from streamjoin.services.hash.processor import GroupBatch, run_cycle
from streamjoin.services.io.deliveries import Meanwhile
from streamjoin.services.io.intake import RecordBuffer, Routing
from streamjoin.services.io.transactions import exit_if_fenced
from streamjoin.settings import JobSettings
from streamjoin.state.windowed import GroupState, WindowedStore

log = structlog.get_logger("streamjoin.worker")


@dataclass(frozen=True)
class Outcome:
    """What a cycle did: its `batches`, the input `offsets` they end at, and whether their
    transaction `committed` (False: it failed and their groups were recovered)."""

    batches: list[GroupBatch]
    offsets: list[TopicPartition]
    committed: bool


class Cycle:
    """The hash worker's cycle over its `store` (see the module docstring): `consumer` is the
    worker's input consumer (its group metadata goes into the transaction), `out` the
    cycle's writers."""

    def __init__(self, job: JobSettings, plan: JoinPlan, store: WindowedStore, consumer: Consumer,
                 out: Emitter) -> None:
        self.job, self.plan, self.store, self.consumer, self.out = job, plan, store, consumer, out

    def run(self, pending: dict[int, RecordBuffer], routings: Sequence[Routing], now_ms: int,
            idle: Mapping[int, frozenset[int]], woken: Sequence[int], floors: Mapping[int, int],
            skip_dead: dict[int, set[tuple[str, int, int]]], *, aligned: Callable[[], None],
            recover: Callable[[set[int]], None], meanwhile: Meanwhile | None,
            splits: Mapping[int, Sequence[HotSplit]] | None = None) -> Outcome:
        """Join `pending` (per stream; `idle`, `woken`, `floors` and `splits` as for run_cycle) and
        commit the outcome; dead letters named in `skip_dead[group]` were written by an attempt that died.

        `aligned()` is called once the windows are joined, before anything is written: the
        worker's intake pauses follow the windows as this cycle left them in memory, before
        the records read ahead during its commit are taken (deciding after the commit would
        let every read-ahead overshoot by a batch). `meanwhile()` is done while the broker
        acknowledges (None: the waits block). On a failed transaction `recover(groups)`
        rebuilds the cycle's groups from Kafka."""
        batches = run_cycle(self.job, self.plan, self.store, pending, routings, now_ms, idle, woken, floors,
                            splits=splits)
        aligned()
        offsets = next_offsets(batches)
        out, tx = self.out, self.store.rocksdb.transaction()
        try:
            out.deliveries.clear()
            with stall_watchdog(self.job.worker.stall_timeout_ms / 1000):
                out.begin()
                if out.produce_dead_letters(batches, skip_dead) + out.produce_forwards(batches):
                    out.flush(meanwhile)
                for b in batches:
                    out.produce_commit(b)
                out.flush(meanwhile)
                out.produce_splits(batches)
                out.results.write_groups([(b.group, b.results) for b in batches])
                out.flush(meanwhile)
                if any(b.cleanup is not None or b.read_back for b in batches):
                    faults.reach("spill-written")  # results from spilled state written, not committed
                for b in batches:
                    record_positions(b.state, out.positions(b.group))
                    self.store.stage(tx, b.group, b.state, b.appended, b.marks)
                out.log_state(tx.prepare())
                out.commit(self.consumer, offsets, meanwhile)
            out.logged(batches)
        except KafkaException as e:
            exit_if_fenced(e)
            log.warning("cycle failed; recovering its groups", error=str(e), groups=len(batches))
            metrics.BROKER_ERRORS.labels("cycle").inc()
            tx.fail()
            out.abort()
            recover({b.group for b in batches})
            return Outcome(batches, offsets, committed=False)
        tx.commit()  # the Kafka transaction (results, changelog, offsets) committed: now the local copy
        return Outcome(batches, offsets, committed=True)


def record_positions(state: GroupState, positions: dict[str, int]) -> None:
    """Where in the group's results, commits and dead-letter partitions the next batch begins
    (`results_next`, `commits_next`, `dead_letter_next`; those given), into its checkpoint
    before it is staged: recovery reads the group's records from there."""
    state.checkpoint = state.checkpoint.model_copy(update=positions)


def next_offsets(batches: list[GroupBatch]) -> list[TopicPartition]:
    """The input offsets a cycle's `batches` end at, to commit with them."""
    return [TopicPartition(topic, p, o) for b in batches for topic, parts in b.end.items() for p, o in parts.items()]
