"""Pathway's `interval_join` on the same input topics: a Rust dataflow
engine (timely/differential dataflow) driven from Python, reading the topics
our workers read with its own Kafka connector (librdkafka). Its pins clash
with ours, so it runs from its own venv, named by STREAMJOIN_PATHWAY_PYTHON;
without it the peer reports why it did not run.

Our window rule, for r and s with equal keys: s.t < r.t + W_r and
r.t < s.t + W_s. Pathway joins r and s when r.t + lower <= s.t <= r.t +
upper, so with integer milliseconds lower = -(W_s - 1) and upper = W_r - 1
is the rule exactly. With no temporal behaviour Pathway keeps every row and
drops nothing as late, whatever order it reads the partitions in, so it can
be exact; it is judged, not assumed: the results' (partition, offset) pairs
against the rule's pair set, and every retraction (a row with diff -1, which
an exact run of an inner join on growing inputs never needs) counted.

Two figures, each measured as ours is (bench/ours.replay), from the epoch
second before the process is launched, input already in Kafka:

- cold start: the input over the seconds to the last result written. For
  Pathway, the newest Kafka timestamp among its results (librdkafka stamps a
  record as Pathway's sink produces it; Tansu keeps no log-append time); for
  ours, the poll of committed offsets (every 0.5 s) that sees every input
  committed with its results, which can only come later than our last result.
- steady state: `report.sustained_rate` over progress samples (seconds since
  launch, inputs done) between 10% and 90% of the input, start-up and tail
  left out. Ours counts committed input offsets; Pathway counts the inputs
  whose results its dataflow has handed to its sinks (pathway_job.py, one
  sample per Pathway time). Its Kafka sink writes them a little later, which
  is in Pathway's favour.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from streamjoin.bench.peers import quix_peer
from streamjoin.bench.report import sustained_rate
from streamjoin.services.io import kafka
from streamjoin.settings import JobSettings
from streamjoin.topology.topics import TopicPlan, create_missing

PYTHON_ENV = "STREAMJOIN_PATHWAY_PYTHON"
VERSION = "0.33.0"  # the version these figures were taken with (docs/benchmarks/index.md installs it)
_JOB = Path(__file__).with_name("pathway_job.py")
# Tansu holds a consumer group's join for about half the session timeout (librdkafka's default: 45 s).
_CONSUMER = {"session.timeout.ms": 3_000, "heartbeat.interval.ms": 500}


def interval(job: JobSettings) -> dict[str, int]:
    """interval_join's closed bounds on s.t - r.t for our rule on the job's two RANGE windows."""
    r, s = (int(spec.window.range_ms or 0) for spec in job.streams)
    return {"lower": -(s - 1), "upper": r - 1}


def job_spec(job: JobSettings, cluster: kafka.Cluster, inputs: int, threads: int) -> dict:
    """What pathway_job.py runs: `inputs` is how many records the input topics hold (the job stops
    there), `threads` Pathway's worker threads; the group and the output topic are fresh per call.
    Pathway commits what its readers have read as a new time every batch interval of the job."""
    run = uuid.uuid4().hex[:8]
    return {"bootstrap": cluster.bootstrap, "group": f"{job.job}-pathway-{run}", "inputs": inputs,
            "streams": [{"name": s.name, "topic": job.topic_of(s), "time_field": s.time_field,
                         "key_fields": list(s.key_fields), "fields": dict(s.fields)} for s in job.streams],
            "interval": interval(job), "output": f"{job.job}.pathway-results-{run}", "partitions": job.partitions,
            "threads": threads,
            "autocommit_ms": job.worker.batch_ms, "consumer_config": _CONSUMER, "producer_config": {}}


def judge_rows(table: pa.Table | None) -> tuple[pa.Table, int, float | None]:
    """Pathway's output rows (its JSON records with their Kafka timestamps, quix_peer.read_json):
    the pair columns of the results (rows with diff +1), how many rows retract one (diff -1), and
    the epoch seconds of the last row written (its Kafka timestamp, set as Pathway's sink produced it)."""
    if table is None:
        return quix_peer.no_pairs(), 0, None
    added = pc.equal(table.column("diff"), 1)
    last = pc.max(table.column(quix_peer.TIMESTAMP_MS)).as_py()
    return (quix_peer.pair_columns(table.filter(added)), table.num_rows - int(pc.sum(added).as_py() or 0),
            last / 1000 if last is not None else None)


def figures(out: dict, launched: float, last_written: float, inputs: int) -> dict:
    """The job's report as figures, in seconds since `launched` (epoch seconds before the process
    started): to its first input counted, to every result handed to its sinks, to its last result
    written (`last_written`, epoch seconds), and the two throughputs."""
    samples = [(t - launched, n) for t, n in [(launched, 0), *out["samples"]]]
    wall = last_written - launched
    return {"startup_seconds": out["first"] - launched, "results_out_seconds": out["done"] - launched,
            "wall_seconds": wall, "cold_start_tuples_per_s": inputs / wall, "tuples_per_s": sustained_rate(samples)}


def run_pathway(job: JobSettings, tables: dict[str, pa.Table], cluster: kafka.Cluster, workdir: Path,
                expected: int, threads: int = 1, timeout: float = 1800) -> dict:
    """Runs the Pathway job on the job's input topics and judges its output.

    `tables`: the exported inputs (their rows are the input, and the rule's pair set is drawn from
    them); `expected`: the verified result count, which the rule's pair set must match; `workdir`:
    scratch space; `threads`: Pathway's worker threads; `timeout`: seconds the job may take."""
    python = os.environ.get(PYTHON_ENV)
    if not python:
        return {"ran": False, "why": f"{PYTHON_ENV} is not set: Pathway needs its own venv (see "
                                     "docs/benchmarks/index.md)"}
    why = quix_peer.unsupported(job, "Pathway")
    if why is not None:
        return {"ran": False, "why": why}
    inputs = sum(t.num_rows for t in tables.values())
    if not inputs:
        return {"ran": False, "why": "the input topics hold no records"}  # the job would wait for them for good
    root = workdir / "pathway"
    root.mkdir(parents=True, exist_ok=True)
    spec = job_spec(job, cluster, inputs, threads)
    (root / f"{spec['group']}.json").write_text(json.dumps(spec))
    create_missing(cluster.admin(), [TopicPlan(spec["output"], "results", job.partitions, -1, {})])
    launched = time.time()
    try:
        out = _run_job(python, spec, cluster, root / f"{spec['group']}.log", launched + timeout)
    except RuntimeError as e:
        return {"ran": False, "why": str(e)}
    pairs = quix_peer.rule_pairs(job, tables)
    got, retracted, last_written = judge_rows(quix_peer.read_json(cluster, spec["output"], job.partitions, True))
    if last_written is None:
        return {"ran": False, "why": f"the Pathway job wrote no result to {spec['output']}"}
    judged, _ = quix_peer.compare(pairs, got)
    # The rule's pair set stands in for the verified results only when it has their count.
    agrees = pairs.num_rows == expected
    exact = agrees and judged["missing"] == judged["extra"] == judged["duplicates"] == retracted == 0
    return {"ran": True, "tuples": inputs, "processed": out["processed"], **figures(out, launched, last_written, inputs),
            **judged, "retracted": retracted, "expected": expected, "rule_pairs": pairs.num_rows,
            "rule_matches_verified": agrees, "exact": exact, "threads": out["threads"], "version": out["version"],
            "samples": len(out["samples"]), "how": how(spec)}


def _run_job(python: str, spec: dict, cluster: kafka.Cluster, log: Path, deadline: float) -> dict:
    """Run pathway_job.py on `spec` (its log to `log`) until it has handed every result to its sink,
    let it run until the output topic holds them all, interrupt it and return its report; raises
    RuntimeError when it fails or passes the `deadline` (epoch seconds)."""
    with log.open("w") as err:
        proc = subprocess.Popen([python, str(_JOB), str(Path(log).with_suffix(".json"))], stdout=subprocess.PIPE,
                                stderr=err, text=True)
        try:
            results = json.loads(_next_line(proc, deadline))["results"]
            topic = [(spec["output"], p) for p in range(spec["partitions"])]
            while sum(kafka.end_offsets(cluster, topic, f"{spec['output']}-probe").values()) < results:
                if time.time() > deadline:
                    raise RuntimeError(f"the Pathway job did not write its {results} results in time")
                time.sleep(0.2)
            proc.send_signal(signal.SIGINT)
            report = _next_line(proc, deadline)
            if proc.wait(max(1.0, deadline - time.time())) != 0:
                raise RuntimeError(f"the Pathway job failed ({proc.returncode}): {log.read_text()[-2000:]}")
            return json.loads(report)
        except subprocess.TimeoutExpired:
            raise RuntimeError("the Pathway job did not stop in time") from None
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _next_line(proc: subprocess.Popen, deadline: float) -> str:
    """The job's next stdout line; RuntimeError if it exits first or the `deadline` passes."""
    assert proc.stdout is not None
    while time.time() < deadline:
        if select.select([proc.stdout], [], [], min(1.0, max(0.0, deadline - time.time())))[0]:
            line = proc.stdout.readline()
            if line:
                return line
            raise RuntimeError(f"the Pathway job exited ({proc.wait()}) before its report")
    raise RuntimeError("the Pathway job did not drain the input in time")


def how(spec: dict) -> str:
    """What ran, for the report."""
    bounds = spec["interval"]
    return (f"Pathway {spec['threads']} thread(s), pw.io.kafka.read (streaming, JSON, with_metadata) of the input "
            f"topics from the earliest offsets under a fresh group, a new Pathway time every "
            f"{spec['autocommit_ms']} ms; stopped once its output topic holds every result; r.interval_join(s, r.t, s.t, pw.temporal.interval({bounds['lower']}, "
            f"{bounds['upper']}), r.k == s.k), no temporal behaviour (no cutoff: nothing dropped as late); every "
            "column as JSON to its own topic (pw.io.kafka.write), judged by (partition, offset) pairs against the "
            "window rule's pair set, retractions counted")
