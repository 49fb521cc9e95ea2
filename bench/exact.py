"""Is a job's output exact? One verdict shape from either checker:

  spark      Spark `verify` (services/spark/verify.py): the exact join of the
             input topics against the results topic; what full runs use.
  reference  engine/reference.py, the plain-Python join that states the
             contract, over the input topics read back (one JSON parse per
             tuple: a checker, not a hot path); for small runs, where Spark's
             start-up and per-job passes would cost more than the run.

Both report the result counts and missing, extra and duplicate results;
`verified` is true when the last three are 0 (Spark's own verdict also
requires no bad ids and no lost inputs).
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Literal

from streamjoin.bench.ours import VERIFY_KEYS, read_results
from streamjoin.engine.reference import RefTuple, RefWindow, reference_join
from streamjoin.schemas.results import ref_columns
from streamjoin.services.io import kafka
from streamjoin.settings import JobSettings

Verifier = Literal["spark", "reference"]


def check_exact(job: JobSettings, cluster: kafka.Cluster, verifier: Verifier) -> dict:
    """The verdict on `job`'s whole output from `verifier`, with `verifier` named in it."""
    if verifier == "spark":
        from streamjoin.services.spark.verify import run_verify

        verdict = run_verify(job, cluster)
        return {"verifier": "spark", **{k: verdict.get(k) for k in VERIFY_KEYS}}
    return {"verifier": "reference", **reference_verdict(job, cluster)}


def reference_verdict(job: JobSettings, cluster: kafka.Cluster) -> dict:
    """engine/reference.py's join of every input tuple against the results topic (time windows only)."""
    if any(s.window.range_ms is None for s in job.streams):
        raise ValueError("the reference check here covers time windows (range_ms) only")
    streams = [_ref_tuples(job, cluster, i) for i in range(len(job.streams))]
    expected = reference_join(streams, [RefWindow(s.window.range_ms) for s in job.streams])
    produced = Counter(_result_refs(job, cluster))
    missing, extra = len(expected - set(produced)), len(set(produced) - expected)
    duplicates = sum(n - 1 for n in produced.values())
    return {"verified": missing == extra == duplicates == 0, "missing": missing, "extra": extra,
            "duplicates": duplicates, "expected": len(expected), "results": sum(produced.values()),
            "inputs": {"total": sum(len(s) for s in streams)}}


def _result_refs(job: JobSettings, cluster: kafka.Cluster) -> list[tuple[tuple[str, int, int], ...]]:
    """Every result as its inputs' (topic, partition, offset), in stream order (repeats kept)."""
    cols = {s.name: ref_columns(s.name)[:2] for s in job.streams}
    # One read for every column: two reads of the topic need not return the results in one order.
    res = read_results(cluster, job, [c for pair in cols.values() for c in pair])
    per_stream = [[(job.topic_of(s), p, o) for p, o in zip(*(res[c].tolist() for c in cols[s.name]))]
                  for s in job.streams]
    return list(zip(*per_stream))


def _ref_tuples(job: JobSettings, cluster: kafka.Cluster, stream: int) -> list[RefTuple]:
    """Stream `stream`'s tuples as the reference join takes them: (topic, partition, offset), key, time."""
    spec = job.streams[stream]
    if len(spec.key_fields) != 1:
        raise ValueError(f"the reference check here joins on one key field, not {spec.key_fields}")
    topic = job.topic_of(spec)
    records = kafka.read_partitions(cluster, topic, dict.fromkeys(range(job.partitions), 0),
                                    f"{job.consumer_group}-bench-reference")
    out = []
    for m in records:
        value = json.loads(m.value())
        out.append(RefTuple((topic, m.partition(), m.offset()), value[spec.key_fields[0]], value[spec.time_field]))
    return out
