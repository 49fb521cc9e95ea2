"""Quix Streams' `join_interval` on the same input topics: the Kafka-native
Python stream processor, reading the topics our workers read (not an export),
exactly-once, its state in RocksDB with changelog topics. It pins
confluent-kafka<2.13 (ours is newer), so it runs from its own venv:
STREAMJOIN_QUIX_PYTHON, else <repo>/.venv-quix (ops/setup.sh makes it);
without either the peer reports why it did not run.

Our window rule, for r and s with equal keys: s.t < r.t + W_r and
r.t < s.t + W_s. Quix matches a record against the other side's stored
records that are no newer than it: a left (r) record finds s in
[r.t - backward_ms, r.t], a right (s) record finds r in [s.t - forward_ms,
s.t]. With integer milliseconds, backward_ms = W_s - 1 and forward_ms =
W_r - 1 is our rule, provided each pair's newer member (in event time) is
processed after the older one. Quix aims for that by consuming the
partitions with one number in Kafka-timestamp order, which is not event-time
order where the two disagree: a pair whose newer member is processed first
is never emitted. Exactness is therefore measured, never assumed: the
results' (partition, offset) pairs against the rule's pair set.

Throughput is the input over the seconds from the first record processed to
the end of the run (the final exactly-once commit included): the venv's
start-up, the group join and the state set-up are left out.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.json as pajson
from confluent_kafka import Message

from streamjoin.bench.inputs import ARRIVAL
from streamjoin.services.io import kafka
from streamjoin.settings import JobSettings

PYTHON_ENV = "STREAMJOIN_QUIX_PYTHON"
_JOB = Path(__file__).with_name("quix_job.py")
# bench/peers/ -> the repository root, where ops/setup.sh makes the venv.
DEFAULT_PYTHON = Path(__file__).resolve().parents[2] / ".venv-quix" / "bin" / "python"
PAIR = ("r_partition", "r_offset", "s_partition", "s_offset")  # a result's identity: both inputs'
TIMESTAMP_MS = "kafka_timestamp_ms"  # read_json's column of the records' Kafka timestamps
# Tansu's group join waits for max.poll.interval.ms in a rebalance: keep it short.
_CONSUMER = {"max.poll.interval.ms": 10_000, "session.timeout.ms": 10_000}


def quix_python() -> str | None:
    """The Quix venv's python: STREAMJOIN_QUIX_PYTHON, else the repository's .venv-quix if it exists."""
    named = os.environ.get(PYTHON_ENV)
    if named:
        return named
    return str(DEFAULT_PYTHON) if DEFAULT_PYTHON.exists() else None


def unsupported(job: JobSettings, peer: str = "Quix") -> str | None:
    """Why the `peer` cannot run `job`, or None: interval joins are binary, and PAIR names r and s."""
    if [s.name for s in job.streams] != ["r", "s"]:
        return f"the {peer} peer joins two streams r and s, the job has {[s.name for s in job.streams]}"
    if any(s.window.range_ms is None for s in job.streams):
        return f"the {peer} peer joins RANGE windows, the job counts rows"
    return None


def interval(job: JobSettings) -> dict[str, int]:
    """join_interval's bounds for our rule on the job's two RANGE windows (see the module docstring);
    grace keeps each side's records a window plus the allowed lateness behind its newest, per key."""
    r, s = (int(spec.window.range_ms or 0) for spec in job.streams)
    return {"backward_ms": s - 1, "forward_ms": r - 1, "grace_ms": max(r, s) + job.join.allowed_lateness_ms}


def job_spec(job: JobSettings, cluster: kafka.Cluster, inputs: int, workdir: Path,
             consumer: dict | None = None) -> dict:
    """What quix_job.py runs: `inputs` is how many records the input topics hold (the job stops there).
    `workdir` holds its state; the group and the output topic are fresh per call; `consumer`:
    consumer settings over _CONSUMER's."""
    run = uuid.uuid4().hex[:8]
    return {"bootstrap": cluster.bootstrap, "group": f"{job.job}-quix-{run}", "inputs": inputs,
            "streams": [{"name": s.name, "topic": job.topic_of(s), "time_field": s.time_field} for s in job.streams],
            "interval": interval(job), "output": f"{job.job}.quix-results-{run}", "partitions": job.partitions,
            "state_dir": str(workdir / f"state-{run}"), "consumer_config": _CONSUMER | (consumer or {})}


def rule_pairs(job: JobSettings, tables: dict[str, pa.Table]) -> pa.Table:
    """Every (r_partition, r_offset, s_partition, s_offset) our window rule joins in the exported inputs:
    equal keys, s.t < r.t + W_r and r.t < s.t + W_s (engine/reference.py's contract for RANGE windows)."""
    r, s = job.streams
    sides = []
    for spec in (r, s):
        t = tables[spec.name]
        columns = ["partition", "offset", spec.time_field, *spec.key_fields]
        names = [f"{spec.name}_partition", f"{spec.name}_offset", f"{spec.name}_t",
                 *(f"key{i}" for i in range(len(spec.key_fields)))]
        sides.append(t.select(columns).rename_columns(names))
    keys = [f"key{i}" for i in range(len(r.key_fields))]
    joined = sides[0].join(sides[1], keys=keys, join_type="inner")
    rt, st = (joined.column(c).to_numpy() for c in ("r_t", "s_t"))
    # Straight from the contract, not from `interval`: the check must not share the mapping it checks.
    wr, ws = (int(spec.window.range_ms or 0) for spec in (r, s))
    inside = (st < rt + wr) & (rt < st + ws)
    return pair_columns(joined.filter(pa.array(inside)))


def pair_columns(table: pa.Table) -> pa.Table:
    """`table`'s PAIR columns, as int64."""
    return table.select(list(PAIR)).cast(pa.schema([(c, pa.int64()) for c in PAIR]))


def no_pairs() -> pa.Table:
    """An empty table of the PAIR columns."""
    return pa.table({c: pa.array([], pa.int64()) for c in PAIR})


def compare(expected: pa.Table, got: pa.Table) -> tuple[dict, pa.Table]:
    """Results `got` against the `expected` pair set (both with the PAIR columns): the counts of
    results, missing pairs, extra pairs (distinct ones outside the set) and duplicates (results
    beyond the first of their pair), and the missing pairs themselves."""
    keys = list(PAIR)
    distinct = got.group_by(keys).aggregate([])
    missing = expected.join(distinct, keys=keys, join_type="left anti")
    extra = distinct.join(expected, keys=keys, join_type="left anti").num_rows
    duplicates = got.num_rows - distinct.num_rows
    return {"results": got.num_rows, "missing": missing.num_rows, "extra": extra, "duplicates": duplicates}, missing


def newer_arrived_first(job: JobSettings, tables: dict[str, pa.Table], pairs: pa.Table) -> int:
    """How many of `pairs` have their newer member (event time) no later in Kafka-timestamp order
    (the exported `arrival_ms`) than the older one: the pairs Quix's look-back cannot find."""
    for spec in job.streams:
        side = _pairs_side(tables[spec.name], spec.name, spec.time_field)
        pairs = pairs.join(side, keys=[f"{spec.name}_partition", f"{spec.name}_offset"])
    rt, st, ra, sa = (pairs.column(c).to_numpy() for c in ("r_t", "s_t", "r_arrival", "s_arrival"))
    return int((((rt > st) & (ra <= sa)) | ((st > rt) & (sa <= ra))).sum())


def _pairs_side(table: pa.Table, stream: str, time_field: str) -> pa.Table:
    """A stream's identity, event time and arrival, named as in the pair tables, as int64."""
    names = [f"{stream}_partition", f"{stream}_offset", f"{stream}_t", f"{stream}_arrival"]
    side = table.select(["partition", "offset", time_field, ARRIVAL]).rename_columns(names)
    return side.cast(pa.schema([(n, pa.int64()) for n in names]))


def read_json(cluster: kafka.Cluster, topic: str, partitions: int, timestamps: bool = False) -> pa.Table | None:
    """Every JSON record in `topic` as a table (read_committed, to its true end), with each record's
    Kafka timestamp as TIMESTAMP_MS if `timestamps`; None if it holds none."""
    records = kafka.read_partitions(cluster, topic, dict.fromkeys(range(partitions), 0), f"{topic}-read")
    if not records:
        return None
    table = pajson.read_json(io.BytesIO(b"\n".join(map(Message.value, records))))
    if timestamps:
        table = table.append_column(TIMESTAMP_MS, pa.array([m.timestamp()[1] for m in records], pa.int64()))
    return table


def read_output(cluster: kafka.Cluster, topic: str, partitions: int) -> pa.Table:
    """The pair columns of every result in `topic`."""
    table = read_json(cluster, topic, partitions)
    return no_pairs() if table is None else pair_columns(table)


def run_quix(job: JobSettings, tables: dict[str, pa.Table], cluster: kafka.Cluster, workdir: Path,
             expected: int, timeout: float = 1800, consumer: dict | None = None) -> dict:
    """Runs the Quix job on the job's input topics and judges its output.

    `tables`: the exported inputs (their rows are the input, and the rule's pair set is drawn from
    them); `expected`: the verified result count, which the rule's pair set must match; `workdir`:
    scratch space; `timeout`: seconds the job may take; `consumer`: consumer settings over
    _CONSUMER's (bench equijoin --quick: a shorter session, as Tansu's group join waits about
    half of it)."""
    python = quix_python()
    if python is None:
        return {"ran": False, "why": f"{PYTHON_ENV} is not set and {DEFAULT_PYTHON} does not exist: Quix Streams "
                                     "needs its own venv (ops/setup.sh makes it)"}
    why = unsupported(job)
    if why is not None:
        return {"ran": False, "why": why}
    inputs = sum(t.num_rows for t in tables.values())
    root = workdir / "quix"
    root.mkdir(parents=True, exist_ok=True)
    spec = job_spec(job, cluster, inputs, root, consumer)
    spec_path = root / f"{spec['group']}.json"
    spec_path.write_text(json.dumps(spec))
    try:
        done = subprocess.run([python, str(_JOB), str(spec_path)], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"ran": False, "why": f"the Quix job did not drain the input within {timeout:.0f}s"}
    if done.returncode != 0:
        return {"ran": False, "why": f"the Quix job failed ({done.returncode}): {done.stderr[-2000:]}"}
    out = json.loads(done.stdout.strip().splitlines()[-1])
    pairs = rule_pairs(job, tables)
    judged, missing = compare(pairs, read_output(cluster, spec["output"], job.partitions))
    # The rule's pair set stands in for the verified results only when it has their count.
    agrees = pairs.num_rows == expected
    exact = agrees and judged["missing"] == judged["extra"] == judged["duplicates"] == 0
    return {"ran": True, "tuples": inputs, "tuples_per_s": inputs / out["seconds"], **out, **judged,
            "expected": expected, "rule_pairs": pairs.num_rows, "rule_matches_verified": agrees, "exact": exact,
            "missing_newer_arrived_first": newer_arrived_first(job, tables, missing),
            "how": how(spec)}


def how(spec: dict) -> str:
    """What ran, for the report."""
    bounds = spec["interval"]
    return (f"quixstreams Application, exactly-once, fresh group from the earliest offsets of the input topics, "
            f"event time from the JSON time field; r.join_interval(s, how='inner', backward_ms="
            f"{bounds['backward_ms']}, forward_ms={bounds['forward_ms']}, grace_ms={bounds['grace_ms']}); "
            "results as JSON to their own topic, judged by their (partition, offset) pairs against the window "
            "rule's pair set. Quix only looks back in event time from each record and orders its reads by "
            "Kafka timestamp: missing_newer_arrived_first counts the missing pairs whose newer member came "
            "first in that order")
