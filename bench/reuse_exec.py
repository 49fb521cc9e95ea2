"""The reuse benchmark's in-process execution: every deployed operator's join run for
real on the produced workload, read back from Kafka once, and each query's compensation
applied to its operator's results.

An operator runs as its hash-mode job would (services/queries/deploy.py `version_job`
makes the job's settings; services/hash/processor.py `join_plan` the engine's plan):
each source's tuples pass its `where` (the selection cover, intake's `source_filter`),
keep the job's projected fields, are keyed on the operator's join fields (the decoder's
`join_keys`), and go through engine/window_join.py `process_batch` in event-time batches
of `batch_ms`, in time order (so none is late). The result blocks carry what the router
reads (`event_time`, `<s>.ts`, `<s>.partition`, `<s>.offset`, `<s>.<field>`, result ids),
and topology/reuse/compensation.py's `compensation_mask` picks each query's results.

Join keys are hashed once per (stream, key fields) for all operators: a worker hashes
them while decoding, which the benchmark counts with decoding, not with the join.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from streamjoin.engine.block import KEY, SYSTEM_COLUMNS, TS, Block, concat
from streamjoin.engine.result_ids import RESULT_ID_HI, RESULT_ID_LO, fmix, mix
from streamjoin.engine.window_join import JoinPlan, empty_window, process_batch
from streamjoin.schemas.codecs import decode_json, join_keys
from streamjoin.schemas.result_encode import json_documents
from streamjoin.schemas.result_format import ResultLayout
from streamjoin.services.io import kafka
from streamjoin.services.queries.deploy import version_job
from streamjoin.services.io.intake import source_filter
from streamjoin.services.hash.processor import join_plan
from streamjoin.settings import JobSettings, StreamSpec
from streamjoin.topology.reuse.compensation import Compensation, compensation_mask
from streamjoin.topology.reuse.cost import Statistics, StreamStats
from streamjoin.topology.reuse.operator import OperatorDef


@dataclass(frozen=True)
class Inputs:
    """The produced workload read back once: per stream a block of the catalog's fields sorted
    by event time and each tuple's record bytes on the topic (key and value) in the same order,
    the CPU seconds its JSON decoding took, and the event-time span [t0_ms, t1_ms) of all streams."""

    blocks: dict[str, Block]
    record_bytes: dict[str, np.ndarray]
    decode_cpu_s: dict[str, float]
    t0_ms: int
    t1_ms: int

    @property
    def tuples(self) -> dict[str, int]:
        return {name: len(block) for name, block in self.blocks.items()}

    @property
    def topic_bytes(self) -> dict[str, int]:
        return {name: int(sizes.sum()) for name, sizes in self.record_bytes.items()}

    def bytes_from(self, stream: str, from_ms: int) -> int:
        """Bytes of `stream`'s records whose event time is at or after `from_ms`."""
        start = np.searchsorted(self.blocks[stream][TS], from_ms)
        return int(self.record_bytes[stream][start:].sum())


def read_inputs(job: JobSettings, cluster: kafka.Cluster) -> Inputs:
    """Every input topic of `job` read to its end and decoded as the workers decode JSON.

    Raises ValueError when a record does not decode (the benchmark's own producer wrote them)."""
    blocks, sizes, decode_s = {}, {}, {}
    for spec in job.streams:
        topic = job.topic_of(spec)
        records = kafka.read_partitions(cluster, topic, dict.fromkeys(range(job.partitions), 0),
                                        f"{job.consumer_group}-bench-reuse")
        values = [m.value() for m in records]
        record_sizes = np.array([len(v) + len(m.key() or b"") for v, m in zip(values, records)], np.int64)
        began = time.process_time()
        decoded = decode_json(spec, values, np.array([m.partition() for m in records], np.int32),
                              np.array([m.offset() for m in records], np.int64),
                              np.array([m.timestamp()[1] for m in records], np.int64))
        decode_s[spec.name] = time.process_time() - began
        if decoded.rejects:
            raise ValueError(f"{len(decoded.rejects)} records of {topic} do not decode: {decoded.rejects[0].detail}")
        order = np.argsort(decoded.block[TS], kind="stable")
        blocks[spec.name] = decoded.block.take(order)
        sizes[spec.name] = record_sizes[decoded.records][order]
    t0 = min(int(b[TS].min()) for b in blocks.values() if len(b))
    t1 = max(int(b[TS].max()) for b in blocks.values() if len(b)) + 1
    return Inputs(blocks, sizes, decode_s, t0, t1)


@dataclass
class KeyCache:
    """Join keys per (stream, key fields), hashed as the decoder hashes them, once for all operators."""

    inputs: Inputs
    catalog: dict[str, StreamSpec]
    keys: dict[tuple[str, tuple[str, ...]], np.ndarray] = field(default_factory=dict)

    def get(self, stream: str, key_fields: tuple[str, ...]) -> np.ndarray:
        """int64 join keys of every tuple of `stream` (in the inputs' order) on `key_fields`."""
        cached = self.keys.get((stream, key_fields))
        if cached is None:
            block = self.inputs.blocks[stream]
            spec = self.catalog[stream].model_copy(update={"key_fields": list(key_fields)})
            cached = join_keys(spec, pa.table({f: block[f] for f in key_fields}))
            self.keys[(stream, key_fields)] = cached
        return cached


@dataclass(frozen=True)
class OperatorRun:
    """One operator's results over the whole input, the CPU seconds its batches from the
    measured instant on took, and the tuples its source filter let in (all of them)."""

    results: Block
    cpu_s: float
    input_tuples: int


def operator_plan(service: JobSettings, op_id: str, op: OperatorDef) -> tuple[JobSettings, JoinPlan]:
    """The hash-mode job an operator runs as, and its engine plan."""
    job = version_job(service, op_id, 1, op, {})
    return job, join_plan(job)


def operator_inputs(job: JobSettings, inputs: Inputs, keys: KeyCache) -> list[Block]:
    """Per source of the operator's `job`: its tuples keyed on the job's key fields, with the job's
    fields only (the decoder keeps nothing else), not yet filtered by `where`."""
    out = []
    for spec in job.streams:
        block = inputs.blocks[spec.name]
        columns = {name: block[name] for name in SYSTEM_COLUMNS} | {f: block[f] for f in spec.fields}
        columns[KEY] = keys.get(spec.name, tuple(spec.key_fields))
        out.append(Block(columns))
    return out


def run_operator(service: JobSettings, op_id: str, op: OperatorDef, inputs: Inputs, keys: KeyCache,
                 batch_ms: int, measured_from_ms: int | None = None) -> OperatorRun:
    """Run operator `op_id` (definition `op`) over the whole input, a batch of `batch_ms` event
    time at a time: its source filter, then the join. CPU seconds count the batches starting at
    or after `measured_from_ms` (None: all), so a caller can leave out windows filling up.

    service: the query service's settings (the catalog)."""
    job, plan = operator_plan(service, op_id, op)
    sources = operator_inputs(job, inputs, keys)
    window = empty_window(plan, [block.take(np.empty(0, np.int64)) for block in sources])
    edges = np.arange(inputs.t0_ms, inputs.t1_ms + batch_ms, batch_ms, dtype=np.int64)
    cuts = [np.searchsorted(block[TS], edges) for block in sources]
    measured_from = inputs.t0_ms if measured_from_ms is None else measured_from_ms
    parts, cpu_s, admitted = [], 0.0, 0
    for b in range(len(edges) - 1):
        began = time.process_time()
        deltas = [_rows(block, int(cut[b]), int(cut[b + 1])) for block, cut in zip(sources, cuts)]
        deltas = [delta.filter(source_filter(spec, delta)) for spec, delta in zip(job.streams, deltas)]
        outcome = process_batch(plan, window, deltas, now_ms=int(edges[b + 1]))
        if edges[b] >= measured_from:
            cpu_s += time.process_time() - began
        admitted += sum(len(delta) for delta in deltas)
        if len(outcome.results) or not parts:  # the first keeps the columns of an empty run
            parts.append(outcome.results)
    return OperatorRun(concat(parts), cpu_s, admitted)


def _rows(block: Block, lo: int, hi: int) -> Block:
    return Block({name: values[lo:hi] for name, values in block.columns.items()})


def compensate(results: Block, comp: Compensation, start_ms: int, end_ms: int | None) -> Block:
    """The rows of an operator's `results` that are the query's results (`compensation_mask`)."""
    return results.filter(compensation_mask(results.columns, comp, start_ms, end_ms))


def sink_bytes(layout: ResultLayout, results: Block) -> int:
    """Bytes of `results` as the query's sink records (compact JSON, one document each)."""
    if not len(results):
        return 0
    return int(pc.sum(pc.binary_length(json_documents(layout, results))).as_py())


def identity_rows(results: Block) -> np.ndarray:
    """Each result's id as one 128-bit value (a void view of its two uint64 halves), for set comparisons."""
    ids = np.stack([results[RESULT_ID_HI].astype(np.uint64), results[RESULT_ID_LO].astype(np.uint64)], axis=1)
    return np.ascontiguousarray(ids).view(np.dtype((np.void, 16))).ravel()


def digest(results: Block, columns: list[str]) -> tuple[int, int]:
    """A query's output as (results, checksum): the checksum sums, modulo 2^64, a mix of each
    result's id and its projected `columns`' values, so it depends on the multiset of results
    and not their order; two outputs that differ in a result, a value or a duplicate differ in
    it but by a 2^-64 chance. Cheap enough for every query, where `compare` is for a sample."""
    if not len(results):
        return 0, 0
    values = pd.util.hash_pandas_object(pd.DataFrame({name: results[name] for name in columns}), index=False)
    ids = mix(results[RESULT_ID_HI].astype(np.uint64)) ^ results[RESULT_ID_LO].astype(np.uint64)
    return len(results), int(fmix(ids ^ values.to_numpy(np.uint64)).sum(dtype=np.uint64))


def compare(shared: Block, alone: Block, columns: list[str]) -> dict:
    """The query's results through its shared operator against its standalone join: results
    missing from the shared output, extra in it, duplicated in it, and results whose
    projected `columns` differ (matched by id)."""
    got, want = identity_rows(shared), identity_rows(alone)
    got_unique, got_first = np.unique(got, return_index=True)
    want_unique, want_first = np.unique(want, return_index=True)
    common, in_got, in_want = np.intersect1d(got_unique, want_unique, return_indices=True)
    differing = 0
    for name in columns:
        a, b = shared[name][got_first[in_got]], alone[name][want_first[in_want]]
        differing += int(np.count_nonzero(a != b))
    return {"results": int(len(want)), "missing": int(len(want_unique) - len(common)),
            "extra": int(len(got_unique) - len(common)), "duplicates": int(len(got) - len(got_unique)),
            "alone_duplicates": int(len(want) - len(want_unique)), "differing_values": differing}


# ---------------------------------------------------------------- statistics for the planner

FREQUENT_DISTINCT = 64  # fields with at most this many distinct values get value shares


def measure_statistics(job: JobSettings, inputs: Inputs) -> Statistics:
    """The cost model's statistics measured on the produced data: per stream its rate over
    the inputs' event-time span, its topic's bytes per tuple, each field's mean bytes in a
    JSON result, distinct values per field, and value shares of low-cardinality fields."""
    span_s = max((inputs.t1_ms - inputs.t0_ms) / 1000.0, 1e-3)
    streams = {}
    for spec in job.streams:
        block = inputs.blocks[spec.name]
        n = max(len(block), 1)
        field_bytes, distinct, frequencies = {}, {}, {}
        for name, ftype in spec.fields.items():
            values = block[name]
            text_length = np.strings.str_len(values if ftype == "str" else values.astype("U"))
            field_bytes[name] = float(text_length.mean()) + (2.0 if ftype == "str" else 0.0) if len(values) else 0.0
            uniques, counts = np.unique(values, return_counts=True)
            distinct[name] = float(len(uniques))
            if len(uniques) <= FREQUENT_DISTINCT:
                frequencies[name] = dict(zip(uniques.tolist(), (counts / n).tolist()))
        streams[spec.name] = StreamStats(rate=len(block) / span_s, tuple_bytes=inputs.topic_bytes[spec.name] / n,
                                         field_bytes=field_bytes, frequencies=frequencies, distinct=distinct)
    return Statistics(streams=streams)
