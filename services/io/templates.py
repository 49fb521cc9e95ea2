"""What every mode builds from a job's streams: the tuple templates (an empty block of each
stream's columns, `stream_templates`; with the ring's slice columns, `ring_templates`) and
the query as the ring engine sees it (`ring_plan`: ring nodes, SplitJoin cores and merger)."""

from __future__ import annotations

import numpy as np

from streamjoin.engine.block import Block
from streamjoin.engine.predicates import compile_terms
from streamjoin.engine.psp.plan import RingPlan, RingStream, count_column
from streamjoin.engine.psp.slices import GLOBAL_SEQ, STREAM_SEQ
from streamjoin.engine.window_join import template
from streamjoin.settings import JobSettings


def stream_templates(job: JobSettings) -> list:
    """Per stream, an empty block of its columns: the join key, time, source coordinates and
    arrival clock, then its fields."""
    out = []
    for spec in job.streams:
        dtypes = {"_key": np.int64, "_ts": np.int64, "_part": np.int32, "_off": np.int64, "_arr": np.int64}
        for name, t in spec.fields.items():
            dtypes[name] = {"int": np.int64, "float": np.float64, "bool": np.bool_, "str": "U1", "bytes": "S1"}[t]
        out.append(template({k: np.dtype(v) for k, v in dtypes.items()}))
    return out


def ring_plan(job: JobSettings, orders: tuple[tuple[int, ...], ...] | None = None) -> RingPlan:
    """The query as the ring engine sees it (orders: the head's, from the coordinator)."""
    streams = tuple(RingStream(s.name, job.topic_of(s), s.window.range_ms, s.window.rows,
                               tuple(job.result_fields(s))) for s in job.streams)
    terms = compile_terms([s.name for s in job.streams], job.join.predicate, job.join.udfs)
    m = len(streams)
    return RingPlan(streams, terms, orders or tuple(tuple(j for j in range(m) if j != i) for i in range(m)))


def ring_templates(job: JobSettings) -> list[Block]:
    m = len(job.streams)
    extra = {GLOBAL_SEQ: np.empty(0, np.int64), STREAM_SEQ: np.empty(0, np.int64)}
    extra |= {count_column(k): np.empty(0, np.int64) for k in range(m)}
    return [Block(dict(t.columns) | extra) for t in stream_templates(job)]
