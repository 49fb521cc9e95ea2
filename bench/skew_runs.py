"""One case of the skew bench (bench/skew.py): our runs of the unsplit and the split job on
the case's input, and the peers on the same input.

  backlog  a fresh fleet drains the case's preloaded input as a backlog, with each run's
           coordinator settings; Spark verify checks the unsplit run's output exact, and the split
           run's must equal it id for id (the same input topics give the same result ids).
           Throughput is read from the committed offsets (sampled every 0.5 s) between
           `steady_from` and 90% of the input: `steady_from` is the share of the input committed
           when the split run's first key was split (at least 10%), the same share for both runs,
           so the detection phase is left out of both and both are measured over the same stretch
           of the input.
  live     then a fleet joins the input as a paced producer writes it (bench/paced.py, event time
           = arrival time) at a share of the unsplit drain's rate; Spark `verify` checks the whole
           output exact and gives the production delay percentiles (produced_ms minus the Kafka
           timestamp of the result's newest input).
  peers    the backlog exported from the topics (bench/inputs.py): Spark Structured Streaming's
           stream-stream join on Parquet files of it (bench/peers/spark_peer.py's backlog run) and
           PyFlink's interval join on CSV files (bench/peers/pyflink_peer.py); each one's result
           count against the verified one, and its throughput.

Every run also reports the keys the coordinator logged hot, the split episodes its workers'
heartbeats say their groups applied (and when), and the workers' splitting counters.
"""

from __future__ import annotations

import time
from datetime import datetime

import numpy as np

from streamjoin.bench import ours, report
from streamjoin.bench.adapt_fleet import constant, log_events
from streamjoin.bench.env import BenchEnv
from streamjoin.bench.inputs import export_inputs
from streamjoin.bench.paced import PacedInput
from streamjoin.bench.peers import pyflink_peer, spark_peer
from streamjoin.bench.skew_workload import Case, SkewPlan
from streamjoin.launcher import Fleet, wait_drained
from streamjoin.services.coordinator.status import heartbeats_since
from streamjoin.services.io import kafka
from streamjoin.services.io.kafka import Cluster
from streamjoin.settings import JobSettings

HOT_KEY_EVENT = "hot key"  # the coordinator's log event when a key turns hot (services/coordinator/hot_keys.py)
# The workers' tuples of split hot keys sent to the slots, by kind: fragmented (the spread
# stream's share) and replicated (the other stream's, to every slot).
SPLIT_SENT = "streamjoin_split_sent_tuples_total"
SPLIT_IN_EFFECT = "split"  # a heartbeat's phase of a split episode its group has applied
STEADY_FROM = 0.1  # the least share of the input committed before throughput is measured


def live_run(env: BenchEnv, job: JobSettings, workers: int, rate: float, seconds: float) -> dict:
    """`job` on a fleet of `workers` fed at `rate` tuples/s per stream for `seconds`: Spark
    verify's verdict and delays, the hot keys the coordinator reported, the splitting counters."""
    fleet, ids = ours.start_fleet(env, job, workers)
    feed = PacedInput(job, env.bootstrap, constant(rate), seed=job.workload.random_state)
    began_ms = int(time.time() * 1000)
    feed.start()
    time.sleep(seconds)  # the input's length, not a wait for a condition: the drain below waits for one
    feed.stop()
    written_s = time.time() - began_ms / 1000
    wait_drained(job, env.bootstrap, fleet, timeout=max(300.0, 10 * seconds))
    counters = split_counters(fleet, ids, written_s)
    restarts, verdict = ours.drained_and_verified(env, job, fleet, seconds, job.job)
    return {"job": job.job, "workers": workers, "inputs": feed.tuples,
            "rate_per_stream": feed.tuples / len(job.streams) / written_s, "seconds": round(written_s, 2),
            "restarts": restarts, "hot_keys": hot_keys(fleet, began_ms), "splits": splits(env, job, began_ms),
            "split": counters, "verify": {k: verdict.get(k) for k in ours.VERIFY_KEYS}}


def splits(env: BenchEnv, job: JobSettings, since_ms: int) -> list[dict]:
    """Each split episode of the run from `since_ms` on: the worker whose group applied it and
    when, in seconds after `since_ms`, as the first of its heartbeats that says so."""
    beats = heartbeats_since(job, env.cluster, time.time() - since_ms / 1000 + 5)
    first: dict[int, dict] = {}
    for beat in sorted(beats, key=lambda b: b.wall_ms):
        for episode, phase in beat.splits.items():
            if phase == SPLIT_IN_EFFECT and episode not in first and beat.wall_ms >= since_ms:
                first[episode] = {"episode": episode, "worker": beat.worker,
                                  "after_s": round((beat.wall_ms - since_ms) / 1000, 2)}
    return sorted(first.values(), key=lambda e: e["after_s"])


def hot_keys(fleet: Fleet, since_ms: int) -> list[dict]:
    """The coordinator's `hot key` events: each key, its group and share, seconds after `since_ms`."""
    return [{"key": e.get("key"), "group": e.get("group"), "share": e.get("share"), "worker": e.get("worker"),
             "after_s": _after_s(e, since_ms)} for e in log_events(fleet, HOT_KEY_EVENT)]


def _after_s(event: dict, since_ms: int) -> float | None:
    stamp = event.get("timestamp")
    if not stamp:
        return None
    return round(datetime.fromisoformat(stamp).timestamp() - since_ms / 1000, 2)


def split_counters(fleet: Fleet, workers: list[str], seconds: float) -> dict:
    """What the fleet's groups sent their slots over a run of `seconds`: tuples by kind (the
    workers' counters), and the bytes of every record on the job's split topic (read back), in
    all and per second."""
    sent: dict[str, float] = {}
    for w in workers:
        for key, value in ours.scrape_counters(fleet.metrics_ports[w], [SPLIT_SENT], by="kind").items():
            kind = key.split(":", 1)[1]
            sent[kind] = sent.get(kind, 0.0) + value
    split_bytes = _topic_bytes(fleet.job, Cluster(fleet.bootstrap)) if fleet.job.slots else 0
    out = {f"{kind}_tuples": int(n) for kind, n in sorted(sent.items())} | {"split_topic_bytes": split_bytes}
    per_s = {f"{k}_per_s": v / seconds for k, v in out.items()} if seconds > 0 else {}
    return out | per_s


def _topic_bytes(job: JobSettings, cluster: Cluster) -> int:
    """Bytes of the values on the job's split topic, every partition from the start."""
    records = kafka.read_partitions(cluster, job.split_topic, dict.fromkeys(range(len(job.slots)), 0),
                                    f"{job.consumer_group}-bench-split")
    return sum(len(m.value() or b"") for m in records)


def backlog_run(env: BenchEnv, source: JobSettings, workers: int, run: str,
                coordinator: dict) -> tuple[dict, np.ndarray]:
    """`source`'s input drained as a backlog by a fresh fleet with `coordinator` settings, as job
    `<source>-backlog-<run>`: its figures with its progress samples (`progress`, for `steady`) and
    its result ids."""

    def observe(fleet: Fleet, samples: list[tuple[float, float]], began_s: float) -> dict:
        ids = [w for w in fleet.metrics_ports if w.startswith("worker-")]
        since_ms = int(began_s * 1000)
        seconds = samples[-1][0] if samples else 0.0
        return {"progress": list(samples), "split": split_counters(fleet, ids, seconds),
                "hot_keys": hot_keys(fleet, since_ms),
                "splits": splits(env, fleet.job, since_ms)}

    return ours.replay(env, source, workers, name=backlog_name(source, run), coordinator=coordinator, observe=observe)


def backlog_name(source: JobSettings, run: str) -> str:
    return f"{source.job}-backlog-{run}"


def verify_backlog(env: BenchEnv, source: JobSettings, workers: int, run: str, coordinator: dict) -> dict:
    """Spark verify's verdict on the backlog run `run` of `source` (backlog_run's job)."""
    from streamjoin.services.spark.verify import run_verify

    job = ours.replay_job(env, source, workers, name=backlog_name(source, run), coordinator=coordinator)
    with env.phase(f"Spark verify of {job.job}"):
        verdict = run_verify(job, env.cluster)
    return {k: verdict.get(k) for k in ours.VERIFY_KEYS}


def steady(runs: dict[str, dict], split_s: float | None) -> float:
    """Each run's `tuples_per_s_steady` (and `steady_from`) between the same share of its input and
    90%: the share the split run had committed `split_s` seconds after its start (None: no split,
    STEADY_FROM); pops the runs' progress samples. Returns that share."""
    split_run = runs.get("split")
    share = STEADY_FROM
    if split_s is not None and split_run is not None:
        t = np.array([s for s, _ in split_run["progress"]])
        done = np.array([n for _, n in split_run["progress"]])
        at = int(np.searchsorted(t, split_s, side="left"))
        if at < len(done) and done[-1] > 0:
            share = max(STEADY_FROM, float(done[at] / done[-1]))
    for r in runs.values():
        samples = r.pop("progress")
        r["steady_from"] = share
        r["tuples_per_s_steady"] = report.sustained_rate(samples, share, 0.9) if share < 0.9 else None
    return share


def peers(env: BenchEnv, job: JobSettings, plan: SkewPlan, case: Case, expected: int, pyflink: bool) -> dict:
    """Spark (and, with `pyflink`, PyFlink) on `job`'s input exported from the topics, each
    judged by its result count against the verified `expected`."""
    workdir = env.workdir / f"peers-{case.name}"
    with env.phase(f"exporting {case.name}'s input for the peers"):
        tables = export_inputs(env.spark, job, env.cluster)
    ms = job.worker.batch_ms
    slices = {s.name: spark_peer.Slices.cut(tables[s.name], s.time_field, ms, [0]) for s in job.streams}
    with env.phase(f"Spark peer on {case.name}, backlog"):
        spark = spark_peer.run_backlog(env.spark, job, slices, spark_peer.key_equality(job), workdir / "spark",
                                       plan.spark_files_per_trigger)
    spark |= {"exact": spark["results"] == expected, "expected": expected,
              "how": f"Structured Streaming stream-stream inner join on Parquet file sources (a file per stream per "
                     f"{ms} ms of event time, {plan.spark_files_per_trigger} files per trigger), watermark "
                     f"{job.join.allowed_lateness_ms} ms, condition k = k and t_s < t_r + W and t_r < t_s + W"}
    if not pyflink:
        flink = {"ran": False, "why": "run on the headline case only (each run starts its own JVM)"}
    else:
        with env.phase(f"PyFlink peer on {case.name} (if STREAMJOIN_PYFLINK_PYTHON names its venv)"):
            flink = pyflink_peer.run_pyflink(job, tables, workdir)
        if flink["ran"]:
            flink["exact"] = flink["results"] == expected
    return {"spark": spark, "pyflink": flink}

