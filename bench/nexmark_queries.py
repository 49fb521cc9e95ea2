"""Nexmark's join queries as streamjoin jobs, and Nexmark's own SQL of them in Spark as the oracle.

The jobs are the shipped job files (streamjoin/jobs/nexmark-q3.yaml, -q8, -q20: each says how it
reads its query) on a run's topics. What they compute against the SQL:

  q3   auctions of category 10 with their seller, a person in OR, ID or CA. Nexmark's SQL is a
       regular join; the job is a RANGE window join whose windows keep every pair a run makes:
       persons longer than the run, auctions longer than the lead by which an auction may name
       a seller before that person exists (nexmark_model.lead_ms). An as-of join (persons as
       the table) would drop those auctions: their seller has no row at their time.
  q8   persons with an auction of theirs in the same 10 s tumbling window: a tumbling semi
       join, each person once per window (Nexmark's GROUP BY on the auction side).
  q20  bids of category-10 auctions with their auction: as q3, auctions longer than the run,
       bids longer than the lead by which a bid may name an auction before it exists.

`expected` runs Nexmark's SQL of each query as written (regular joins, q8's windowed GROUP BYs)
on the events exported from the topics, each row naming its inputs by (partition, offset), or
for q8 by person id and window start (its SELECT); `judge` compares a run's results with it.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from streamjoin.bench import ours
from streamjoin.bench.env import BenchEnv
from streamjoin.bench.nexmark_model import AUCTION, BID, FIELDS, KINDS, PERSON, TIME_FIELD, NexmarkModel
from streamjoin.engine.result_ids import WINDOW_START
from streamjoin.job_files import job_file
from streamjoin.schemas.results import ref_columns
from streamjoin.services.io import kafka
from streamjoin.settings import JobSettings, load

QUERIES = ("q3", "q8", "q20")
# How the events topics are keyed: persons by id, auctions by seller (a seller's auctions in its
# partition), bids by auction. q3 and q8 then read co-partitioned; q20 re-routes auctions by id.
EVENT_KEYS = {PERSON: "id", AUCTION: "seller", BID: "auction"}
# The streams each query reads, in its job's order, and what names one of its results.
STREAMS = {"q3": (AUCTION, PERSON), "q8": (PERSON, AUCTION), "q20": (BID, AUCTION)}
LEAD_OF = {"q3": (AUCTION, PERSON), "q20": (BID, AUCTION)}  # (referring stream, its referent)


def result_keys(query: str) -> list[str]:
    """The columns that name one result of `query`: both members' refs; q8, its person's id and window start."""
    if query == "q8":
        return [f"{PERSON}.id", WINDOW_START]
    return [c for s in STREAMS[query] for c in ref_columns(s)[:2]]


def events_job(env: BenchEnv, name: str, partitions: int) -> JobSettings:
    """The run's three event topics as one job's streams (`<name>.persons`, ...), so the backlog
    writer, the topics check and Spark's export read them as any job's inputs; never run."""
    streams = [{"name": kind, "fields": FIELDS[kind], "time_field": TIME_FIELD, "key_fields": [EVENT_KEYS[kind]],
                "window": {"range_ms": 1000}} for kind in KINDS]
    return load(None, job=name, partitions=partitions, streams=streams, bootstrap=env.bootstrap)


def query_job(env: BenchEnv, query: str, events: JobSettings, name: str) -> JobSettings:
    """The shipped job of `query` on `events`' topics and partitions, renamed `name` (its own
    results, consumer group and state)."""
    job = load(job_file(f"nexmark-{query}.yaml"))
    topics = {s.name: events.topic_of(s) for s in events.streams}
    job = job.model_copy(update={"partitions": events.partitions,
                                 "streams": [s.model_copy(update={"topic": topics[s.name]}) for s in job.streams]})
    return ours.fleet_job(job, env, name, 1)


def covers_leads(job: JobSettings, query: str, model: NexmarkModel) -> bool:
    """Whether the referring stream's window outlasts the generator's lead at the model's rate."""
    if query not in LEAD_OF:
        return True
    referring, referent = LEAD_OF[query]
    spec = next(s for s in job.streams if s.name == referring)
    return spec.window is not None and (spec.window.range_ms or 0) > model.lead_ms(referent)


# ---------------------------------------------------------------- the oracle: Nexmark's SQL in Spark


def register_views(spark: SparkSession, frames: dict[str, DataFrame],
                   ends: dict[str, dict[int, int]] | None = None) -> None:
    """Temporary views person, auction and bid of the exported events, with Nexmark's dateTime;
    with `ends` (kind -> partition -> end offset), only each partition's events before its end:
    a prefix of the run written in the same order per partition elsewhere."""
    for kind, view in ((PERSON, "person"), (AUCTION, "auction"), (BID, "bid")):
        frame = frames[kind]
        if ends is not None:
            limit = F.create_map(*[F.lit(x) for p, end in sorted(ends[kind].items()) for x in (p, end)])
            frame = frame.where(F.col("offset") < F.coalesce(F.element_at(limit, F.col("partition")), F.lit(0)))
        frame.withColumn("dateTime", F.timestamp_millis(TIME_FIELD)).createOrReplaceTempView(view)


SQL = {
    "q3": """
        SELECT A.`partition` AS `auctions.partition`, A.`offset` AS `auctions.offset`,
               P.`partition` AS `persons.partition`, P.`offset` AS `persons.offset`, P.name, P.city, P.state, A.id
        FROM auction AS A INNER JOIN person AS P ON A.seller = P.id
        WHERE A.category = 10 AND (P.state = 'OR' OR P.state = 'ID' OR P.state = 'CA')""",
    "q8": """
        SELECT P.id AS `persons.id`, unix_millis(P.starttime) AS window_start, P.name
        FROM (SELECT id, name, window.start AS starttime, window.end AS endtime
              FROM person GROUP BY id, name, window(dateTime, '10 seconds')) P
        JOIN (SELECT seller, window.start AS starttime, window.end AS endtime
              FROM auction GROUP BY seller, window(dateTime, '10 seconds')) A
        ON P.id = A.seller AND P.starttime = A.starttime AND P.endtime = A.endtime""",
    "q20": """
        SELECT B.`partition` AS `bids.partition`, B.`offset` AS `bids.offset`,
               A.`partition` AS `auctions.partition`, A.`offset` AS `auctions.offset`,
               auction, bidder, price, channel, url, B.dateTime, B.extra,
               item_name, description, initial_bid, reserve, A.dateTime, expires, seller, category, A.extra
        FROM bid AS B INNER JOIN auction AS A ON B.auction = A.id
        WHERE A.category = 10""",
}


def expected(spark: SparkSession, query: str) -> pa.Table:
    """Nexmark's SQL of `query` over the registered views: the columns naming each result."""
    keys = result_keys(query)
    return spark.sql(SQL[query]).select(*(F.col(f"`{k}`").cast("long").alias(k) for k in keys)).toArrow()


def as_of_misses(spark: SparkSession, query: str) -> int | None:
    """How many of the SQL's results pair a referring event with a referent that comes after it
    in event time: what an as-of join (the referent as the table) would not emit."""
    if query not in LEAD_OF:
        return None
    sql = {"q3": "SELECT count(*) FROM auction A JOIN person P ON A.seller = P.id WHERE A.category = 10 "
                 "AND P.state IN ('OR', 'ID', 'CA') AND P.date_time > A.date_time",
           "q20": "SELECT count(*) FROM bid B JOIN auction A ON B.auction = A.id WHERE A.category = 10 "
                  "AND A.date_time > B.date_time"}[query]
    return int(spark.sql(sql).collect()[0][0])


# ---------------------------------------------------------------- judging a run


def our_results(cluster: kafka.Cluster, job: JobSettings, query: str) -> pa.Table:
    """The columns naming each of our results of `query` (its job's results topic)."""
    keys = result_keys(query)
    cols = ours.read_results(cluster, job, keys)
    return pa.table({k: pa.array(cols[k].astype("int64")) for k in keys})


def judge(expected_rows: pa.Table, got: pa.Table) -> dict:
    """`got` against `expected_rows` (the same key columns) as multisets: missing, extra and
    duplicates (rows beyond the first of theirs), and `exact` when all three are 0."""
    keys = expected_rows.column_names
    schema = pa.schema([(k, pa.int64()) for k in keys])
    want, have = (t.select(keys).cast(schema).group_by(keys).aggregate([([], "count_all")]) for t in (expected_rows, got))
    both = want.join(have, keys=keys, join_type="full outer", left_suffix="_want", right_suffix="_have")
    w = pc.fill_null(both["count_all_want"], 0)
    h = pc.fill_null(both["count_all_have"], 0)
    missing = int(pc.sum(pc.max_element_wise(pc.subtract(w, h), 0)).as_py() or 0)
    extra_rows = pc.and_(pc.equal(w, 0), pc.greater(h, 0))
    extra = int(pc.sum(pc.cast(extra_rows, pa.int64())).as_py() or 0)
    duplicates = int(pc.sum(pc.if_else(pc.greater(w, 0), pc.max_element_wise(pc.subtract(h, w), 0),
                                       pc.subtract(h, 1))).as_py() or 0) if both.num_rows else 0
    return {"expected": expected_rows.num_rows, "results": got.num_rows, "missing": missing, "extra": extra,
            "duplicates": duplicates, "exact": missing == extra == duplicates == 0}
