"""The equijoin bench's left-join figure (join.type left): what deciding
unmatched rows costs, and how long past its deadline an unmatched row comes out.

A left join emits every inner result, and each row of the first stream that
no partner joined, null-padded, once the watermark passes its deadline: its
event time + window + allowed lateness. So the run must be longer than that
for rows to be decided inside it (the staircase's 10-minute window never
expires within the sweep, so this run has its own window).

  live     a fresh 1-worker left-join fleet on fresh input of the same
           workload (generator, skew, tuple size; the domain sized for this
           run as for the sweep), written by Spark `sources` at one rate with
           event time the wall clock; Spark `verify` checks it exact and
           measures each unmatched row's delay, produced_ms minus its deadline
           (`unmatched_delay_ms`).
  replays  the live run's input topics drained as a backlog by a left-join
           fleet and an inner-join fleet: throughput of both on the same
           topics. The left replay must equal the verified live output id for
           id; the inner one, that output less its rows alone.
  Spark    Structured Streaming's stream-stream left outer join (watermarks
           and the time-interval condition make it possible) on the exported
           input: backlog throughput, and, paced like the live run, the delay
           of its null rows past the same deadline on the replay's clock.
           Its matched rows must be exactly the inner results; its null rows
           depend on its single global watermark and are reported as counted.

Both delays are past a deadline in event time, so both include how long after
its event time a tuple reached Kafka (`input_arrival_lag_ms`: Spark `sources`
writes a micro-batch of event time after it ends).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from streamjoin.bench import ours
from streamjoin.bench.env import BenchEnv
from streamjoin.bench.inputs import ARRIVAL, export_inputs
from streamjoin.bench.peers import spark_peer
from streamjoin.bench.report import delay_stats, ratio
from streamjoin.settings import JobSettings

# The verify report's fields a left-join run keeps (beside ours.VERIFY_KEYS).
OUTER_KEYS = ("join_type", "unmatched", "unmatched_delay_ms")


@dataclass(frozen=True)
class LeftPlan:
    window_ms: int
    rate: float  # tuples/s per stream of the live run
    seconds: float  # the live run: longer than window + lateness, so rows are decided inside it
    spark_files_per_trigger: int  # Spark backlog micro-batch, as the inner peer's


# ---------------------------------------------------------------- ours


def run_live(env: BenchEnv, job: JobSettings, plan: LeftPlan) -> dict:
    """The left-join fleet on fresh input at `plan.rate` for `plan.seconds`; Spark `verify`'s
    report (exact, unmatched rows and their delay past the deadline) and when the run began."""
    return ours.run_live(env, job, 1, plan.rate, plan.seconds, "the left-join run", OUTER_KEYS)


def run_replays(env: BenchEnv, job: JobSettings, live: dict) -> dict:
    """Left and inner backlog replays of the live run's topics, each checked against its verified output."""
    with env.phase("our backlog replay of the left-join input, left join"):
        left = ours.run_replay(env, job, 1)
    with env.phase("our backlog replay of the left-join input, inner join"):
        inner, inner_ids = ours.replay(env, job, 1, join_type="inner")
    verified = ours.result_ids(env.cluster, job)
    unmatched = live["verify"]["unmatched"]
    # Every inner result is a left result (same refs, same id); the left output holds `unmatched` more.
    inside = _rows_in(inner_ids, verified)
    inner["left_output_less_unmatched"] = bool(inside.all() and len(verified) - len(inner_ids) == unmatched)
    return {"left": left, "inner": inner}


def _rows_in(ids: np.ndarray, within: np.ndarray) -> np.ndarray:
    """Mask of the (hi, lo) rows of `ids` found in `within`."""
    keys = {(int(hi), int(lo)) for hi, lo in within}
    return np.array([(int(hi), int(lo)) in keys for hi, lo in ids], bool)


# ---------------------------------------------------------------- Spark's left outer join


@dataclass
class LeftSink(spark_peer.Sink):
    """A left outer join's batches: matched rows counted and timed as Sink does, the first
    stream's null rows (no partner) counted apart and, with `after_ms` (window + lateness),
    timed past their deadline on the release clock: when the driver holds the row minus its
    event time shifted by its release's lag behind its arrival, plus `after_ms`."""

    time_field: str = field(kw_only=True)  # the first stream's event-time column
    after_ms: int | None = None  # None: null rows not timed (a backlog has no release clock)
    nulls: int = 0
    null_delays: list[np.ndarray] = field(default_factory=list)

    def take(self, out: pa.Table, held_ms: float) -> None:
        absent = out.column(f"{self.names[-1]}_partition").is_null()
        super().take(out.filter(pc.invert(absent)), held_ms)
        first = self.names[0]
        # The paced run's warm-up rows (step -1) join nothing by design: not the workload's.
        alone = out.filter(pc.and_(absent, pc.greater_equal(out.column(f"{first}_{spark_peer.STEP}"), 0)))
        self.nulls += alone.num_rows
        if self.after_ms is None or not alone.num_rows:
            return
        lag = alone.column(f"{first}_{spark_peer.RELEASED}").to_numpy() - alone.column(f"{first}_{ARRIVAL}").to_numpy()
        deadline = alone.column(f"{first}_{self.time_field}").to_numpy() + lag + self.after_ms
        self.null_delays.append(held_ms - deadline)


def arrival_lag(job: JobSettings, tables: dict[str, pa.Table]) -> dict:
    """How long after its event time a tuple of the first stream reached Kafka (ms): part of
    every delay past a deadline, ours and Spark's alike, since a deadline is in event time."""
    first = job.streams[0]
    lag = tables[first.name].column(ARRIVAL).to_numpy() - tables[first.name].column(first.time_field).to_numpy()
    p50, p99 = np.percentile(lag, [50, 99])
    return {"p50_ms": float(p50), "p99_ms": float(p99), "mean_ms": float(lag.mean())}


def run_spark(env: BenchEnv, job: JobSettings, tables: dict[str, pa.Table], live: dict, plan: LeftPlan,
              threshold_ms: float) -> dict:
    """Spark's left outer join on the live run's input (`tables`, as export_inputs gives them):
    backlog throughput and result counts, then the run replayed at its arrival pace for the
    delay of its null rows."""
    names = [s.name for s in job.streams]
    first = job.streams[0]
    ms, starts = job.worker.batch_ms, [live["began_ms"]]
    predicate = spark_peer.key_equality(job)
    by_time = {s.name: spark_peer.Slices.cut(tables[s.name], s.time_field, ms, starts) for s in job.streams}
    by_arrival = {s.name: spark_peer.Slices.cut(tables[s.name], ARRIVAL, ms, starts) for s in job.streams}
    backlog_sink = LeftSink(names, time_field=first.time_field)
    with env.phase("Spark left outer join, backlog"):
        backlog = spark_peer.run_backlog(env.spark, job, by_time, predicate, env.workdir / "spark-left",
                                         plan.spark_files_per_trigger, how="left_outer", sink=backlog_sink)
    paced_sink = LeftSink(names, time_field=first.time_field,
                          after_ms=first.window.range_ms + job.join.allowed_lateness_ms)
    with env.phase("Spark left outer join, paced like our live run"):
        paced = spark_peer.run_paced(env.spark, job, by_arrival, [{"rate_per_stream": live["rate_per_stream"]}],
                                     predicate, env.workdir / "spark-left", threshold_ms, how="left_outer",
                                     sink=paced_sink)
    inner_results = live["verify"]["expected"] - live["verify"]["unmatched"]
    null_delays = np.concatenate(paced_sink.null_delays) if paced_sink.null_delays else np.empty(0)
    return {**backlog, "matched_results": backlog["results"], "null_rows": backlog_sink.nulls,
            "exact_matches": backlog["results"] == inner_results, "expected_matches": inner_results,
            "paced": {**paced[0], "null_rows": paced_sink.nulls},
            "unmatched_delay": delay_stats(null_delays, threshold_ms),
            "how": f"Structured Streaming stream-stream left outer join on Parquet file sources (a file per stream "
                   f"per {ms} ms), watermark {job.join.allowed_lateness_ms} ms on both, condition k = k and "
                   "t_s < t_r + W and t_r < t_s + W; a null row comes out once Spark's global watermark passes "
                   "t_r + W, as ours. unmatched_delay: paced run, when the driver holds a null row minus its "
                   "deadline (t_r + W + lateness, shifted by the row's release lag behind its arrival); "
                   "null_rows depends on where Spark's global watermark stood when the query stopped, so only "
                   "matched rows are compared with ours"}


# ---------------------------------------------------------------- the figure


def run(env: BenchEnv, job: JobSettings, plan: LeftPlan, threshold_ms: float) -> dict:
    """The whole left-join figure on `job` (a left join, renamed for the bench); ours and Spark's."""
    with env.phase("our left-join run, live"):
        live = run_live(env, job, plan)
    replays = run_replays(env, job, live)
    with env.phase("exporting the left-join input for Spark"):
        tables = export_inputs(env.spark, job, env.cluster)
    spark = run_spark(env, job, tables, live, plan, threshold_ms)
    delay = live["verify"]["unmatched_delay_ms"]
    return {
        "exact": bool(live["verify"]["verified"] and replays["left"]["identical_to_verified_run"]
                      and replays["inner"]["left_output_less_unmatched"]),
        "parameters": {"window_ms": plan.window_ms, "allowed_lateness_ms": job.join.allowed_lateness_ms,
                       "rate_per_stream": plan.rate, "seconds": plan.seconds, "domain": job.workload.domain,
                       "workers": 1},
        "input_arrival_lag_ms": arrival_lag(job, tables),
        "ours": {"live": live, "replays": replays,
                 "throughput_tuples_per_s": {"left": replays["left"]["tuples_per_s"],
                                             "inner": replays["inner"]["tuples_per_s"]},
                 "unmatched": live["verify"]["unmatched"], "unmatched_delay_ms": delay},
        "peers": {"spark": spark},
    }


def ratios(figure: dict) -> dict:
    """Ours over Spark's left join, and our left join over our inner join, from run's `figure`."""
    left, inner = figure["ours"]["throughput_tuples_per_s"]["left"], figure["ours"]["throughput_tuples_per_s"]["inner"]
    spark = figure["peers"]["spark"]
    return {
        "left_vs_inner": ratio(left, inner, "backlog throughput, left join over inner join on the same input",
                               "tuples/s"),
        "left_vs_spark_left": ratio(left, spark["tuples_per_s"], "backlog throughput, left outer join", "tuples/s"),
        "unmatched_delay_p99_vs_spark_left": ratio(figure["ours"]["unmatched_delay_ms"]["p99"],
                                                   spark["unmatched_delay"]["p99_ms"],
                                                   "p99 delay of unmatched rows past their deadline", "ms"),
    }
