"""The as-of bench's peers, run on the input our fleet joined and judged against the oracle's
pairs (asof_workload.expected_pairs):

  quix     Quix Streams' `join_asof` (bench/peers/quix_asof_job.py) from its own venv, reading
           the same topics: it joins each order, when it processes it, with the newest row of
           its customer at or before the order's time among the rows processed so far; it reads
           the topics in Kafka-timestamp order, so a row that arrives after an order it is valid
           for is not there yet, and the order is joined with an older row (or none).
  pyflink  PyFlink's event-time temporal join (bench/peers/pyflink_asof_job.py) from the venv
           STREAMJOIN_PYFLINK_PYTHON names, on CSV files of the exported inputs, each file's Kafka
           partitions merged by their progress in event time (pyflink_peer.write_sides), so that
           no row is behind its file's watermark.

Both are launched as their window-join counterparts are (bench/peers/quix_peer.py,
pyflink_peer.py), with those modules' venv look-up, consumer settings and CSV writer.

A peer's results are compared with the oracle's pairs by both inputs' (partition, offset):
bench/pairs.py's missing, extra and duplicates, and `wrong_version`: orders whose one result
names another row than the valid one (or none where there is one, or one where there is
none); and `missing_row_arrived_later`: the missing pairs whose row reached Kafka no earlier
than their order.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from streamjoin.bench import pairs
from streamjoin.bench.asof_workload import PAIR, STREAM, TABLE, spec_of
from streamjoin.bench.inputs import ARRIVAL
from streamjoin.bench.peers import pyflink_peer, quix_peer
from streamjoin.services.io import kafka
from streamjoin.settings import JobSettings

_PAIR_SCHEMA = pairs.schema(PAIR)
_QUIX_JOB = Path(__file__).with_name("peers") / "quix_asof_job.py"
_PYFLINK_JOB = Path(__file__).with_name("peers") / "pyflink_asof_job.py"


def judge(expected: pa.Table, got: pa.Table, tables: dict[str, pa.Table]) -> dict:
    """`got`'s results against the `expected` pairs (both PAIR columns): pairs.judge's counts and
    `wrong_version`, and of the missing pairs those whose row reached Kafka no earlier than
    their order (`tables`: the exported inputs, arrival_ms)."""
    counts, missing, extra = pairs.judge(expected, got, PAIR)
    orders = list(PAIR[:2])
    wrong = missing.select(orders).join(extra.select(orders).group_by(orders).aggregate([]), keys=orders,
                                        join_type="inner")
    return counts | {"wrong_version": wrong.num_rows, "missing_row_arrived_later": row_arrived_later(missing, tables)}


def row_arrived_later(pairs: pa.Table, tables: dict[str, pa.Table]) -> int:
    """How many of `pairs` name a row whose Kafka timestamp is no earlier than their order's: a
    row that a reader in Kafka-timestamp order had not yet seen when it joined the order."""
    for name, prefix in ((STREAM, "stream"), (TABLE, "table")):
        side = tables[name].select(["partition", "offset", ARRIVAL])
        side = side.rename_columns([f"{prefix}_partition", f"{prefix}_offset", f"{prefix}_arrival"]).cast(
            pa.schema([(f"{prefix}_{c}", pa.int64()) for c in ("partition", "offset", "arrival")]))
        pairs = pairs.join(side, keys=[f"{prefix}_partition", f"{prefix}_offset"], join_type="inner")
    later = pc.greater_equal(pairs["table_arrival"], pairs["stream_arrival"])
    return int(pc.sum(later).as_py() or 0)


def read_topic_pairs(cluster: kafka.Cluster, topic: str, partitions: int) -> pa.Table:
    """The PAIR columns of every JSON result in `topic` (read_committed, to its true end)."""
    results = quix_peer.read_json(cluster, topic, partitions)
    return _PAIR_SCHEMA.empty_table() if results is None else results.select(list(PAIR)).cast(_PAIR_SCHEMA)


# ---------------------------------------------------------------- Quix Streams


def run_quix(job: JobSettings, tables: dict[str, pa.Table], cluster: kafka.Cluster, workdir: Path,
             expected: pa.Table, grace_ms: int, consumer: dict, timeout: float = 1800) -> dict:
    """Quix's `join_asof` on the job's topics (`tables`: the exported inputs, how many records it
    must process), judged against `expected`; `grace_ms`: how long its store keeps a row behind
    the customer's newest; `consumer`: consumer settings over quix_peer's own."""
    python = quix_peer.quix_python()
    if python is None:
        return {"ran": False, "why": f"{quix_peer.PYTHON_ENV} is not set and {quix_peer.DEFAULT_PYTHON} does not "
                                     "exist: Quix Streams needs its own venv (ops/setup.sh makes it)"}
    inputs = sum(t.num_rows for t in tables.values())
    root = workdir / "quix-asof"
    root.mkdir(parents=True, exist_ok=True)
    run = uuid.uuid4().hex[:8]
    sides = {name: {"name": name, "topic": job.topic_of(spec_of(job, name)),
                    "time_field": spec_of(job, name).time_field} for name in (STREAM, TABLE)}
    spec = {"bootstrap": cluster.bootstrap, "group": f"{job.job}-quix-{run}", "inputs": inputs,
            "stream": sides[STREAM], "table": sides[TABLE], "how": job.join.type, "grace_ms": grace_ms,
            "output": f"{job.job}.quix-results-{run}", "partitions": job.partitions,
            "state_dir": str(root / f"state-{run}"), "consumer_config": quix_peer._CONSUMER | consumer}
    spec_path = root / f"{spec['group']}.json"
    spec_path.write_text(json.dumps(spec))
    try:
        done = subprocess.run([python, str(_QUIX_JOB), str(spec_path)], capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"ran": False, "why": f"the Quix job did not drain the input within {timeout:.0f}s"}
    if done.returncode != 0:
        return {"ran": False, "why": f"the Quix job failed ({done.returncode}): {done.stderr[-2000:]}"}
    out = json.loads(done.stdout.strip().splitlines()[-1])
    judged = judge(expected, read_topic_pairs(cluster, spec["output"], job.partitions), tables)
    return {"ran": True, "tuples": inputs, "tuples_per_s": inputs / out["seconds"], **out, **judged,
            "expected": expected.num_rows,
            "how": f"quixstreams Application, exactly-once, fresh group from the earliest offsets of both topics, "
                   f"event time from the JSON time field; orders.join_asof(customers, how='{job.join.type}', "
                   f"grace_ms={grace_ms}) (a grace covering the whole run: no row expires before an order needs "
                   "it); results as JSON naming both inputs, judged against the oracle's pairs"}


# ---------------------------------------------------------------- PyFlink


def run_pyflink(job: JobSettings, tables: dict[str, pa.Table], workdir: Path, expected: pa.Table,
                parallelism: int = 2) -> dict:
    """PyFlink's event-time temporal join on CSV files of `tables`, judged against `expected`;
    reported as not run, and why, unless STREAMJOIN_PYFLINK_PYTHON names its venv."""
    if (missing := pyflink_peer.not_installed()) is not None:
        return missing
    root = workdir / "pyflink-asof"
    sides = pyflink_peer.write_sides(job, tables, root, parallelism)
    spec = {"parallelism": parallelism, "stream": sides[STREAM], "table": sides[TABLE], "how": job.join.type,
            "key": spec_of(job, TABLE).key_fields[0], "out": str(root / "out")}
    out = pyflink_peer.run_job(_PYFLINK_JOB, spec, root, sum(t.num_rows for t in tables.values()))
    if not out["ran"]:
        return out
    judged = judge(expected, pairs.read_csv(root / "out" / "results", PAIR, PAIR), tables)
    return {**out, **judged, "behind_file_watermark": pyflink_peer.behind(sides), "expected": expected.num_rows,
            "how": f"Flink SQL event-time temporal join (streaming mode), CSV file sources with watermark "
                   f"{job.join.allowed_lateness_ms} ms (rows in event-time order per Kafka partition, partitions "
                   f"merged by their progress: behind_file_watermark counts rows late in their file), customers with PRIMARY KEY (a versioned table): orders "
                   f"{'LEFT ' if job.join.type == 'left' else ''}JOIN customers FOR SYSTEM_TIME AS OF the order's "
                   "time; results as CSV naming both inputs, judged against the oracle's pairs; throughput over "
                   "the job's seconds less an empty job's"}
