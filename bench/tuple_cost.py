"""Where a tuple's microseconds go in a hash worker: the worker's own per-batch
path on real confluent-kafka Message objects, without a broker, so that the
figures are the worker's alone (fetching and the broker's write path are
measured end to end by `bench equijoin --scale`).

The equijoin workload (64-byte JSON, b-model keys) is generated for
both streams, partitioned by Kafka's murmur2, made into Messages in arrival
order and fed in batches to:
  intake   `Worker._take` (consume()'s list to the stream buffers),
  decode   `decode_by_group` (screening, Arrow's JSON reader, routing check),
  join     `process_batch` (probe, window upkeep, expiry, result ids),
  state    staging every group's blocks and checkpoint and the RocksDB commit,
  encode   `ResultWriter.write_groups`: the results as the job's JSON records, keys and
           produce_batch messages, handed to a producer that drops them.
Only batches after the first window-and-a-bit count (windows full and
expiring). Output: microseconds per input tuple per phase, their total and
the tuples/s it comes to; `--plot` draws them beside a saved earlier run.

    python -m streamjoin.bench.tuple_cost [--rate 5000] [--seconds 90] [--json out.json]
        [--plot out.png --before earlier.json]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
from confluent_kafka import Message

from streamjoin.schemas.join_keys import key_text
from streamjoin.services import workloads
from streamjoin.services.hash import processor
from streamjoin.services.io.intake import routing_for
from streamjoin.services.hash.main import Worker, input_topics
from streamjoin.services.io.templates import stream_templates
from streamjoin.services.io.deliveries import Deliveries
from streamjoin.services.io.results import ResultSink, ResultWriter
from streamjoin.settings import JobSettings, load
from streamjoin.state.store import Store
from streamjoin.state.windowed import WindowedStore
from streamjoin.topology.partitioner import partitions_for_keys

PHASES = ("intake", "decode", "join", "state", "encode")
CONSUME_CALL = 10_000  # records per consume() call handed to intake


def job_for(window_ms: int, partitions: int, rate: float, seconds: int) -> JobSettings:
    """equijoin.yaml with the given window and partitions, its key domain sized for the run."""
    from streamjoin.bench.equijoin import with_window
    from streamjoin.bench.ours import Step
    from streamjoin.job_files import default_job_file

    job = with_window(load(default_job_file()), window_ms, [Step(rate, seconds)])
    return job.model_copy(update={"partitions": partitions})


def messages(job: JobSettings, rate: float, seconds: int, seed: int = 7) -> list[Message]:
    """Both streams' records as a consumer would hand them over, in arrival order: values as
    the sources write them, keys and partitions as Kafka's default partitioner puts them."""
    stamped: list[tuple[np.ndarray, list[Message]]] = []
    for i, spec in enumerate(job.streams):
        columns = workloads.generate(job, i, np.random.default_rng([seed, i]), 0, seconds * 1000, rate)
        keys = key_text([(columns[k], spec.fields[k]) for k in spec.key_fields])
        parts = partitions_for_keys(keys, job.partitions)
        offsets = np.zeros(len(parts), np.int64)
        for p in np.unique(parts):
            offsets[parts == p] = np.arange(np.count_nonzero(parts == p))
        ts = columns[spec.time_field]
        topic = job.topic_of(spec)
        made = [Message(topic=topic, partition=p, offset=o, key=k, value=v, timestamp=(1, t))
                for t, p, o, k, v in zip(ts.tolist(), parts.tolist(), offsets.tolist(), keys.to_pylist(),
                                         workloads.json_values(spec, columns).tolist())]
        stamped.append((ts, made))
    times = np.concatenate([ts for ts, _ in stamped])
    both = [m for _, made in stamped for m in made]
    return [both[i] for i in np.argsort(times, kind="stable").tolist()]


class Clock:
    """Seconds spent per phase, counted only while `counting`."""

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self.counting = False

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        began = time.perf_counter()
        yield
        if self.counting:
            self.seconds[name] += time.perf_counter() - began

    def timed(self, name: str, fn: Callable) -> Callable:
        """`fn`, its calls counted as phase `name`."""
        def wrapper(*args, **kwargs):  # type: ignore[no-untyped-def]
            with self.phase(name):
                return fn(*args, **kwargs)
        return wrapper


class DroppingProducer:
    """What the result writer produces to, taken and dropped: the broker is not measured here."""

    def produce_batch(self, topic: str, messages: list[dict], partition: int) -> int:
        return len(messages)


def intake_worker(job: JobSettings) -> Worker:
    """A Worker with just what `_take` reads: the job, its input topics and every group owned."""
    worker = Worker.__new__(Worker)
    worker.job = job
    worker.input_topics = input_topics(job)
    worker.topic_codes = {topic: code for code, topic in enumerate(worker.input_topics)}
    worker.groups = set(range(job.partitions))
    worker.pending = {}
    return worker


def run(rate: float = 5000, seconds: int = 90, window_ms: int = 30_000, partitions: int = 12,
        batch_records: int = 40_000) -> dict:
    """Feed the generated records through the worker's path `batch_records` at a time.

    rate: tuples/s per stream (event time); seconds: event time generated; window_ms: every
    stream's window; partitions: groups, all owned by the one worker; batch_records: records
    per batch (a backlog's batch)."""
    job = job_for(window_ms, partitions, rate, seconds)
    records = messages(job, rate, seconds)
    clock = Clock()
    plan = processor.join_plan(job)
    routings = [routing_for(job, partitions) for _ in job.streams]
    sink = ResultSink.of_job(job)
    writer = ResultWriter(sink, DroppingProducer(), Deliveries(), every_report=False)  # type: ignore[arg-type]
    worker = intake_worker(job)
    counted = results = 0
    steady = len(records) * (window_ms * 1.2 / 1000) / seconds
    with tempfile.TemporaryDirectory(prefix="tuple-cost-") as scratch, _timed_engine(clock):
        store = WindowedStore(Store(Path(scratch) / "w"), plan, stream_templates(job), 8 << 30, changelog=False,
                              spill=job.worker.spill)
        for start in range(0, len(records), batch_records):
            batch = records[start:start + batch_records]
            clock.counting = start >= steady
            worker.pending = {}
            with clock.phase("intake"):
                for lo in range(0, len(batch), CONSUME_CALL):
                    worker._take(batch[lo:lo + CONSUME_CALL])
            batches = processor.run_cycle(job, plan, store, worker.pending, routings, int(time.time() * 1000))
            with clock.phase("state"):
                tx = store.rocksdb.transaction()
                for b in batches:
                    store.stage(tx, b.group, b.state, b.appended, b.marks)
                tx.commit()
            with clock.phase("encode"):
                writer.write_groups([(b.group, b.results) for b in batches])
            if clock.counting:
                counted += len(batch)
                results += sum(len(b.results) for b in batches)
        store.rocksdb.close()
    if not counted:
        raise ValueError(f"no batch of {batch_records} records came after the windows filled: "
                         f"run more than {seconds} s of event time")
    per_tuple = {name: round(s / counted * 1e6, 3) for name, s in clock.seconds.items()}
    total = sum(clock.seconds.values())
    return {"parameters": {"rate_per_stream": rate, "event_seconds": seconds, "window_ms": window_ms,
                           "partitions": partitions, "batch_records": batch_records,
                           "tuple_bytes": job.workload.tuple_bytes, "domain": job.workload.domain},
            "tuples": counted, "results": results, "us_per_tuple": per_tuple,
            "total_us_per_tuple": round(total / counted * 1e6, 3), "tuples_per_s": round(counted / total)}


@contextmanager
def _timed_engine(clock: Clock) -> Iterator[None]:
    """processor's decode and join calls counted as their phases while the run lasts."""
    decode, join = processor.decode_by_group, processor.process_batch
    processor.decode_by_group = clock.timed("decode", decode)
    processor.process_batch = clock.timed("join", join)
    try:
        yield
    finally:
        processor.decode_by_group, processor.process_batch = decode, join


def plot(runs: dict[str, dict], path: Path) -> None:
    """Stacked bars of µs per tuple by phase, one bar per labelled run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.2))
    labels = list(runs)
    left = np.zeros(len(labels))
    for name in PHASES:
        widths = np.array([runs[label]["us_per_tuple"][name] for label in labels])
        ax.barh(labels, widths, left=left, label=name)
        left += widths
    for y, label in enumerate(labels):
        ax.text(left[y] + 0.05, y, f"{runs[label]['total_us_per_tuple']:.2f} µs", va="center")
    ax.set_xlabel("µs of one core per input tuple (hash worker, no broker)")
    ax.set_xlim(0, left.max() * 1.2)
    ax.legend(ncol=len(PHASES), loc="upper center", bbox_to_anchor=(0.5, -0.25), frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")  # the legend below the axes stays in the picture


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=5000)
    parser.add_argument("--seconds", type=int, default=90)
    parser.add_argument("--window-ms", type=int, default=30_000)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--plot", type=Path)
    parser.add_argument("--before", type=Path, help="an earlier run's JSON, drawn beside this one")
    args = parser.parse_args(argv)
    result = run(args.rate, args.seconds, args.window_ms)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    if args.plot:
        runs = {"before": json.loads(args.before.read_text())} if args.before else {}
        plot(runs | {"now": result}, args.plot)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
