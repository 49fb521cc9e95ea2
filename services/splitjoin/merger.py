"""The SplitJoin merger: every core's results, in input order,
exactly once, on partition 0 of the job's results topic.

Partition i of `<job>.splitjoin.out` holds core i's releases (schemas/splitjoin.py), for
i below splitjoin.max_cores. engine/splitjoin/merge.OrderedMerge puts them in input
order by the cores' punctuations (unordered with punctuate_every 0); each batch of
released results goes out in one Kafka transaction with the merger's checkpoint on
`<job>.merger`: results first and flushed, so a visible checkpoint implies its results.
When the release watermark moves, the transaction also carries a release record on the
commits topic, as the ring head writes (schemas/results.RoundRelease, node "merger",
round = the input sequence below which the output is complete): every core release
says (CoreMeta.watermark) that every input below its watermark has a sequence below its
`through`, and every core numbers the same input, so once the output is complete below
a release's `through`, every result of the inputs below its watermark is written.

The reading of the cores' partitions and the checkpoint's fields: merger_intake.py.

Restart: a new producer with the same transactional.id fences the previous
incarnation (aborting its open transaction) before anything is read. The newest
checkpoint is restored; each core partition is read again from its `low` with
`accepted_through` as it was there, so the same results are accepted as before;
releases that end below the checkpoint's next offset were counted in its marks
already, and their results probing below `released_below` are out already, so both
are left out; nothing is released until every partition is read back that far. A broker that shows aborted transactions may also hold results of the
attempt that died after its checkpoint: the results partition from the checkpoint's
end on is read back, and a result whose id is there is not written again (on Apache
Kafka that tail is empty)."""

from __future__ import annotations

import time

import numpy as np
import structlog
from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition
from pydantic import ValidationError

from streamjoin.engine.block import Block
from streamjoin.engine.result_ids import PRODUCED_MS, RESULT_ID_HI, RESULT_ID_LO
from streamjoin.engine.splitjoin.core import sequence_columns
from streamjoin.engine.splitjoin.merge import OrderedMerge
from streamjoin.engine.splitjoin.schedule import Schedule
from streamjoin.schemas import control
from streamjoin.schemas.result_decode import decode_results
from streamjoin.schemas.result_format import result_layout
from streamjoin.schemas.results import RoundRelease
from streamjoin.services import collector, faults, metrics
from streamjoin.services.io import kafka
from streamjoin.services.io.deliveries import Deliveries, count_failed_control_delivery
from streamjoin.services.io.results import ResultSink, ResultWriter
from streamjoin.services.io.templates import ring_plan
from streamjoin.services.io.transactions import RESTART_EXIT, Transactions
from streamjoin.services.shutdown import StopFlag, started
from streamjoin.services.splitjoin.merger_intake import Intake, MergerCheckpoint, id_keys, result_dtypes
from streamjoin.settings import JobSettings
from streamjoin.topology import topics

log = structlog.get_logger("streamjoin.splitjoin.merger")

MERGER = "merger"  # the process name: crash steps, heartbeats, the transactional id's suffix
CHECKPOINT_KEY = MERGER.encode()  # the merger topic is compacted: the newest checkpoint is what stays
WRITTEN_STEP = "merger-written"  # faults: results flushed, checkpoint not produced yet
_CHECKPOINT_SPAN = 16  # merger-topic records read back at first when looking for the newest checkpoint
_POLL_RECORDS, _POLL_S = 10_000, 0.02


# ---------------------------------------------------------------------- service


class Merger:
    """The service around an Intake: Kafka in and out, transactions, restart, metrics, heartbeats."""

    def __init__(self, job: JobSettings, cluster: kafka.Cluster, metrics_port: int | None = None) -> None:
        self.job, self.cluster = job, cluster
        self.metrics_port = job.worker.metrics_port if metrics_port is None else metrics_port
        self.columns = sequence_columns(ring_plan(job))
        merge = OrderedMerge(Schedule.fixed(job.splitjoin.cores), self.columns,
                             ordered=job.splitjoin.punctuate_every > 0)
        self.intake = Intake(merge, job.splitjoin.max_cores, result_dtypes(job))
        self.producer = cluster.producer(f"{job.job}-{MERGER}")
        self.transactions = Transactions(self.producer, job.transactions, process=MERGER)
        self.control_out = cluster.producer()
        self.consumer = cluster.consumer(f"{job.consumer_group}-{MERGER}")
        self.deliveries = Deliveries()
        self.results = ResultWriter(ResultSink.of_job(job), self.producer, self.deliveries, every_report=False)
        self.results_end = 0
        self.published: int | None = None  # the release watermark last written to the commits topic
        self.rewritten = id_keys(np.empty(0), np.empty(0))  # ids an aborted attempt wrote after the checkpoint
        self.health = metrics.HealthState()
        self.stop_flag = StopFlag()
        self.metrics_url = ""

    def run(self) -> None:
        """Serve until SIGTERM/SIGINT, then stop cleanly (between two transactions)."""
        self.stop_flag.install()
        self.metrics_url = metrics.serve_url(self.metrics_port, self.health)
        if not started(self.stop_flag, self._start_up, log, "merger stopped before it started"):
            return
        self.health.ready, self.health.detail = True, "running"
        log.info("merger started", metrics=self.metrics_url, cores=self.job.splitjoin.max_cores,
                 ordered=self.intake.merge.ordered)
        try:
            self._loop()
        except KafkaException as e:  # fenced by a newer merger, or the broker failed a transaction
            log.error("merger transaction failed; exiting for a restart from the checkpoint", error=str(e))
            raise SystemExit(RESTART_EXIT) from e  # restarted, it restores its checkpoint
        self.consumer.close()
        self.control_out.flush(10)
        log.info("merger stopped", released=self.intake.merge.released_below)

    def _start_up(self) -> None:
        kafka.wait_for_broker(self.cluster, log)
        topics.ensure(self.cluster.admin(), self.job)
        self.transactions.init()
        self._restore()

    def stop(self) -> None:
        self.stop_flag.request()

    def _loop(self) -> None:
        last_beat = 0.0
        while not self.stop_flag.set:
            taken = 0
            for m in self.consumer.consume(_POLL_RECORDS, _POLL_S):
                taken += self._take(m)
            block = self.intake.release()
            if taken or len(block):
                self._commit(block)
            if time.monotonic() - last_beat >= self.job.worker.heartbeat_ms / 1000:
                self._heartbeat()
                last_beat = time.monotonic()

    def _take(self, m: Message) -> int:
        err = m.error()
        if err is not None:
            if err.code() != KafkaError._PARTITION_EOF:
                metrics.BROKER_ERRORS.labels(err.name()).inc()
            return 0
        self.intake.take(m.partition(), m.offset(), m.value(), m.headers())
        return 1

    # ---------------------------------------------------------------- writing
    def _commit(self, block: Block) -> None:
        """One transaction: the released results (flushed), then a release record when the
        release watermark moved (as the ring head's: verify and the harnesses read it), then the
        checkpoint."""
        block = self._not_rewritten(block)
        self.deliveries.clear()
        self.transactions.begin()
        if len(block):
            written = Block({k: v for k, v in block.columns.items() if k not in self.columns})
            self.results.write(written, group=0)
            self.transactions.flush(self.deliveries)
            self.results_end = self.deliveries.newest[(self.job.results_topic, 0)] + 1
            metrics.SPLITJOIN_MERGER_RESULTS.inc(len(block))
            metrics.SPLITJOIN_MERGER_LATENCY.observe_many((time.time() * 1000 - block[PRODUCED_MS]) / 1000.0)
        faults.reach(WRITTEN_STEP)
        watermark = self.intake.release_watermark
        if watermark is not None and (self.published is None or watermark > self.published):
            release = RoundRelease(node=MERGER, round=self.intake.written_below(), watermark=watermark)
            self.producer.produce(self.job.commits_topic, value=release.model_dump_json().encode(),
                                  key=MERGER.encode(), partition=0, on_delivery=self.deliveries.report)
        ckpt = self.intake.checkpoint(self.results_end)
        self.producer.produce(self.job.merger_topic, key=CHECKPOINT_KEY, value=ckpt.model_dump_json().encode(),
                              partition=0, on_delivery=self.deliveries.report)
        self.transactions.commit()
        self.deliveries.check()
        self.published = watermark
        self._gauges()

    def _not_rewritten(self, block: Block) -> Block:
        """`block` less the results an aborted attempt of the merger wrote already (visible on Tansu)."""
        if not len(self.rewritten) or not len(block):
            return block
        ids = id_keys(block[RESULT_ID_HI], block[RESULT_ID_LO])
        seen = np.isin(ids, self.rewritten)
        self.rewritten = self.rewritten[~np.isin(self.rewritten, ids[seen])]
        metrics.SPLITJOIN_MERGER_DROPPED.labels("rewritten").inc(int(seen.sum()))
        return block.filter(~seen)

    def _gauges(self) -> None:
        merge = self.intake.merge
        metrics.SPLITJOIN_MERGER_HELD.set(merge.held)
        metrics.SPLITJOIN_MERGER_FRONTIER.set(self.intake.written_below())
        holding = set(self.intake.holding())
        for core in range(self.job.splitjoin.max_cores):
            metrics.SPLITJOIN_MERGER_HOLDING.labels(str(core)).set(int(core in holding))

    def _heartbeat(self) -> None:
        merge = self.intake.merge
        beat = control.Heartbeat(worker=MERGER, wall_ms=int(time.time() * 1000), lag=merge.held,
                                 state_tuples=merge.held, metrics_url=self.metrics_url)
        self.control_out.produce(self.job.control_topic, value=control.encode(beat), key=MERGER.encode(), partition=0,
                                 on_delivery=count_failed_control_delivery)
        self.control_out.poll(0)

    # ---------------------------------------------------------------- restart
    def _restore(self) -> None:
        """Continue from the newest checkpoint (if any), then assign every core partition at its `low`."""
        ckpt = self._newest_checkpoint()
        if ckpt is not None:
            self.intake.restore(ckpt)
            self.results_end, self.published = ckpt.results_end, ckpt.release_watermark
            metrics.SPLITJOIN_MERGER_RESTORES.inc()
        self.rewritten = self._results_after(self.results_end)
        lanes = self.intake.lanes
        self.consumer.assign([TopicPartition(self.job.core_output_topic, p, lane.next) for p, lane in enumerate(lanes)])
        log.info("merger restored" if ckpt is not None else "merger starts from the beginning",
                 released_below=self.intake.merge.released_below, results_end=self.results_end,
                 rewritten=len(self.rewritten), low=[lane.next for lane in lanes])
        self._gauges()

    def _newest_checkpoint(self) -> MergerCheckpoint | None:
        """The last readable checkpoint on the merger topic, reading back from its end."""
        topic, group = self.job.merger_topic, f"{self.job.consumer_group}-{MERGER}-restore"
        end = kafka.end_offsets(self.cluster, [(topic, 0)], group)[(topic, 0)]
        span = _CHECKPOINT_SPAN
        while True:
            start = max(0, end - span)
            for m in reversed(kafka.read_partitions(self.cluster, topic, {0: start}, group, ends={0: end})):
                ckpt = _decoded_checkpoint(m)
                if ckpt is not None:
                    return ckpt
            if start == 0:
                return None
            span *= 4

    def _results_after(self, start: int) -> np.ndarray:
        """The ids of the results on partition 0 of the results topic from `start` to its end."""
        records = kafka.read_partitions(self.cluster, self.job.results_topic, {0: start},
                                        f"{self.job.consumer_group}-{MERGER}-tail")
        if not records:
            return id_keys(np.empty(0), np.empty(0))
        decoded = decode_results(result_layout(self.job), self.job.output.format, [m.value() for m in records])
        if decoded.rejects:
            log.warning("unreadable records on the results topic after the merger's checkpoint",
                        count=len(decoded.rejects), first=decoded.rejects[0].reason)
        return id_keys(decoded.columns[RESULT_ID_HI], decoded.columns[RESULT_ID_LO])


def _decoded_checkpoint(m: Message) -> MergerCheckpoint | None:
    try:
        return MergerCheckpoint.model_validate_json(m.value() or b"")
    except ValidationError as e:
        log.warning("unreadable merger checkpoint skipped", offset=m.offset(), reason=e.errors()[0]["msg"])
        return None


def run_merger(job: JobSettings, cluster: kafka.Cluster, metrics_port: int | None) -> None:
    """The `streamjoin merger` service: merge the job's core outputs until SIGTERM/SIGINT.

    job: a splitjoin job; cluster: its Kafka cluster; metrics_port: where /metrics and
    /healthz are served (None: worker.metrics_port, 0: any free port)."""
    faults.install(job, MERGER)
    collector.settle()
    Merger(job, cluster, metrics_port).run()
