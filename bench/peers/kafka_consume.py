"""The physical limit: one tuned confluent-kafka consumer reading the input
topics from the start to their end, doing nothing with the records but count
them and their bytes. What the broker can deliver to one Python process is
the ceiling any consumer of these topics, our workers included, lives under.
The same consumer reading while Spark `sources` writes gives the floor of
production delay at that rate: the writer's path to the broker plus the fetch.
"""

from __future__ import annotations

import statistics
import threading
import time
import uuid

import numpy as np
from confluent_kafka import Message, TopicPartition

from streamjoin.services.io import kafka
from streamjoin.bench.report import delay_stats
from streamjoin.settings import JobSettings
from streamjoin.topology import topics


def consume_once(cluster: kafka.Cluster, partitions: list[tuple[str, int]]) -> dict:
    """Read every partition to its true end once; tuples, bytes and rates."""
    ends = kafka.end_offsets(cluster, partitions, f"bench-consume-probe-{uuid.uuid4().hex}")
    total = sum(ends.values())
    c = cluster.consumer(f"bench-consume-{uuid.uuid4().hex}")
    try:
        c.assign([TopicPartition(t, p, 0) for t, p in partitions])
        tuples = size = 0
        began = time.perf_counter()
        while tuples < total:
            msgs = [m for m in c.consume(50_000, 0.1) if m.error() is None]
            tuples += len(msgs)
            size += sum(map(len, map(Message.value, msgs))) + sum(map(len, filter(None, map(Message.key, msgs))))
        seconds = time.perf_counter() - began
    finally:
        c.close()
    return {"tuples": tuples, "bytes": size, "seconds": round(seconds, 3),
            "tuples_per_s": tuples / seconds, "bytes_per_s": size / seconds}


def run_kafka_consume(cluster: kafka.Cluster, topics: list[str], partitions: int, repeats: int) -> dict:
    """`repeats` full reads; the figures are their medians (the machine is noisy)."""
    tps = [(t, p) for t in topics for p in range(partitions)]
    runs = [consume_once(cluster, tps) for _ in range(repeats)]
    return {
        "tuples_per_s": statistics.median(r["tuples_per_s"] for r in runs),
        "bytes_per_s": statistics.median(r["bytes_per_s"] for r in runs),
        "tuples": runs[0]["tuples"], "bytes": runs[0]["bytes"],
        "runs": runs,
        "how": f"one confluent-kafka consumer (services/io/kafka.py settings), manual assignment of {len(tps)} "
               f"partitions, consume(50000) until every partition's true end; median of {repeats}",
    }


def delivery_delay(cluster: kafka.Cluster, job: JobSettings, rate: float, seconds: float, threshold_ms: float) -> dict:
    """The delay before any join: Spark `sources` writes `seconds` at `rate` into a fresh copy
    of the job's input topics while one tuned consumer (nothing else running) reads them; a
    record's delay is when the consumer holds it minus its Kafka timestamp, the clock our
    production delay starts from. It covers the writer's path to the broker and the fetch."""
    from streamjoin.services.spark.sources import run_sources

    probe = job.model_copy(update={"job": f"{job.job}-delivery"})
    topics.ensure(cluster.admin(), probe)
    held: list[np.ndarray] = []
    stop = threading.Event()
    reader = threading.Thread(target=hold_delays, args=(cluster, probe, held, stop), daemon=True)
    reader.start()
    try:
        produced = run_sources(probe, cluster, seconds=seconds, rate=rate)
        want = sum(produced["records"].values())
        deadline = time.monotonic() + 60
        while sum(map(len, held)) < want and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        stop.set()
        reader.join()
    delays = np.concatenate(held) if held else np.empty(0)
    return {"rate_per_stream": float(np.mean(list(produced["rate"].values()))), "records": int(len(delays)),
            "delay": delay_stats(delays, threshold_ms)}


def hold_delays(cluster: kafka.Cluster, job: JobSettings, out: list[np.ndarray], stop: threading.Event) -> None:
    """Read `job`'s input topics from the start until `stop`, appending each consume() call's
    delivery delays (now minus each record's Kafka timestamp, ms) to `out`."""
    c = cluster.consumer(f"bench-delivery-{uuid.uuid4().hex}")
    try:
        c.assign([TopicPartition(t, p, 0) for t in job.input_topics for p in range(job.partitions)])
        while not stop.is_set():
            msgs = [m for m in c.consume(50_000, 0.02) if m.error() is None]
            now = time.time() * 1000
            if msgs:
                out.append(now - np.array([m.timestamp()[1] for m in msgs], np.float64))
    finally:
        c.close()
