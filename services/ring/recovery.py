"""Ring crash recovery, the services' part: reading back what the round log, the epochs topic
and the results topic hold (engine/psp/recovery.py does the engine's part).

A checkpoint (schemas/ring_epochs.RingCheckpoint) is taken when no round is in flight: a Mark
travels the ring collecting every node's `_sseq` runs, and the head writes it with where the
round log and the results topic ended. After a rollback a node rebuilds its slices from the
rounds logged between `start` (the oldest place whose rounds hold a tuple some node still
keeps) and `at` (the checkpoint); the head re-drives the rounds logged after `at`; every node
skips the results already written since the checkpoint (deterministic ids).
"""

from __future__ import annotations

import numpy as np
import structlog
from confluent_kafka import Message

from streamjoin.engine.block import Block
from streamjoin.engine.psp.recovery import LoggedRound, Ranges, valid_rounds
from streamjoin.engine.result_ids import RESULT_ID_HI, RESULT_ID_LO, result_id_hex
from streamjoin.schemas import result_decode, result_format, ring as wire
from streamjoin.schemas.ring_epochs import LogMark, RingCheckpoint
from streamjoin.services import metrics
from streamjoin.services.io import kafka
from streamjoin.settings import JobSettings

log = structlog.get_logger("streamjoin.worker.ring")


def logged_rounds(job: JobSettings, cluster: kafka.Cluster, group: str, start: LogMark,
                  end_offset: int | None = None) -> list[LoggedRound]:
    """The rounds the ring ran from `start.next_round` on, as the round log holds them from
    `start.log_end` to `end_offset` (None: its end as of now)."""
    ends = None if end_offset is None else {0: end_offset}
    records = kafka.read_partitions(cluster, job.ring_log_topic, {0: start.log_end}, group, ends=ends)
    return valid_rounds((r for r in map(_logged, records) if r is not None), start.next_round)


def _logged(record: Message) -> LoggedRound | None:
    """A round log record, or None (counted and logged) for one no head wrote."""
    try:
        return wire.decode_logged(record.value(), record.headers())
    except wire.DECODE_ERRORS as e:
        metrics.DEAD_LETTER.labels("ring-log-unreadable").inc()
        log.error("unreadable round log record skipped", offset=record.offset(), error=repr(e))
        return None


def checkpointed_rounds(job: JobSettings, cluster: kafka.Cluster, group: str,
                        checkpoint: RingCheckpoint) -> list[LoggedRound]:
    """The logged rounds a node rebuilds its slices from: those from `checkpoint.start` up to the checkpoint."""
    rounds = logged_rounds(job, cluster, group, checkpoint.start, checkpoint.at.log_end)
    return [r for r in rounds if r.round < checkpoint.at.next_round]


def ranges_of(checkpoint: RingCheckpoint | None, node: str) -> Ranges | None:
    """`node`'s runs per stream in `checkpoint` (None: it held nothing)."""
    if checkpoint is None or node not in checkpoint.ranges:
        return None
    return tuple(tuple((int(lo), int(hi)) for lo, hi in runs) for runs in checkpoint.ranges[node])


def start_mark(history: list[LogMark], at: LogMark, ranges: dict[str, list]) -> tuple[LogMark, list[LogMark]]:
    """Where rebuilding must start reading the round log, and the history to keep.

    A place is early enough when every tuple any node keeps was numbered after it: for each
    stream, the least `_sseq` kept exceeds the place's count (tuples are numbered from count + 1).
    history: earlier checkpoints' places, oldest first; at: this checkpoint's; ranges: node ->
    per stream, its [lo, hi) runs. Returns (the latest early-enough place, history from it on)."""
    m = len(at.counts)
    least = [min((runs[j][0][0] for runs in ranges.values() if runs[j]), default=None) for j in range(m)]
    places = [LogMark(next_round=0, counts=[0] * m, log_end=0), *history, at]
    fits = [p for p in places if all(low is None or p.counts[j] < low for j, low in enumerate(least))]
    start = fits[-1]
    kept = [p for p in history if p.next_round >= start.next_round]
    return start, kept


def written_ids(job: JobSettings, cluster: kafka.Cluster, group: str, results_end: dict[int, int]) -> np.ndarray:
    """The ids (32 hex, NumPy 'S32', sorted) of the results written after `results_end` (results
    partition -> offset; a partition missing from it: from its start)."""
    starts = {p: results_end.get(p, 0) for p in range(job.partitions)}
    # Every node's results are written in transactions: to the high watermark, or a node's own
    # results committed after another node's open transaction would be missed (and made again).
    records = kafka.read_settled(cluster, job.results_topic, starts, group, log)
    if job.output.format != "blocks":  # ring results are keyed by their id
        return np.unique(np.array([m.key() or b"" for m in records], "S32"))
    decoded = result_decode.decode_results(result_format.result_layout(job), "blocks", [m.value() for m in records])
    if RESULT_ID_HI not in decoded.columns:
        return np.empty(0, "S32")
    return np.unique(result_id_hex(decoded.columns[RESULT_ID_HI], decoded.columns[RESULT_ID_LO]))


def unwritten(block: Block, written: np.ndarray) -> Block:
    """The rows of result `block` whose ids are not in `written` (sorted 'S32'). Only while a
    rollback's re-driven rounds run: the next checkpoint empties `written`."""
    if not len(written) or not len(block):
        return block
    fresh = ~np.isin(result_id_hex(block[RESULT_ID_HI], block[RESULT_ID_LO]), written, assume_unique=False)
    return block if fresh.all() else block.filter(fresh)
