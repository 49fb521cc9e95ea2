"""The one writer of results, for every mode: a result block as a sink's records (a job's
results topic in the job's `output.format`; a continuous query's sink), produced in bulk with
delivery reports into a `Deliveries` (deliveries.py). Hash groups, ring nodes, the SplitJoin
merger and the query router all write through it."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from confluent_kafka import KafkaError, KafkaException, Producer

from streamjoin.engine.block import Block, concat
from streamjoin.engine.outer import NEWEST_ARRIVAL
from streamjoin.schemas import result_encode, result_format
from streamjoin.schemas.columns import to_bytes_list
from streamjoin.services import metrics
from streamjoin.services.io.deliveries import Deliveries
from streamjoin.settings import JobSettings
from streamjoin.topology.partitioner import partitions_for_keys

# Messages per produce_batch call: bounded, so a full local queue costs one short wait.
_BATCH_MESSAGES = 10_000
# Results under which a group's block is encoded together with the cycle's other small ones: an
# encode costs about half a millisecond a call whatever its size, but joining large blocks first
# costs a copy of every result (measured: 10% more CPU per tuple on a backlog drain).
SMALL_RESULTS = 4096


@dataclass(frozen=True)
class ResultSink:
    """Where a ResultWriter writes and what its records look like: `topic` with `partitions`
    partitions, records of `layout` in `format` (json, avro or blocks)."""

    topic: str
    partitions: int
    layout: result_format.ResultLayout
    format: str

    @classmethod
    def of_job(cls, job: JobSettings) -> ResultSink:
        """A job's results topic, in the job's `output.format`."""
        return cls(job.results_topic, job.group_count, result_format.result_layout(job), job.output.format)


class ResultWriter:
    """The one writer of results: a result block as `sink`'s records, produced in bulk (a
    job's results topic; the query service's sinks).

    `every_report`: ask for a delivery report of every record (needed without
    transactions, where a report is the only sign of a failed delivery); otherwise only
    each partition's last record of a call reports (its offset), and a failed delivery
    fails the transaction's commit."""

    def __init__(self, sink: ResultSink, producer: Producer, deliveries: Deliveries, every_report: bool) -> None:
        self.sink, self.producer, self.deliveries, self.every_report = sink, producer, deliveries, every_report
        self.layout, self.format = sink.layout, sink.format

    def write(self, block: Block, group: int | np.ndarray | None = None, blocks_key: bytes = b"") -> int:
        """Produce `block`'s results; hash mode passes its `group` (= the results partition of
        every key in it), the query router one partition per result, ring mode lets each key
        pick its partition. `blocks_key` keys the records of `output.format: blocks`. Returns
        the number of records produced."""
        if self.format == "blocks":
            values = result_encode.encode_blocks(block)
            return self._write(block, values, [blocks_key] * len(values), group)
        return self._write(block, *self._records(block), group)

    def write_groups(self, blocks: list[tuple[int, Block]]) -> int:
        """Produce each group's results to the group's partition (hash mode). The JSON or Avro
        records of the groups with few results (under SMALL_RESULTS) are encoded together, so a
        cycle of many lightly loaded groups pays an encode's fixed cost once, not per group.
        Returns the number of records produced.

        blocks: (group, its result block) per group of the cycle."""
        filled = [(group, block) for group, block in blocks if len(block)]
        small = [(group, block) for group, block in filled if len(block) < SMALL_RESULTS]
        if self.format == "blocks" or len(small) < 2:  # a blocks record holds one group's results
            small = []
        together = {group for group, _ in small}  # a cycle holds each group once
        written = sum(self.write(block, group=group) for group, block in filled if group not in together)
        if not small:
            return written
        block = concat([b for _, b in small])
        partitions = np.repeat(np.array([g for g, _ in small], np.int32), [len(b) for _, b in small])
        return written + self._write(block, *self._records(block), partitions)

    def _records(self, block: Block) -> tuple[list[bytes], pa.Array]:
        """The JSON or Avro values of `block`'s results and their keys."""
        encode = result_encode.encode_json if self.format == "json" else result_encode.encode_avro
        return encode(self.layout, block), result_encode.result_keys(self.layout, block)

    def _write(self, block: Block, values: list[bytes], keys: pa.Array | list[bytes],
               partitions: np.ndarray | int | None) -> int:
        """Produce `values` keyed by `keys` to `partitions` (one per record, one for all, or None:
        each key's own), and meter `block`, the results they hold."""
        if partitions is None:
            partitions = partitions_for_keys(keys, self.sink.partitions)
        elif isinstance(partitions, int):
            partitions = np.full(len(values), partitions, np.int32)
        if isinstance(keys, pa.Array):
            keys = to_bytes_list(keys)
        self._produce(keys, values, partitions)
        if len(block):
            metrics.RESULTS_OUT.inc(len(block))
        if len(block) and NEWEST_ARRIVAL in block.columns:  # the router's come from records, without it
            metrics.DELAY_SECONDS.observe_many((block["produced_ms"] - block[NEWEST_ARRIVAL]) / 1000.0)
        return len(values)

    def _produce(self, keys: list[bytes], values: list[bytes], partitions: np.ndarray) -> None:
        topic = self.sink.topic
        order = np.argsort(partitions, kind="stable")
        cuts = np.flatnonzero(np.diff(partitions[order])) + 1
        for rows in np.split(order, cuts):
            if not len(rows):
                continue
            messages = [{"key": keys[i], "value": values[i]} for i in rows.tolist()]
            if self.every_report:
                for m in messages:
                    m["callback"] = self.deliveries.report
            else:
                messages[-1]["callback"] = self.deliveries.report
            for lo in range(0, len(messages), _BATCH_MESSAGES):
                self._enqueue(topic, int(partitions[rows[0]]), messages[lo:lo + _BATCH_MESSAGES])

    def _enqueue(self, topic: str, partition: int, messages: list[dict]) -> None:
        """produce_batch, waiting for room while librdkafka's queue is full. A full queue fails a
        suffix of the batch (measured), so retrying that suffix keeps the records in order."""
        while messages:
            queued = self.producer.produce_batch(topic, messages, partition=partition)
            failed = messages[queued:]
            if any("_error" in m and m["_error"].code() != KafkaError._QUEUE_FULL for m in failed):
                raise KafkaException(next(m["_error"] for m in failed if "_error" in m))
            for m in failed:
                m.pop("_error", None)
            messages = failed
            if messages:
                self.producer.poll(0.05)
