"""Ring-mode integration plumbing: write band tuples with a plain producer,
wait for the ring to go quiet, and check the results topic against the
plain-Python theta reference join."""

from __future__ import annotations

import json
from collections import Counter
from typing import Callable

import numpy as np

from streamjoin.engine.predicates import UdfFailure, compile_terms
from streamjoin.engine.reference import RefWindow, ThetaTuple, reference_theta_join
from streamjoin.schemas.splitjoin import mark_of
from streamjoin.schemas.results import H_OFFSET, H_REASON, H_TOPIC, RoundRelease, decode_headers
from streamjoin.services.io import kafka
from streamjoin.settings import JobSettings
from tests.integration.kafka_harness import Check, commits, produced_refs, read_all


def band_rows(job: JobSettings, n: int, seed: int, t0: int = 1_000, span_ms: int = 20_000) -> list[tuple[int, dict]]:
    """(stream, value) pairs in arrival order, values uniform as in the band workload."""
    rng = np.random.default_rng(seed)
    streams = rng.integers(0, len(job.streams), n)
    ts = t0 + np.sort(rng.integers(0, span_ms, n))
    out = []
    for i, t in zip(streams.tolist(), ts.tolist()):
        spec = job.streams[i]
        v = {}
        for f, kind in spec.fields.items():
            v[f] = (t if f == spec.time_field else int(rng.integers(1, 10_001)) if kind == "int"
                    else float(rng.uniform(1, 10_000)) if kind == "float" else bool(rng.integers(0, 2))
                    if kind == "bool" else "z" * 20)
        out.append((i, v))
    return out


def produce_rows(job: JobSettings, bootstrap: str, rows: list[tuple[int, dict]], raw: list = (),
                 partitions: list[int] | None = None, spelling: Callable[[int, dict], str] = lambda _, v: json.dumps(v),
                 ) -> None:
    """Write `rows` ((stream, value) pairs) to their source topics, to `partitions[k]` when
    given, else round robin: every source partition must deliver a record before a ring's
    watermark moves (join.idle_timeout_ms off). `spelling(k, value)`: the k-th row's JSON text."""
    p = kafka.Cluster(bootstrap).producer()
    written = Counter()  # per stream, for its own round robin
    for k, (i, v) in enumerate(rows):
        partition = partitions[k] if partitions is not None else written[i] % job.partitions
        written[i] += 1
        p.produce(job.topic_of(job.streams[i]), value=spelling(k, v).encode(), partition=partition)
    for topic, value in raw:
        p.produce(topic, value=value)
    assert p.flush(30) == 0


def check_ring(job: JobSettings, bootstrap: str) -> Check:
    """The results topic against the reference over the inputs the ring released (below the
    newest RoundRelease watermark), dead-lettered records left out."""
    releases = [c.watermark for c in commits(job, bootstrap) if isinstance(c, RoundRelease)]
    expected, reasons = ring_expected(job, bootstrap, max(releases) if releases else None)
    produced = produced_refs(job, bootstrap)
    counts = Counter(produced)
    return Check(len(expected), len(produced), len(expected - set(counts)), len(set(counts) - expected),
                 sum(c - 1 for c in counts.values()), reasons)


def ring_expected(job: JobSettings, bootstrap: str, released_below: int | None,
                  every_input: bool = False) -> tuple[set, Counter]:
    """The reference results over the input records with event time below `released_below`
    (None: none), or over every input record (`every_input`), dead-lettered ones left out
    (udf-error ones stay: only their failing pairs were not joined); and the dead letters'
    count per reason."""
    dead = read_all(bootstrap, job.dead_letter_topic, job.partitions, "rcheck-dlq")
    reasons: Counter = Counter()
    excluded = set()
    for m in dead:
        h = decode_headers(m.headers())
        reasons[h[H_REASON]] += 1
        if h[H_REASON] != "udf-error":  # udf-error records were joined; only their failing pairs were not
            excluded.add((h[H_TOPIC], m.partition(), int(h[H_OFFSET])))
    streams = []
    for s in job.streams:
        topic = job.topic_of(s)
        rows = []
        for m in read_all(bootstrap, topic, job.partitions, "rcheck-in"):
            if mark_of(m.headers()) is not None:
                continue  # a SplitJoin scale or tick mark: no tuple
            ref = (topic, m.partition(), m.offset())
            v = json.loads(m.value()) if ref not in excluded else None
            if v is not None and (every_input or released_below is not None and v[s.time_field] < released_below):
                rows.append(ThetaTuple(ref, v[s.time_field], v))
        streams.append(rows)
    terms = compile_terms([s.name for s in job.streams], job.join.predicate, job.join.udfs)

    def holds(i: int, a: ThetaTuple, j: int, b: ThetaTuple) -> bool:
        for t in terms:
            if t.streams == frozenset((i, j)):
                vals = {i: np.array([a.fields[t.side(i)]]), j: np.array([b.fields[t.side(j)]])}
                try:
                    if not bool(t.evaluate(vals)[0]):
                        return False
                except UdfFailure:
                    return False  # a pair the UDF fails on is no match
        return True

    windows = [RefWindow(s.window.range_ms, s.window.rows) for s in job.streams]
    return reference_theta_join(streams, windows, holds), reasons
