"""Pathway interval join, run by `pathway_peer` under Pathway's own Python
(its pins clash with this project's, so it lives in a separate venv and
this file imports nothing from the project, nor Pathway until `run`).

Usage: python pathway_job.py SPEC.json. Both input topics are read with
Pathway's Kafka connector in streaming mode (its static mode stops at the end
offsets ListOffsets reports, which Tansu answers short: the last record
batch's base offset + 1) under a fresh consumer group from the earliest
offsets, JSON parsed to the stream's typed schema, each row given its Kafka
partition and offset (`with_metadata`). `interval_join` with no temporal
behaviour keeps every row (nothing is forgotten or dropped as late), so an
inner join of inputs that only grow emits each pair once and never retracts
one; every column goes as JSON to the output topic.

Progress is read without Python per row: the inputs' count and the results'
count are Pathway reductions, and subscriptions to them see one change per
Pathway time. Once the results have closed the time at which the count of
inputs reached the spec's total, every result has been handed to the sink:
the job prints {"results": count} and runs on until the peer, having seen
that many records in the output topic, interrupts it (SIGINT; an interrupt
before every result is written loses the sink's queue). It then prints one
JSON line: epoch seconds of the job's start, of the first input
row counted and of every result handed to the sinks (`done`), the progress
samples ([epoch seconds, inputs whose results are out]), the inputs counted,
the threads and Pathway's version.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

_TYPES = {"int": int, "str": str, "bool": bool, "float": float}


class Progress:
    """Inputs counted per Pathway time against the times the results have closed: a sample per
    closed time, and `stop` called once when every input's results are out."""

    def __init__(self, total: int, stop: Callable[[], None], clock: Callable[[], float] = time.time) -> None:
        """`total`: input rows to process; `stop`: called once all are processed; `clock`: epoch seconds."""
        self.total = total
        self.stop = stop
        self.clock = clock
        self.counted: list[tuple[int, int]] = []  # (Pathway time, inputs counted by then), ascending
        self.closed = -1  # the latest Pathway time the results have closed
        self.samples: list[tuple[float, int]] = []
        self.first: float | None = None
        self.done: float | None = None
        self.results = 0  # the results' count at the latest time reported
        self._lock = threading.Lock()  # the two subscriptions may call back from different engine threads

    def inputs(self, at: int, count: int) -> None:
        """The inputs' count became `count` at Pathway time `at`."""
        with self._lock:
            if self.first is None:
                self.first = self.clock()
            self.counted.append((at, count))
            self._advance()

    def results_counted(self, count: int) -> None:
        """The results' count became `count`."""
        with self._lock:
            self.results = count

    def results_closed(self, at: int) -> None:
        """The results have closed Pathway time `at`: every result of inputs counted by then is out."""
        with self._lock:
            self.closed = max(self.closed, at)
            self._advance()

    def out(self) -> int:
        """Inputs whose results are out: the count at the latest time the results have closed."""
        return max((count for at, count in self.counted if at <= self.closed), default=0)

    def _advance(self) -> None:
        out = self.out()
        if self.done is not None or out == (self.samples[-1][1] if self.samples else 0):
            return
        now = self.clock()
        self.samples.append((now, out))
        if out >= self.total:
            self.done = now
            self.stop()


def _schema(pw: Any, fields: dict[str, str]) -> Any:
    return pw.schema_from_types(**{name: _TYPES[ftype] for name, ftype in fields.items()})


def _settings(spec: dict, extra: dict) -> dict[str, str]:
    """librdkafka settings for Pathway's connectors, which take strings only."""
    return {k: str(v) for k, v in {"bootstrap.servers": spec["bootstrap"], **extra}.items()}


def _side(pw: Any, spec: dict, stream: dict) -> Any:
    """One input topic as a table: its fields prefixed with the stream's name, plus its Kafka
    partition and offset (the result's identity)."""
    settings = _settings(spec, {"group.id": f"{spec['group']}-{stream['name']}", "auto.offset.reset": "earliest",
                                **spec["consumer_config"]})
    table = pw.io.kafka.read(settings, stream["topic"], schema=_schema(pw, stream["fields"]), format="json",
                             with_metadata=True, autocommit_duration_ms=spec["autocommit_ms"],
                             name=f"in-{stream['name']}")
    name, meta = stream["name"], table._metadata
    return table.select(**{f"{name}_{f}": table[f] for f in stream["fields"]},
                        **{f"{name}_partition": pw.unwrap(meta["partition"].as_int()),
                           f"{name}_offset": pw.unwrap(meta["offset"].as_int())})


def _join(pw: Any, spec: dict, r: Any, s: Any) -> Any:
    """r.interval_join(s): equal keys and s.t - r.t within the spec's closed [lower, upper]."""
    a, b = spec["streams"]
    keys = [r[f"{a['name']}_{ka}"] == s[f"{b['name']}_{kb}"] for ka, kb in zip(a["key_fields"], b["key_fields"])]
    bounds = pw.temporal.interval(spec["interval"]["lower"], spec["interval"]["upper"])
    joined = r.interval_join(s, r[f"{a['name']}_{a['time_field']}"], s[f"{b['name']}_{b['time_field']}"], bounds,
                             *keys)
    return joined.select(*pw.left, *pw.right)


def main(spec_path: str) -> None:
    began = time.time()
    spec = json.loads(Path(spec_path).read_text())
    os.environ["PATHWAY_THREADS"] = str(spec["threads"])  # read when the engine starts
    from importlib.metadata import version

    import pathway as pw

    r, s = (_side(pw, spec, stream) for stream in spec["streams"])
    joined = _join(pw, spec, r, s)
    pw.io.kafka.write(joined, _settings(spec, spec["producer_config"]),
                      spec["output"], format="json", name="results")
    stopping = threading.Event()

    def stop() -> None:
        # The sink may still be writing: the peer interrupts the job once the topic holds them all.
        print(json.dumps({"results": progress.results}), flush=True)
        stopping.set()

    progress = Progress(spec["inputs"], stop)
    inputs = r.select(n=1).concat_reindex(s.select(n=1)).reduce(n=pw.reducers.count())
    pw.io.subscribe(inputs, on_change=lambda key, row, time, is_addition: progress.inputs(time, row["n"])
                    if is_addition else None, name="inputs-counted")
    pw.io.subscribe(joined.reduce(n=pw.reducers.count()),
                    on_change=lambda key, row, time, is_addition: progress.results_counted(row["n"])
                    if is_addition else None, on_time_end=progress.results_closed, name="results-closed")
    try:
        pw.run(monitoring_level=pw.MonitoringLevel.NONE)
    except KeyboardInterrupt:  # the peer's, once every result is written
        if not stopping.is_set():
            raise
    print(json.dumps({"began": began, "first": progress.first, "done": progress.done, "samples": progress.samples, "processed": progress.out(), "threads": spec["threads"],
                      "version": version("pathway")}))


if __name__ == "__main__":
    main(sys.argv[1])
