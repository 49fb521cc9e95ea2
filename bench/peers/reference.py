"""The floor: engine/reference.py, the plain-Python nested-loop join that
states the contract, run single-process on the same input tuples. It is a
batch join over everything at once (no Kafka, no state store, no output
encoding), so its tuples/s is what naive Python does with the same work."""

from __future__ import annotations

import statistics
import time

import pyarrow as pa

from streamjoin.engine.reference import RefTuple, RefWindow, reference_join
from streamjoin.settings import JobSettings


def ref_tuples(job: JobSettings, tables: dict[str, pa.Table]) -> list[list[RefTuple]]:
    """The exported inputs as the reference's tuples (building them is per-tuple Python, and not timed)."""
    out = []
    for spec in job.streams:
        t = tables[spec.name]
        keys = list(zip(*[t.column(k).to_pylist() for k in spec.key_fields]))
        if len(spec.key_fields) == 1:
            keys = [k[0] for k in keys]
        topic = job.topic_of(spec)
        out.append([RefTuple((topic, p, o), k, ts) for p, o, k, ts in
                    zip(t.column("partition").to_pylist(), t.column("offset").to_pylist(), keys,
                        t.column(spec.time_field).to_pylist())])
    return out


def run_reference(job: JobSettings, tables: dict[str, pa.Table], repeats: int) -> dict:
    """Times reference_join over all inputs `repeats` times; tuples/s is the median."""
    streams = ref_tuples(job, tables)
    windows = [RefWindow(s.window.range_ms, s.window.rows) for s in job.streams]
    inputs = sum(len(s) for s in streams)
    seconds: list[float] = []
    results = 0
    for _ in range(repeats):
        began = time.perf_counter()
        results = len(reference_join(streams, windows))
        seconds.append(time.perf_counter() - began)
    return {"tuples_per_s": inputs / statistics.median(seconds), "inputs": inputs, "results": results,
            "seconds": [round(s, 3) for s in seconds],
            "how": f"engine/reference.py reference_join, one process, all inputs at once; median of {repeats}"}
