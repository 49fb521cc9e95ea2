"""Live input for benchmarks that act on a running fleet: a background thread
writes a job's generated workload (services/workloads.py) into its input
topics at a rate that may change over time, event time about wall time.

It works a tick at a time: each tick draws the tuples that arrived since the
last one (a Poisson process), encodes them as JSON records with NumPy string
operations and hands them to librdkafka in one `produce_batch` per stream;
nothing runs per tuple in Python but building that batch's list.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

import numpy as np
from confluent_kafka import Producer

from streamjoin.schemas.join_keys import key_text
from streamjoin.services.io import kafka
from streamjoin.services.workloads import generate, json_values
from streamjoin.settings import JobSettings

TICK_S = 0.1  # a batch of input every 100 ms: event time stays within a tick of wall time

# Seconds since the measured span began (negative before `PacedInput.begin_span`) -> tuples/s per stream.
RateSchedule = Callable[[float], float]


class PacedInput(threading.Thread):
    """Writes `job`'s workload into its input topics until `stop()`, at `rate(t)` tuples/s per
    stream (t: seconds since `begin_span()`, -1 before it: a warm-up). `ticks` keeps (wall ms,
    tuples written) per tick, for the rate actually written; `tuples` is the total."""

    def __init__(self, job: JobSettings, bootstrap: str, rate: RateSchedule, seed: int = 0) -> None:
        super().__init__(daemon=True, name=f"paced-input-{job.job}")
        self.job, self.bootstrap, self.rate, self.seed = job, bootstrap, rate, seed
        self.ticks: list[tuple[int, int]] = []
        self.tuples = 0
        self.error: BaseException | None = None
        self._stop_flag = threading.Event()
        self._span_began: float | None = None

    def begin_span(self) -> None:
        """The measured span begins now: the schedule's time 0."""
        self._span_began = time.time()

    def stop(self) -> None:
        """Stop writing and wait until every record written is acknowledged; re-raises a failure."""
        self._stop_flag.set()
        self.join(60)
        if self.error is not None:
            raise RuntimeError(f"paced input of {self.job.job} failed") from self.error

    def run(self) -> None:
        try:
            self._write()
        except BaseException as e:  # kept for stop(): a thread's exception is otherwise lost
            self.error = e

    def _write(self) -> None:
        producer = kafka.Cluster(self.bootstrap).producer()
        rngs = [np.random.default_rng([self.seed, i]) for i in range(len(self.job.streams))]
        last_ms = int(time.time() * 1000)
        while not self._stop_flag.wait(TICK_S):
            now_ms = int(time.time() * 1000)
            began = self._span_began
            rate = self.rate(-1.0 if began is None else now_ms / 1000 - began)
            written = sum(self._tick(producer, i, rngs[i], last_ms, now_ms, rate) for i in range(len(rngs)))
            producer.poll(0)
            self.ticks.append((now_ms, written))
            self.tuples += written
            last_ms = now_ms
        if producer.flush(60):
            raise RuntimeError("the broker did not acknowledge the paced input within 60 s")

    def _tick(self, producer: Producer, stream: int, rng: np.random.Generator, t0_ms: int, t1_ms: int,
              rate: float) -> int:
        """Stream `stream`'s tuples that arrived in [t0_ms, t1_ms), written; how many."""
        if rate <= 0 or t1_ms <= t0_ms:
            return 0
        spec = self.job.streams[stream]
        cols = generate(self.job, stream, rng, t0_ms, t1_ms, rate)
        values = json_values(spec, cols).tolist()
        keys = key_text([(cols[k], spec.fields[k]) for k in spec.key_fields]).to_pylist()
        producer.produce_batch(self.job.topic_of(spec), [{"key": k, "value": v} for k, v in zip(keys, values)])
        return len(values)

    def written_per_second(self, since_ms: int) -> tuple[np.ndarray, np.ndarray]:
        """(seconds since `since_ms`, tuples/s per stream written in that second), one row per second."""
        if not self.ticks:
            return np.zeros(0), np.zeros(0)
        at = (np.array([t for t, _ in self.ticks]) - since_ms) / 1000
        counts = np.array([n for _, n in self.ticks], np.float64)
        edges = np.arange(0, np.ceil(at.max()) + 1)
        per_second, _ = np.histogram(at, edges, weights=counts)
        return edges[:-1], per_second / len(self.job.streams)
