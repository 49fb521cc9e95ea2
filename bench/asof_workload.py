"""The as-of bench's workload: orders joined with the customer row valid at each order's time.

  customers  the table: rows {ts, customer, tier} keyed by customer. Each row is drawn for a
             customer of the first `customers - without_rows`, so each is updated many times
             over a run; a row's event time trails its arrival by up to `row_disorder_ms`
             (under the allowed lateness), so rows arrive out of order in event time.
  orders     the stream: {ts, order, customer, amount} keyed by customer, co-partitioned with
             the table; any customer, so the last `without_rows` customers' orders find no row.

Arrivals are Poisson at the plan's rate per stream; event times are offsets from the moment the
writing begins. Everything is drawn up front with NumPy (`draw`) and written live (`write_live`),
a tick of arrivals at a time, so each record's Kafka timestamp is when it arrived. After the last
order, one row per customer with rows, later than every order by twice the lateness, moves every
group's table watermark past every order: every order is decided, by us and by the peers.

`expected_pairs` is the oracle for the peers: Spark verify's own as-of oracle
(services/spark/asof_oracle.py) over the inputs as exported from the topics.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from streamjoin.bench import ours
from streamjoin.bench.env import BenchEnv
from streamjoin.bench.inputs import oracle_inputs
from streamjoin.schemas.join_keys import key_text
from streamjoin.services.io import kafka
from streamjoin.services.spark.asof_oracle import expected_asof_join
from streamjoin.services.spark.join_columns import o_ref, p_ref
from streamjoin.services.workloads import json_values, poisson_times
from streamjoin.settings import JobSettings, StreamSpec, load

STREAM, TABLE = "orders", "customers"
PAIR = ("stream_partition", "stream_offset", "table_partition", "table_offset")  # a result: both inputs' refs
TICK_S = 0.1  # the live writer hands librdkafka a tick of arrivals at a time

Columns = dict[str, np.ndarray]


@dataclass(frozen=True)
class AsofPlan:
    customers: int  # customer ids 0 .. customers - 1
    without_rows: int  # the last this many customers never have a row
    rate: float  # tuples/s per stream (orders, customer rows)
    seconds: float  # of live input
    lateness_ms: int  # join.allowed_lateness_ms
    row_disorder_ms: int  # a row's event time trails its arrival by up to this (under the lateness)
    order_disorder_ms: int  # an order's, by up to this
    partitions: int
    workers: tuple[int, ...]  # a backlog replay with each count; the first also runs live
    join_type: str = "left"
    random_state: int = 11
    quix_consumer: dict = field(default_factory=dict)  # the Quix peer's consumer settings beyond its own


# Full: about a million tuples, so each backlog replay drains for many of the progress samples
# its sustained rate is cut from (every half second).
FULL = AsofPlan(customers=10_000, without_rows=1_000, rate=4000, seconds=120, lateness_ms=1000, row_disorder_ms=800,
                order_disorder_ms=100, partitions=12, workers=(1, 2))
# Quick: a 3 s consumer session for the Quix peer (Tansu holds a group join for about half of it).
QUICK = AsofPlan(customers=60, without_rows=10, rate=400, seconds=3, lateness_ms=500, row_disorder_ms=400,
                 order_disorder_ms=100, partitions=4, workers=(1,),
                 quix_consumer={"session.timeout.ms": 3_000, "heartbeat.interval.ms": 500})


def asof_job(env: BenchEnv, plan: AsofPlan) -> JobSettings:
    """The bench's as-of job on `env`'s broker, for a fleet of the plan's first worker count."""
    orders = {"name": STREAM, "fields": {"ts": "int", "order": "int", "customer": "int", "amount": "float"},
              "time_field": "ts", "key_fields": ["customer"]}
    customers = {"name": TABLE, "fields": {"ts": "int", "customer": "int", "tier": "int"},
                 "time_field": "ts", "key_fields": ["customer"]}
    job = load(None, job="asof", partitions=plan.partitions, streams=[orders, customers],
               join={"table": TABLE, "type": plan.join_type, "allowed_lateness_ms": plan.lateness_ms},
               worker={"batch_ms": 200})
    return ours.fleet_job(job, env, "asof", plan.workers[0])


# ---------------------------------------------------------------- the input


@dataclass(frozen=True)
class Side:
    """One stream's drawn tuples in arrival order: arrival (ms since the start, float), the
    event-time offset from the start (ms, int), the other fields' columns."""

    arrival: np.ndarray
    offset_ms: np.ndarray
    columns: Columns

    def values(self, job: JobSettings, name: str, base_ms: int) -> tuple[np.ndarray, list[str]]:
        """JSON values (NumPy bytes) with event time `base_ms` + offset, and record keys."""
        spec = spec_of(job, name)
        cols = self.columns | {spec.time_field: base_ms + self.offset_ms}
        keys = key_text([(cols[k], spec.fields[k]) for k in spec.key_fields]).to_pylist()
        return json_values(spec, cols), keys


def draw(plan: AsofPlan) -> dict[str, Side]:
    """Both streams' tuples for the whole run (module docstring), from the plan's random state."""
    rng = np.random.default_rng(plan.random_state)
    span = int(plan.seconds * 1000)

    def side(disorder_ms: int) -> tuple[np.ndarray, np.ndarray]:
        arrival = poisson_times(rng, plan.rate, 0, span)
        trail = rng.uniform(0, disorder_ms, len(arrival))
        return arrival, np.maximum(np.floor(arrival - trail), 0).astype(np.int64)

    arrival, offset = side(plan.order_disorder_ms)
    n = len(arrival)
    orders = Side(arrival, offset, {"order": np.arange(n, dtype=np.int64),
                                    "customer": rng.integers(0, plan.customers, n),
                                    "amount": np.round(rng.uniform(1, 500, n), 2)})
    arrival, offset = side(plan.row_disorder_ms)
    n = len(arrival)
    rows = Side(arrival, offset, {"customer": rng.integers(0, plan.customers - plan.without_rows, n),
                                  "tier": rng.integers(1, 6, n)})
    return {STREAM: orders, TABLE: rows}


def closing_rows(plan: AsofPlan) -> Side:
    """One row per customer with rows, twice the lateness after the run: every order is decided."""
    customers = np.arange(plan.customers - plan.without_rows, dtype=np.int64)
    at = int(plan.seconds * 1000) + 2 * plan.lateness_ms
    return Side(np.full(len(customers), float(at)), np.full(len(customers), at, np.int64),
                {"customer": customers, "tier": np.zeros(len(customers), np.int64)})


def write_live(cluster: kafka.Cluster, job: JobSettings, plan: AsofPlan, sides: dict[str, Side]) -> dict:
    """Writes `sides` as they arrive, a tick at a time, event times from now; then the closing
    rows. Returns the records written per stream, the rate written and when writing began."""
    producer = cluster.producer()
    base_ms = int(time.time() * 1000)
    began = time.monotonic()
    encoded = {name: side.values(job, name, base_ms) for name, side in sides.items()}
    sent = dict.fromkeys(sides, 0)
    while any(sent[name] < len(side.arrival) for name, side in sides.items()):
        elapsed_ms = (time.monotonic() - began) * 1000
        for name, side in sides.items():
            upto = int(np.searchsorted(side.arrival, elapsed_ms, side="right"))
            values, keys = encoded[name]
            producer.produce_batch(job.topic_of(spec_of(job, name)),
                                   [{"key": k, "value": v} for k, v in zip(keys[sent[name]:upto],
                                                                           values[sent[name]:upto].tolist())])
            sent[name] = upto
        producer.poll(0)
        time.sleep(TICK_S)
    seconds = time.monotonic() - began
    values, keys = closing_rows(plan).values(job, TABLE, base_ms)
    producer.produce_batch(job.topic_of(spec_of(job, TABLE)),
                           [{"key": k, "value": v} for k, v in zip(keys, values.tolist())])
    if producer.flush(60):
        raise RuntimeError("the broker did not acknowledge the as-of input within 60 s")
    return {"records": {STREAM: sent[STREAM], TABLE: sent[TABLE] + len(keys)},
            "rate_per_stream": (sent[STREAM] + sent[TABLE]) / 2 / seconds, "seconds": round(seconds, 2),
            "began_ms": base_ms}


def spec_of(job: JobSettings, name: str) -> StreamSpec:
    """The job's stream named `name`."""
    return next(s for s in job.streams if s.name == name)


# ---------------------------------------------------------------- the oracle


def expected_pairs(spark: SparkSession, job: JobSettings, tables: dict[str, pa.Table]) -> tuple[pa.Table, int]:
    """The oracle's results on the exported inputs (bench/inputs.py's tables), as PAIR columns
    (a left join's unmatched order with ABSENT table refs), and how many orders it left
    undecided: those at or past their group's final table watermark (its newest row's time
    minus the lateness; a group is its partition, the inputs being co-partitioned)."""
    sides = oracle_inputs(spark, job, tables)
    stream, table = sides[STREAM], sides[TABLE]
    watermarks = table.groupBy("group").agg((F.max("ts") - job.join.allowed_lateness_ms).alias("watermark"))
    undecided = (stream.join(watermarks, "group", "left_outer")
                 .filter(F.col("watermark").isNull() | (F.col("ts") >= F.col("watermark"))).count())
    expected = expected_asof_join(stream, table.withColumn("deleted", F.lit(False)), job.join.type, watermarks)
    refs = [p_ref(0), o_ref(0), p_ref(1), o_ref(1)]
    return expected.select(*(F.col(r).cast("long").alias(name) for r, name in zip(refs, PAIR))).toArrow(), undecided
