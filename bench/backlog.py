"""A pre-loaded backlog of a keyed workload, written without Spark: the input
the scale-out benchmark (`bench equijoin --scale`) drains with 1..k workers.

What lands in Kafka is what Spark `sources` would write for the same tuples:
one compact JSON object per tuple (fields in the stream's order, the first
free string padded with 'x' so the object is `workload.tuple_bytes` long),
record key = the canonical join-key text, partition = Kafka's default
partitioner on that key (murmur2, `partitions_for_keys`), so no record is
re-routed. Tuples are the equijoin generator's (services/workloads.py):
Poisson arrivals, b-model keys (Zipf keys for workload.kind zipf); key fields
and other numbers carry the key.

Event time spans `event_ms` from a start the caller picks (the scale run
puts it that far in the past, so no tuple is ahead of the workers' clock),
long enough for windows to fill and expire during a drain. A chunk of event
time per stream is drawn from a generator seeded by (workload random_state, stream,
chunk), so the backlog is a function of the seed and the start alone.

Who does what. The parent draws the tuples chunk after chunk (both streams
per chunk, in event-time order), hashes their keys to partitions, and hands
each producer process the rows of the partitions it owns (a contiguous
slice). A producer encodes its rows' JSON and keys in bulk (Arrow) and
produces them in order, so every partition holds its tuples sorted by event
time, as a live producer writes them. The one Python step per tuple left is
`produce()`, which librdkafka's API requires. Once all are flushed, every
partition's end offset must equal the tuples drawn for it. Producers are
spawned, not forked (a fork would inherit this process's librdkafka threads),
so a script that calls `preload` needs multiprocessing's
`if __name__ == "__main__":` guard; the CLI has it. `write_backlog` is the
same writer for any drawn rows that say how to encode themselves (the
`nexmark` bench's events).
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from streamjoin.schemas.join_keys import key_text
from streamjoin.services import workloads
from streamjoin.services.io import kafka
from streamjoin.settings import JobSettings, StreamSpec
from streamjoin.topology import topics
from streamjoin.topology.partitioner import partitions_for_keys

# Entropy tag of the backlog's chunk generators: no stream index or chunk number reaches it, and it
# differs from workloads' own tags, so a backlog never repeats a sources batch or a sample.
_BACKLOG = 2**32 - 5
# librdkafka batching for a bulk load: big batches that wait for each other, a deep local queue.
PRODUCER_TUNING: dict[str, Any] = {
    "linger.ms": 100,
    "batch.size": 4 << 20,
    "queue.buffering.max.messages": 2_000_000,
    "queue.buffering.max.kbytes": 1 << 20,
}
_QUEUE_CHUNKS = 8  # chunks queued per producer: bounds the parent's lead, and memory
_FLUSH_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class BacklogPlan:
    """tuples: about how many tuples, both streams together (Poisson: the exact count is drawn);
    event_ms: the event time they span; producers: producer processes;
    chunk_tuples: about how many tuples of one stream are drawn at a time."""

    tuples: int
    event_ms: int
    producers: int
    chunk_tuples: int = 250_000

    def rate(self, streams: int) -> float:
        """Tuples/s of event time per stream."""
        return self.tuples / streams / (self.event_ms / 1000)


@dataclass(frozen=True)
class Chunk:
    """One stream's tuples of one chunk of event time, in arrival order: event time (ms), key and
    the partition Kafka's default partitioner gives the key."""

    stream: int
    ts: np.ndarray
    key: np.ndarray
    partition: np.ndarray

    def take(self, rows: np.ndarray) -> "Chunk":
        return Chunk(self.stream, self.ts[rows], self.key[rows], self.partition[rows])

    def __len__(self) -> int:
        return len(self.ts)

    def produce(self, producer: Any, job: JobSettings) -> None:
        produce_chunk(producer, job, self)


class Rows(Protocol):
    """What `write_backlog` hands its producer processes: one stream's rows (`stream`, the index
    of its spec in the job), each row's partition, and how to encode and produce them."""

    stream: int
    partition: np.ndarray

    def take(self, rows: np.ndarray) -> "Rows": ...

    def __len__(self) -> int: ...

    def produce(self, producer: Any, job: JobSettings) -> None: ...


# ---------------------------------------------------------------- drawing the tuples


def chunks(job: JobSettings, plan: BacklogPlan, start_ms: int) -> Iterator[Chunk]:
    """Every chunk of the backlog in event-time order, both streams per chunk of time.

    job: the workload (streams, workload.random_state/skew/domain/rate_factors, partitions);
    plan: its size; start_ms: the event time of the backlog's start."""
    rate = plan.rate(len(job.streams))
    chunk_ms = max(1, round(plan.chunk_tuples / rate * 1000))
    for index, t0 in enumerate(range(start_ms, start_ms + plan.event_ms, chunk_ms)):
        t1 = min(t0 + chunk_ms, start_ms + plan.event_ms)
        for stream in range(len(job.streams)):
            yield draw(job, stream, index, t0, t1, rate)


def draw(job: JobSettings, stream: int, index: int, t0_ms: int, t1_ms: int, rate: float) -> Chunk:
    """Stream `stream`'s chunk `index`: Poisson arrivals at `rate` tuples/s (times the stream's
    workload.rate_factors) in [t0_ms, t1_ms), keyed workload keys (b-model, or Zipf for
    workload.kind zipf), each key's partition."""
    w = job.workload
    rng = np.random.default_rng([w.random_state, stream, _BACKLOG, index])
    spec = job.streams[stream]
    arrivals = workloads.poisson_times(rng, rate * w.rate_factors.get(spec.name, 1.0), t0_ms, t1_ms)
    key = workloads.equijoin_keys(rng, len(arrivals), job)
    ts = np.floor(arrivals).astype(np.int64)
    return Chunk(stream, ts, key, partitions_for_keys(record_keys(spec, tuple_columns(spec, ts, key)), job.partitions))


def tuple_columns(spec: StreamSpec, ts: np.ndarray, key: np.ndarray) -> workloads.Columns:
    """The stream's columns as the equijoin generator fills them, padding aside: the time field
    `ts`, free strings empty (`json_values` pads the first), every other field carries `key`.

    Raises ValueError for float and bytes fields: Arrow writes floats unlike Spark's to_json,
    and JSON records carry no raw bytes."""
    free = _free_strings(spec)
    cols: workloads.Columns = {}
    for name, ftype in spec.fields.items():
        if ftype in ("float", "bytes"):
            raise ValueError(f"the backlog writes int, str and bool fields, not {ftype} ({spec.name}.{name})")
        if name == spec.time_field:
            cols[name] = ts
        elif name in free:
            cols[name] = np.zeros(len(ts), "U1")
        else:
            cols[name] = {"int": key, "bool": key % 2 == 1, "str": key.astype("U")}[ftype]
    return cols


def _free_strings(spec: StreamSpec) -> list[str]:
    return [n for n, t in spec.fields.items() if t == "str" and n not in spec.key_fields and n != spec.time_field]


# ---------------------------------------------------------------- records


def record_keys(spec: StreamSpec, cols: workloads.Columns) -> pa.LargeBinaryArray:
    """Each tuple's record key: the canonical join-key text of its key fields."""
    return key_text([(cols[k], spec.fields[k]) for k in spec.key_fields])


def json_values(spec: StreamSpec, cols: workloads.Columns, tuple_bytes: int | None) -> pa.Array:
    """Each tuple's compact JSON object, as Spark's to_json writes it (the stream's field order),
    with the first free string 'x' * room, room bringing the object to `tuple_bytes` (none if it
    is longer already): whole-array Arrow kernels, no Python per tuple.

    spec: the stream; cols: `tuple_columns`, or any columns whose strings need no escaping;
    tuple_bytes: the target record length (None: every field as given, no padding)."""
    free = _free_strings(spec)
    pieces: list[Any] = []
    for i, (name, ftype) in enumerate(spec.fields.items()):
        pieces.append(f'{"," if i else "{"}"{name}":')
        pieces.append(_json_text(cols[name], ftype))
    pieces.append("}")
    if not free or tuple_bytes is None:
        return _join(pieces)
    # Split around the padded field's (empty) text: head ends with its opening quote.
    at = 2 * list(spec.fields).index(free[0]) + 1
    head, tail = _join(pieces[:at] + ['"']), _join(['"'] + pieces[at + 1:])
    room = pc.max_element_wise(pc.subtract(tuple_bytes, pc.add(pc.binary_length(head), pc.binary_length(tail))), 0)
    return _join([head, pc.binary_repeat("x", room), tail])


def _json_text(values: np.ndarray, ftype: str) -> pa.Array:
    if ftype == "str":
        return _join(['"', pa.array(values, pa.string()), '"'])
    return pa.array(values).cast(pa.string())  # ints as decimals, bools as true/false


def _join(pieces: list[Any]) -> pa.Array:
    """Row-wise concatenation of string arrays and constants (Arrow broadcasts the constants)."""
    return pc.binary_join_element_wise(*pieces, "")


# ---------------------------------------------------------------- producing


def owners(partitions: np.ndarray, partition_count: int, producers: int) -> np.ndarray:
    """The producer owning each partition: producer j owns a contiguous slice of the partitions."""
    return (partitions.astype(np.int64) * producers) // partition_count


def preload(job: JobSettings, cluster: kafka.Cluster, plan: BacklogPlan, start_ms: int, console: Console) -> dict:
    """Create `job`'s topics and write the backlog into its input topics with `plan.producers`
    producer processes; returns what was written (tuples per topic, seconds, tuples/s).

    Raises RuntimeError when a producer fails or a partition's end offset is not the count drawn."""
    written = write_backlog(job, cluster, chunks(job, plan, start_ms), plan.producers, plan.tuples, console)
    return {**written, "start_ms": start_ms, "event_ms": plan.event_ms}


def write_backlog(job: JobSettings, cluster: kafka.Cluster, drawn_rows: Iterable[Rows], producers: int,
                  about: int, console: Console) -> dict:
    """Create `job`'s topics and write `drawn_rows` into its input topics with `producers`
    processes, each owning a contiguous slice of the partitions, so every partition holds its
    rows in the order drawn; `about`: how many rows to expect (the progress bar's total).
    Returns the tuples per topic, seconds and tuples/s; raises RuntimeError when a producer
    fails or a partition's end offset is not the count drawn."""
    topics.ensure(cluster.admin(), job)
    drawn = np.zeros((len(job.streams), job.partitions), np.int64)
    ctx = mp.get_context("spawn")
    inboxes = [ctx.Queue(_QUEUE_CHUNKS) for _ in range(producers)]
    outbox = ctx.Queue()
    procs = [ctx.Process(target=_producer, args=(cluster, job.model_dump_json(), i, inboxes[i], outbox), daemon=True)
             for i in range(producers)]
    began = time.monotonic()
    for p in procs:
        p.start()
    try:
        with _progress(console, about) as (bar, task):
            for chunk in drawn_rows:
                drawn[chunk.stream] += np.bincount(chunk.partition, minlength=job.partitions)
                _hand_out(chunk, owners(chunk.partition, job.partitions, producers), inboxes, procs)
                _reports(outbox, bar, task, 0)
            for inbox, proc in zip(inboxes, procs):
                _put(inbox, None, proc)
            _await_producers(procs, outbox, bar, task)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
    seconds = time.monotonic() - began
    _check_ends(job, cluster, drawn)
    total = int(drawn.sum())
    return {"tuples": total, "per_topic": {job.topic_of(s): int(drawn[i].sum()) for i, s in enumerate(job.streams)},
            "producers": producers, "seconds": round(seconds, 2), "tuples_per_s": total / seconds}


def _hand_out(chunk: Rows, owner: np.ndarray, inboxes: list[Any], procs: list[Any]) -> None:
    """Each producer gets the chunk's rows of its partitions, in arrival order (a stable split)."""
    order = np.argsort(owner, kind="stable")
    bounds = np.searchsorted(owner[order], np.arange(len(inboxes) + 1))
    for j, inbox in enumerate(inboxes):
        rows = order[bounds[j]:bounds[j + 1]]
        if len(rows):
            _put(inbox, chunk.take(rows), procs[j])


def _put(inbox: Any, item: Rows | None, proc: Any) -> None:
    """Queue `item` for producer `proc`, waiting while its inbox is full; raises RuntimeError if the
    producer died meanwhile (its inbox would stay full for good)."""
    while True:
        try:
            inbox.put(item, timeout=1.0)
            return
        except queue.Full:
            if proc.exitcode is not None:
                raise RuntimeError(f"producer process {proc.name} exited (code {proc.exitcode}) with chunks queued")


@contextmanager
def _progress(console: Console, total: int) -> Iterator[tuple[Progress, TaskID]]:
    """A bar of the tuples the producers have handed to librdkafka (stderr; static off a terminal)."""
    with Progress(TextColumn("[bold cyan]bench[/] preloading"), BarColumn(), TextColumn("{task.completed:,} tuples"),
                  TimeElapsedColumn(), console=console, transient=True) as progress:
        yield progress, progress.add_task("preload", total=total)


def _reports(outbox: Any, bar: Progress, task: TaskID, wait_s: float) -> dict[int, str | None]:
    """Every producer report queued now, waiting up to `wait_s` for the first: ("chunk", index,
    tuples) advances the bar; ("done", index, error or None) is returned, by producer index."""
    done: dict[int, str | None] = {}
    while True:
        try:
            kind, index, value = outbox.get(block=wait_s > 0, timeout=wait_s or None)
        except queue.Empty:
            return done
        wait_s = 0
        if kind == "chunk":
            bar.advance(task, value)
        else:
            done[index] = value


def _await_producers(procs: list[Any], outbox: Any, bar: Progress, task: TaskID) -> None:
    """Until every producer has flushed and said so; raises RuntimeError when one failed or died."""
    finished: dict[int, str | None] = {}
    while len(finished) < len(procs):
        finished |= _reports(outbox, bar, task, 1.0)
        if any(i not in finished and p.exitcode is not None for i, p in enumerate(procs)):
            finished |= _reports(outbox, bar, task, 1.0)  # a report may trail its process's exit
            dead = {i: p.exitcode for i, p in enumerate(procs) if i not in finished and p.exitcode is not None}
            if dead:
                raise RuntimeError(f"producer processes exited without reporting (index: exit code): {dead}")
    failed = {i: e for i, e in finished.items() if e}
    if failed:
        raise RuntimeError(f"producers failed: {failed}")


def _check_ends(job: JobSettings, cluster: kafka.Cluster, drawn: np.ndarray) -> None:
    """Every input partition's end offset must be the tuples drawn for it: none lost, none twice."""
    parts = [(job.topic_of(s), p) for s in job.streams for p in range(job.partitions)]
    ends = kafka.end_offsets(cluster, parts, f"{job.consumer_group}-backlog-probe")
    wrong = {f"{t}[{p}]": (ends[(t, p)], int(drawn[i // job.partitions, p]))
             for i, (t, p) in enumerate(parts) if ends[(t, p)] != drawn[i // job.partitions, p]}
    if wrong:
        raise RuntimeError(f"backlog partitions whose end offset is not the tuples drawn (end, drawn): "
                           f"{dict(list(wrong.items())[:8])}")


def _producer(cluster: kafka.Cluster, job_json: str, index: int, inbox: Any, outbox: Any) -> None:
    """A producer process: encodes and produces the chunks it is handed until None, flushes, and
    reports ("chunk", index, tuples) per chunk and ("done", index, error or None) at the end."""
    job = JobSettings.model_validate_json(job_json)
    error = None
    try:
        producer = cluster.producer(**PRODUCER_TUNING)
        while (chunk := inbox.get()) is not None:
            chunk.produce(producer, job)
            outbox.put(("chunk", index, len(chunk)))
        left = producer.flush(_FLUSH_TIMEOUT_S)
        error = f"{left} records still unsent after {_FLUSH_TIMEOUT_S:.0f}s" if left else None
    except Exception as e:  # reported to the parent, which raises it with the others
        error = f"{type(e).__name__}: {e}"
    outbox.put(("done", index, error))


def produce_chunk(producer: Any, job: JobSettings, chunk: Chunk) -> None:
    """Encode `chunk`'s records in bulk and produce them in order (a full local queue waits)."""
    spec = job.streams[chunk.stream]
    cols = tuple_columns(spec, chunk.ts, chunk.key)
    values = json_values(spec, cols, job.workload.tuple_bytes).cast(pa.binary()).to_pylist()
    produce_records(producer, job.topic_of(spec), values, record_keys(spec, cols).to_pylist(), chunk.partition)


def produce_records(producer: Any, topic: str, values: list[bytes], keys: list[bytes], partitions: np.ndarray) -> None:
    """Produce the records to their partitions in order; a full local queue serves deliveries and retries."""
    produce = producer.produce
    for value, key, partition in zip(values, keys, partitions.tolist()):
        while True:
            try:
                produce(topic, value, key, partition)
                break
            except BufferError:  # librdkafka's queue is full: serve deliveries, then retry
                producer.poll(0.05)
    producer.poll(0)
