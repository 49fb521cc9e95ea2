"""Spark `verify` job: reads a job's inputs, results, commits and dead letters, computes
the exact join with Spark SQL under engine/reference.py's contract and says
what is missing, extra or duplicated, plus production-delay percentiles.
Hash mode (equi-join on keys) is `expected_join`, ring and splitjoin modes
(predicate terms, reference_theta_join) `expected_theta_join`: see "ring mode"
below (SplitJoin's merger writes the same release records as the ring head).

A tuple's identity is (partition, offset) of its input record; a result's is
the ordered tuple of its inputs' identities, one per stream. Internally every
ref column is `p<i>` / `o<i>` for stream i in join order. Result and commit
records are read by services/spark/result_records.py.

Windows, as an exclusive bound on the result time T each tuple allows
(`until`), so one rule covers both kinds and any number of streams:
  RANGE W:  T - ts < W                  <=>  T < ts + W
  ROWS  N:  fewer than N same-key tuples u with ts(u) <= T and
            (ts(u), offset(u)) > (ts(s), offset(s))
            <=>  T < ts of the N-th such tuple after s in (ts, offset) order
            (no bound when there is none).

Outer, semi and anti joins (2 streams, `expected_outer_join`) are Spark SQL's
own left/right/full outer, left semi and left anti joins on key equality and
that window rule; a null-padded row counts once its group's final watermark
decides it (engine/reference.py `decided`), its absent member's refs ABSENT.
"""

from __future__ import annotations

import json
from functools import reduce
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (BinaryType, BooleanType, DataType, DoubleType, IntegerType, LongType, StringType,
                               StructField, StructType)

from streamjoin.engine.predicates import UDF_ERROR, Term, compile_terms, evaluate_isolated, terms_between
from streamjoin.engine.outer import DECIDED
from streamjoin.engine.result_ids import ABSENT
from streamjoin.schemas.codecs import BLOCK_SHIFT, arrow_schema
from streamjoin.schemas.splitjoin import MARK_HEADER
from streamjoin.schemas.columns import fixed_width_array
from streamjoin.schemas.results import EVENT_TIME, H_OFFSET, H_PARTITION, H_REASON, H_TOPIC, PRODUCED_MS, ref_columns
from streamjoin.services.kafka import Cluster
from streamjoin.services.spark.kafka_source import NAME as KAFKA, local_session
from streamjoin.services.spark.kafka_source import options as kafka_options
from streamjoin.services.spark.result_records import (ID_OK, RECORD_OK, decode_results, final_watermarks,
                                                      release_watermark)
from streamjoin.settings import JobSettings, StreamSpec, WindowSpec

# Field types as JSON records carry them (bytes as text), for from_json.
_SPARK_TYPES: dict[str, DataType] = {"int": LongType(), "float": DoubleType(), "str": StringType(),
                                     "bool": BooleanType(), "bytes": StringType()}
# Field types of decoded ring-mode tuples: bytes are bytes (UDFs compare them), whatever the format.
_TUPLE_TYPES: dict[str, DataType] = _SPARK_TYPES | {"bytes": BinaryType()}
_NO_BOUND = int(np.iinfo(np.int64).max)  # `until` of a tuple no T can push out
# Results plotted at most; more are sampled down.
_PLOT_POINTS = 100_000


def _p(i: int) -> str:
    return f"p{i}"


def _o(i: int) -> str:
    return f"o{i}"


def _refs(m: int) -> list[str]:
    return [c for i in range(m) for c in (_p(i), _o(i))]


def _q(name: str) -> Column:
    """A column whose name holds dots (`r.partition`)."""
    return F.col(f"`{name}`")


# ---------------------------------------------------------------- the exact join


def _with_until(tuples: DataFrame, window: WindowSpec) -> DataFrame:
    """Adds `until`: the exclusive bound on T while the tuple is inside its window (null = none)."""
    if window.range_ms is not None:
        return tuples.withColumn("until", F.col("ts") + F.lit(window.range_ms))
    order = Window.partitionBy("key").orderBy("ts", "offset")
    # `le` counts tuples <= this one in (ts, offset) order, peers included (the
    # default RANGE frame), so position le + N is the N-th strictly newer one.
    ranked = (tuples.withColumn("le", F.count(F.lit(1)).over(order))
              .withColumn("pos", F.row_number().over(order)))
    nth = ranked.select(F.col("key").alias("n_key"), F.col("pos").alias("n_pos"), F.col("ts").alias("until"))
    joined = ranked.join(nth, (F.col("key") == F.col("n_key"))
                         & (F.col("n_pos") == F.col("le") + F.lit(window.rows)), "left")
    return joined.drop("le", "pos", "n_key", "n_pos")


def expected_join(inputs: Sequence[DataFrame], windows: Sequence[WindowSpec],
                  final_watermark: DataFrame | None = None) -> DataFrame:
    """Every result of the m-way equi-join, as refs p0, o0, ..., p<m-1>, o<m-1> and event_time T.

    `inputs[i]` holds stream i's accepted tuples: partition int, offset long,
    key (any comparable type, e.g. a struct of several key fields), ts long,
    group int (the partition group that joins it: `key_groups`).
    `final_watermark` (group, watermark) keeps only results with T < watermark
    of their group, as reference_join does (its groups: the first stream's partitions).
    """
    acc: DataFrame | None = None
    for i, (tuples, window) in enumerate(zip(inputs, windows)):
        # Every member of a result has the same key, hence the same group: stream 0's is kept.
        group = [F.col("group").alias("g0")] if i == 0 else []
        side = _with_until(tuples.select("partition", "offset", "key", "ts", "group"), window).select(
            "key", F.col("partition").alias(_p(i)), F.col("offset").alias(_o(i)), F.col("ts").alias(f"ts{i}"),
            F.coalesce("until", F.lit(_NO_BOUND)).alias(f"u{i}"), *group)
        acc = side if acc is None else acc.join(side, "key")
        if i:
            # T only grows as streams join, so a partial combination already past
            # some member's bound can never become a result: prune it now.
            t = F.greatest(*[F.col(f"ts{j}") for j in range(i + 1)])
            acc = acc.filter(t < F.least(*[F.col(f"u{j}") for j in range(i + 1)]))
    assert acc is not None
    out = acc.withColumn(EVENT_TIME, F.greatest(*[F.col(f"ts{j}") for j in range(len(inputs))]))
    if final_watermark is not None:
        wm = final_watermark.select(F.col("group").alias("g0"), "watermark")
        out = out.join(wm, "g0").filter(F.col(EVENT_TIME) < F.col("watermark"))
    return out.select(*_refs(len(inputs)), EVENT_TIME)


# ---------------------------------------------------------------- outer, semi and anti joins (2 streams)

# Spark SQL's join type for each of the job's; the oracle is Spark's own join, not the engine's rule.
_SPARK_JOIN = {"left": "left_outer", "right": "right_outer", "full": "full_outer", "semi": "left_semi",
               "anti": "left_anti"}


def _decided(window: WindowSpec) -> Column:
    """Whether the group's final `watermark` proves no partner can still join the tuple
    (null watermark: its group never committed a batch, so nothing is decided):
    RANGE W: watermark >= ts + W = until;  ROWS N: the N-th newer tuple's ts (until) < watermark."""
    until, wm = F.col("until"), F.col("watermark")
    return F.coalesce(until <= wm if window.range_ms is not None else until < wm, F.lit(False))


def _outer_side(tuples: DataFrame, window: WindowSpec, i: int, watermarks: DataFrame) -> DataFrame:
    """Stream i's tuples as k<i> (key), p<i>, o<i>, ts<i>, u<i> (window bound, _NO_BOUND for none),
    w<i> (its group's final watermark, null: none) and d<i> (decided by it).

    `tuples` as expected_join takes them; `watermarks`: group, watermark (final_watermarks)."""
    bounded = _with_until(tuples.select("partition", "offset", "key", "ts", "group"), window)
    with_wm = bounded.join(watermarks.select("group", "watermark"), "group", "left")
    return with_wm.select(F.col("key").alias(f"k{i}"), F.col("partition").alias(_p(i)), F.col("offset").alias(_o(i)),
                          F.col("ts").alias(f"ts{i}"), F.coalesce("until", F.lit(_NO_BOUND)).alias(f"u{i}"),
                          F.col("watermark").alias(f"w{i}"), _decided(window).alias(f"d{i}"))


def _emitted(join_type: str, eager: bool) -> Column:
    """Which rows of Spark's join are results: a combination once final (time windows: at
    once; count windows: T below its group's watermark), a row alone once decided. Semi rows
    are all results: the semi join itself asked for a final partner."""
    if join_type == "semi":
        return F.lit(True)
    p0, p1 = F.col(_p(0)), F.col(_p(1))
    # A group with no watermark leaves `final` null, which filter() takes as false: not final.
    final = F.lit(True) if eager else F.col(EVENT_TIME) < F.col("w0")
    return (p0.isNotNull() & p1.isNotNull() & final) | (p1.isNull() & F.col("d0")) | (p0.isNull() & F.col("d1"))


def expected_outer_join(inputs: Sequence[DataFrame], windows: Sequence[WindowSpec], join_type: str,
                        watermarks: DataFrame) -> DataFrame:
    """Every result of a 2-way left, right, full, semi or anti join, as p0, o0, p1, o1 and
    event_time (the present member's ts for a row alone); an absent member's p and o are ABSENT.

    `inputs`, `windows` as expected_join takes them; `join_type` one of _SPARK_JOIN;
    `watermarks`: group, watermark, each group's final watermark (final_watermarks).
    Contract: engine/reference.py reference_outer_join."""
    assert len(inputs) == 2 and join_type in _SPARK_JOIN
    sides = [_outer_side(t, w, i, watermarks) for i, (t, w) in enumerate(zip(inputs, windows))]
    t = F.greatest(F.col("ts0"), F.col("ts1"))
    # The window rule on every pair, final or not: a row any combination holds is matched.
    on = (F.col("k0") == F.col("k1")) & (t < F.least(F.col("u0"), F.col("u1")))
    eager = all(w.range_ms is not None for w in windows)
    if join_type == "semi" and not eager:
        on = on & (t < F.col("w0"))  # semi: a row counts once it is in a final combination
    rows = sides[0].join(sides[1], on, _SPARK_JOIN[join_type])
    if join_type in ("semi", "anti"):  # Spark keeps only the left side's columns
        rows = rows.select("*", *[F.lit(None).cast(c.dataType).alias(c.name) for c in sides[1].schema.fields])
    # greatest() skips nulls: a row alone has its own ts.
    rows = rows.withColumn(EVENT_TIME, t).filter(_emitted(join_type, eager))
    # Spark's null padding is the absent member: its refs become ABSENT, as results carry them.
    refs = [F.coalesce(F.col(c), F.lit(ABSENT).cast(kind)).alias(c)
            for i in (0, 1) for c, kind in ((_p(i), "int"), (_o(i), "long"))]
    return rows.select(*refs, EVENT_TIME)


def expected_results(inputs: Sequence[DataFrame], windows: Sequence[WindowSpec], join_type: str,
                     watermarks: DataFrame) -> DataFrame:
    """The results a job of `join_type` must produce (refs and event_time): expected_join for
    inner (count windows bounded by the final watermarks), expected_outer_join otherwise.
    Parameters as expected_outer_join takes them."""
    if join_type != "inner":
        return expected_outer_join(inputs, windows, join_type, watermarks)
    counted = any(w.rows is not None for w in windows)
    return expected_join(inputs, windows, watermarks if counted else None)


# ---------------------------------------------------------------- reading Kafka


def _read(spark: SparkSession, cluster: Cluster, topics: list[str]) -> DataFrame:
    """One snapshot of all the topics, pinned so every later step sees the same records. Read
    as one partition per core, not one per topic partition: every later stage runs a task per
    partition, and a task that starts a Python worker for a few records costs more than it does."""
    return (spark.read.format(KAFKA).options(**kafka_options(cluster)).option("topics", ",".join(topics))
            .load().coalesce(spark.sparkContext.defaultParallelism).localCheckpoint(eager=True))


def value_schema(spec: StreamSpec) -> StructType:
    return StructType([StructField(n, _SPARK_TYPES[t]) for n, t in spec.fields.items()])


def decode_inputs(raw: DataFrame, spec: StreamSpec) -> DataFrame:
    """partition, offset, arrival (Kafka timestamp), key, ts, ok (parsed with every field present)."""
    v = F.from_json(F.col("value").cast("string"), value_schema(spec))
    parsed = raw.select("topic", "partition", "offset", F.col("timestamp_ms").alias("arrival"), v.alias("v"))
    keys = [F.col(f"v.{k}") for k in spec.key_fields]
    ok = reduce(lambda a, b: a & b, [F.col(f"v.{n}").isNotNull() for n in spec.fields])
    return parsed.select("topic", "partition", "offset", "arrival",
                         (keys[0] if len(keys) == 1 else F.struct(*keys)).alias("key"),
                         F.col(f"v.{spec.time_field}").alias("ts"), F.coalesce(ok, F.lit(False)).alias("ok"))


def key_groups(decoded: DataFrame, spec: StreamSpec, partitions: int) -> DataFrame:
    """decoded (decode_inputs) + `group`: the partition group of each tuple's join key, Kafka's
    murmur2 of the canonical key text mod `partitions`. Workers join a record there whichever
    partition it came in on (a misrouted one travels through the by-key topic); its refs keep
    the partition it came in on, so groups come from keys, not refs."""
    key = F.col("key")
    text = (key.cast("string") if len(spec.key_fields) == 1
            else F.concat_ws(",", *[key[k].cast("string") for k in spec.key_fields]))
    return decoded.withColumn("group", _partition_of(partitions)(text))


def _partition_of(partitions: int) -> Callable[[Column], Column]:
    """A Spark function: key text -> the partition Kafka's default partitioner picks among `partitions`."""
    def partition(texts: pd.Series) -> pd.Series:
        from streamjoin.topology.partitioner import partitions_for_keys

        return pd.Series(partitions_for_keys(pa.array(texts.fillna(""), pa.string()), partitions))

    return F.pandas_udf(partition, IntegerType())


def decode_dead_letters(raw: DataFrame) -> DataFrame:
    """topic, partition, offset of the input each dead letter stands for, and its reason (one row per input)."""
    h = F.col("headers")
    return (raw.select(h[H_TOPIC].alias("topic"), h[H_PARTITION].cast("int").alias("partition"),
                       h[H_OFFSET].cast("long").alias("offset"), h[H_REASON].alias("reason"))
            .groupBy("topic", "partition", "offset").agg(F.min("reason").alias("reason")))


# ---------------------------------------------------------------- ring mode: the exact theta join
#
# Contract: engine/reference.py reference_theta_join. A result is a
# combination, one tuple per stream, with every predicate term true on its
# pair and every member inside its window at the trigger t, the combination's
# newest member in the global order (ts, stream, partition, offset); T = ts(t).
# Each member gets two exclusive bounds, so one rule covers both window kinds
# and any number of streams:
#   RANGE W:  T - ts < W                                   <=>  T < ut = ts + W
#   ROWS  N:  fewer than N tuples of its stream after it, not after t
#                                                          <=>  g(t) < ug = g of its stream's N-th next tuple
# where g is a tuple's rank in the global order over every stream's accepted
# tuples (no bound: _NO_BOUND). A combination is a result when
# max ts < min ut and max g < min ug over its members (the trigger is the
# member of greatest g, and has the greatest ts). Both maxima only grow as
# streams join, so partial combinations are pruned at every step.
#
# No nested loops where a key will do: equality terms are join keys; band
# terms (and, when no term relates a stream to those joined, the time band
# max(W_i, W_j) that two RANGE windows imply) are bucket keys whose new side
# is spread over the neighbouring buckets. A UDF term runs once per candidate
# pair of its two streams, into a pair table the multi-way join then meets on
# refs: the two streams are co-grouped by the same keys (Spark's Arrow
# cogroup) and each group's pairs checked in NumPy with Term.evaluate, i.e.
# the callable engine.predicates.load_udf registered, on the arrays the
# engine would pass it.

_BAND_KEYS = 2  # band terms used as bucket keys per join (each spreads the new side threefold)
_CANDIDATES = 1 << 20  # candidate pairs a UDF pair group checks per NumPy step
_UDF_BYTES = 4 << 20  # bytes of values per UDF call: small enough to stay in cache (3x faster than 64 MiB)
_BOUNDS = ("p", "o", "ts", "g", "ut", "ug")


def _v(stream: int, field: str) -> str:
    return f"v{stream}_{field}"


def _greatest(cols: list[Column]) -> Column:
    return cols[0] if len(cols) == 1 else F.greatest(*cols)


def _least(cols: list[Column]) -> Column:
    return cols[0] if len(cols) == 1 else F.least(*cols)


def _all(conditions: list[Column]) -> Column:
    return reduce(lambda a, b: a & b, conditions)


def _bounded(inputs: Sequence[DataFrame], windows: Sequence[WindowSpec]) -> list[DataFrame]:
    """Stream i's tuples as p<i>, o<i>, ts<i>, g<i>, ut<i>, ug<i> and v<i> (the fields' struct)."""
    union = reduce(DataFrame.unionByName, [t.select(F.lit(i).alias("stream"), "partition", "offset", "ts")
                                           for i, t in enumerate(inputs)])
    # One global rank: a single-partition sort of narrow rows, the price of an exact global order.
    ranked = union.withColumn("g", F.row_number().over(Window.orderBy("ts", "stream", "partition", "offset")))
    ranked = ranked.localCheckpoint()
    out = []
    for i, (tuples, window) in enumerate(zip(inputs, windows)):
        mine = ranked.filter(F.col("stream") == i)
        ut = F.col("ts") + F.lit(window.range_ms) if window.range_ms is not None else F.lit(_NO_BOUND)
        ug = (F.coalesce(F.lead("g", window.rows).over(Window.orderBy("g")), F.lit(_NO_BOUND))
              if window.rows is not None else F.lit(_NO_BOUND))
        bounds = mine.select("partition", "offset", "g", ut.alias("ut"), ug.alias("ug"))
        out.append(tuples.select("partition", "offset", "ts", "v").join(bounds, ["partition", "offset"]).select(
            *[F.col(c).alias(f"{b}{i}") for b, c in zip(_BOUNDS, ("partition", "offset", "ts", "g", "ut", "ug"))],
            F.col("v").alias(f"v{i}")))
    return out


def _side(bounded: DataFrame, i: int, fields: set[str]) -> DataFrame:
    """The bounds of stream i and the named fields, flat (v<i>_<field>)."""
    return bounded.select(*[f"{b}{i}" for b in _BOUNDS], *[F.col(f"v{i}")[f].alias(_v(i, f)) for f in sorted(fields)])


def _inside(members: Sequence[int]) -> Column:
    """Every member inside its window at the combination's trigger."""
    def col(name: str) -> list[Column]:
        return [F.col(f"{name}{j}") for j in members]

    return (_greatest(col("ts")) < _least(col("ut"))) & (_greatest(col("g")) < _least(col("ug")))


def _holds(term: Term) -> Column:
    """An equality or band term, computed as Term.evaluate does (bands in float64)."""
    left, right = F.col(_v(*term.left)), F.col(_v(*term.right))
    if term.kind == "eq":
        return left == right
    return F.abs(left.cast("double") - right.cast("double")) <= F.lit(term.within)


def _engine_array(values: pa.Array) -> np.ndarray:
    """A column as schemas.codecs hands it to the engine: bytes as NumPy 'S', text as 'U'."""
    if pa.types.is_binary(values.type) or pa.types.is_large_binary(values.type):
        return fixed_width_array(values, "S")
    if pa.types.is_string(values.type) or pa.types.is_large_string(values.type):
        return fixed_width_array(values, "U")
    return values.to_numpy(zero_copy_only=False)


def _keys(plain: Sequence[Term], new: int, members: Sequence[int],
          windows: Sequence[WindowSpec]) -> list[tuple[Column, Column, bool]]:
    """Join keys between the joined streams and stream `new`: (joined side, new side, spread to neighbours)."""
    keys = []
    for t in plain:
        joined, mine = F.col(_v(*t.other(new))), F.col(_v(new, t.side(new)))
        if t.kind == "eq":
            keys.append((joined, mine, False))
        elif t.within == 0:
            keys.append((joined.cast("double"), mine.cast("double"), False))
        elif sum(spread for *_, spread in keys) < _BAND_KEYS:
            # Buckets twice the band: float division cannot push a pair further apart than neighbours.
            width = 2 * t.within
            keys.append((F.floor(joined.cast("double") / width), F.floor(mine.cast("double") / width), True))
    timed = [j for j in members if windows[j].range_ms is not None]
    if not keys and windows[new].range_ms is not None and timed:
        width = max(windows[new].range_ms, windows[timed[0]].range_ms)
        keys.append((F.floor(F.col(f"ts{timed[0]}") / width), F.floor(F.col(f"ts{new}") / width), True))
    return keys


def _keyed(joined: DataFrame, new: DataFrame,
           keys: list[tuple[Column, Column, bool]]) -> tuple[DataFrame, DataFrame, list[str]]:
    """Both sides with key columns _k<n>; the new side has a row per neighbouring bucket of a spread key."""
    names = [f"_k{n}" for n in range(len(keys))]
    for name, (left, right, spread) in zip(names, keys):
        joined = joined.withColumn(name, left)
        new = new.withColumn(name, F.explode(F.array(right - 1, right, right + 1)) if spread else right)
    return joined, new, names


def _blocked_join(joined: DataFrame, new: DataFrame, keys: list[tuple[Column, Column, bool]]) -> DataFrame:
    """Candidate combinations: equal keys, spread keys within one bucket (else every pair)."""
    if not keys:
        return joined.crossJoin(new)
    joined, new, names = _keyed(joined, new, keys)
    return joined.join(new, names).drop(*names)


def _plain_fields(terms: Sequence[Term], stream: int) -> set[str]:
    return {t.side(stream) for t in terms if stream in t.streams and t.kind != "udf"}


def _udf_pairs(term: Term, bounded: list[DataFrame], windows: Sequence[WindowSpec],
               terms: Sequence[Term]) -> DataFrame:
    """Refs p/o of both streams for every pair that may meet in a result and on which the UDF holds.

    Co-grouped by the pair's join keys (one group when there are none), each group's
    pairs checked in NumPy: the values a UDF compares (images) travel to Python once
    per tuple and bucket, not once per pair, which made verify ~10x slower."""
    a, b = term.left[0], term.right[0]
    plain = [t for t in terms if t.streams == term.streams and t.kind != "udf"]
    left = _side(bounded[a], a, _plain_fields(plain, a) | {term.left[1]})
    right = _side(bounded[b], b, _plain_fields(plain, b) | {term.right[1]})
    keys = _keys(plain, b, [a], windows) or [(F.lit(0), F.lit(0), False)]
    left, right, names = _keyed(left, right, keys)
    schema = StructType([StructField(_p(a), IntegerType()), StructField(_o(a), LongType()),
                         StructField(_p(b), IntegerType()), StructField(_o(b), LongType())])
    return (left.groupBy(*names).cogroup(right.groupBy(*names))
            .applyInArrow(_pair_matcher(term, plain, schema), schema).localCheckpoint())


def _pair_matcher(term: Term, plain: list[Term], schema: StructType) -> Callable[[pa.Table, pa.Table], pa.Table]:
    """cogroup function: one group's left and right tuples -> the pairs that pass."""
    a, b = term.left[0], term.right[0]
    out = to_arrow_schema(schema)

    def match(left: pa.Table, right: pa.Table) -> pa.Table:
        lcols = {c: _engine_array(left.column(c).combine_chunks()) for c in left.column_names}
        rcols = {c: _engine_array(right.column(c).combine_chunks()) for c in right.column_names}
        found = [_pairs_passing(term, plain, lcols, rcols, lo, hi)
                 for lo, hi in _spans(left.num_rows, _CANDIDATES // max(1, right.num_rows))]
        ii = np.concatenate([f[0] for f in found]) if found else np.empty(0, np.int64)
        jj = np.concatenate([f[1] for f in found]) if found else np.empty(0, np.int64)
        return pa.table([lcols[_p(a)][ii], lcols[_o(a)][ii], rcols[_p(b)][jj], rcols[_o(b)][jj]], schema=out)

    return match


def _spans(n: int, step: int) -> list[tuple[int, int]]:
    step = max(1, step)
    return [(lo, min(n, lo + step)) for lo in range(0, n, step)]


def _pairs_passing(term: Term, plain: list[Term], lcols: dict[str, np.ndarray], rcols: dict[str, np.ndarray],
                   lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    """Left rows lo..hi against every right row: windows and plain terms first, then the UDF."""
    a, b = term.left[0], term.right[0]
    nr = len(rcols[_p(b)])
    ii, jj = np.divmod(np.arange(lo * nr, hi * nr, dtype=np.int64), max(nr, 1))

    def both(name: str) -> tuple[np.ndarray, np.ndarray]:
        return lcols[f"{name}{a}"][ii], rcols[f"{name}{b}"][jj]

    keep = (np.maximum(*both("ts")) < np.minimum(*both("ut"))) & (np.maximum(*both("g")) < np.minimum(*both("ug")))
    for t in plain:
        keep &= t.evaluate({a: lcols[_v(a, t.side(a))][ii], b: rcols[_v(b, t.side(b))][jj]})
    ii, jj = ii[keep], jj[keep]
    left, right = lcols[_v(*term.left)], rcols[_v(*term.right)]
    per_call = _UDF_BYTES // max(1, left.itemsize + right.itemsize)
    # The engine's rule for a failing UDF: pairs it raises on (alone) are no match.
    holds = [evaluate_isolated(term, {a: left[ii[s:e]], b: right[jj[s:e]]})[0] for s, e in _spans(len(ii), per_call)]
    mask = np.concatenate(holds) if holds else np.zeros(0, bool)
    return ii[mask], jj[mask]


def _join_order(m: int, terms: Sequence[Term]) -> list[int]:
    """Stream 0 first, then always a stream a term relates to those joined, if any."""
    order = [0]
    while len(order) < m:
        left = [i for i in range(m) if i not in order]
        related = [i for i in left if terms_between(list(terms), i, frozenset(order))]
        order.append((related or left)[0])
    return order


def _join_step(acc: DataFrame, members: list[int], new: int, bounded: list[DataFrame],
               windows: Sequence[WindowSpec], terms: Sequence[Term], pairs: dict[int, DataFrame]) -> DataFrame:
    now = terms_between(list(terms), new, frozenset(members))
    plain = [t for t in now if t.kind != "udf"]
    udfs = [n for n, t in enumerate(terms) if t.kind == "udf" and t in now]
    side = _side(bounded[new], new, _plain_fields(terms, new))
    if udfs:
        first, *rest = udfs
        j = terms[first].other(new)[0]
        acc = acc.join(pairs[first], [_p(j), _o(j)]).join(side, [_p(new), _o(new)])
        for n in rest:
            refs = [_p(terms[n].left[0]), _o(terms[n].left[0]), _p(terms[n].right[0]), _o(terms[n].right[0])]
            acc = acc.join(pairs[n], refs, "leftsemi")
    else:
        acc = _blocked_join(acc, side, _keys(plain, new, members, windows))
    return acc.filter(_all([_inside([*members, new]), *[_holds(t) for t in plain]]))


def expected_theta_join(inputs: Sequence[DataFrame], windows: Sequence[WindowSpec],
                        terms: Sequence[Term]) -> DataFrame:
    """Every result of the ring-mode join, as refs p0, o0, ..., p<m-1>, o<m-1> and event_time T.

    `inputs[i]` holds stream i's accepted tuples: partition int, offset long,
    ts long, v (struct of the stream's fields); `terms` as compile_terms makes them.
    """
    m = len(inputs)
    bounded = _bounded(inputs, windows)
    pairs = {n: _udf_pairs(t, bounded, windows, terms) for n, t in enumerate(terms) if t.kind == "udf"}
    order = _join_order(m, terms)
    acc = _side(bounded[order[0]], order[0], _plain_fields(terms, order[0]))
    for k, new in enumerate(order[1:], start=1):
        acc = _join_step(acc, order[:k], new, bounded, windows, terms, pairs)
    return acc.select(*_refs(m), _greatest([F.col(f"ts{i}") for i in range(m)]).alias(EVENT_TIME))


# ---------------------------------------------------------------- ring mode: reading inputs


def tuple_schema(spec: StreamSpec) -> StructType:
    """A decoded ring-mode input tuple (see decode_tuples)."""
    return StructType([
        StructField("topic", StringType()), StructField("partition", IntegerType()),
        StructField("record_offset", LongType()), StructField("offset", LongType()),
        StructField("arrival", LongType()), StructField("ts", LongType()), StructField("ok", BooleanType()),
        StructField("v", StructType([StructField(n, _TUPLE_TYPES[t]) for n, t in spec.fields.items()]))])


def decode_tuples(raw: DataFrame, spec: StreamSpec) -> DataFrame:
    """One row per input tuple (tuple_schema): its record's offset, its own offset (the
    record's; in a block record (record offset << BLOCK_SHIFT) | index, as
    schemas.codecs.decode_blocks numbers them), arrival (Kafka timestamp), ts, ok
    (decoded with every field present) and v, the fields. A block record that does
    not decode is one row, not ok."""
    return _block_tuples(raw, spec) if spec.format == "blocks" else _json_tuples(raw, spec)


def _json_tuples(raw: DataFrame, spec: StreamSpec) -> DataFrame:
    parsed = raw.select("topic", "partition", "offset", F.col("timestamp_ms").alias("arrival"),
                        F.from_json(F.col("value").cast("string"), value_schema(spec)).alias("j"))
    ok = _all([F.col("j")[n].isNotNull() for n in spec.fields])
    # JSON carries bytes as text; the engine (Arrow's JSON reader) takes the text's UTF-8 bytes.
    fields = [(F.col("j")[n].cast("binary") if t == "bytes" else F.col("j")[n]).alias(n) for n, t in spec.fields.items()]
    return parsed.select("topic", "partition", F.col("offset").alias("record_offset"), "offset", "arrival",
                         F.col("j")[spec.time_field].alias("ts"), F.coalesce(ok, F.lit(False)).alias("ok"),
                         F.struct(*fields).alias("v"))


def _block_tuples(raw: DataFrame, spec: StreamSpec) -> DataFrame:
    schema = tuple_schema(spec)
    return raw.select("topic", "partition", "offset", "timestamp_ms", "value").mapInArrow(
        _tuple_block_decoder(spec, schema), schema)


def _tuple_block_decoder(spec: StreamSpec,
                         schema: StructType) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """mapInArrow function: block records -> their tuples, a record at a time."""
    out = to_arrow_schema(schema)

    def decode(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for topic, part, off, arrival, value in zip(*(batch.column(c).to_pylist() for c in batch.schema.names)):
                yield _record_tuples(spec, out, topic, part, off, arrival, value)

    return decode


def _record_tuples(spec: StreamSpec, out: pa.Schema, topic: str, part: int, off: int, arrival: int,
                   value: bytes | None) -> pa.RecordBatch:
    fields_type = out.field("v").type
    try:  # exactly the worker's reading of a block (schemas.codecs.decode_blocks)
        table = pa.ipc.open_stream(value or b"").read_all().select(list(spec.fields)).cast(arrow_schema(spec))
    except (pa.ArrowInvalid, pa.ArrowTypeError, KeyError, ValueError):
        table = None
    if table is None:
        n, ts, ok, fields = 1, pa.nulls(1, pa.int64()), pa.array([False]), pa.nulls(1, fields_type)
    else:
        n, columns = table.num_rows, [table.column(f).combine_chunks() for f in spec.fields]
        ts = table.column(spec.time_field).combine_chunks()
        ok = pc.invert(reduce(pc.or_, [pc.is_null(c) for c in columns], pa.array(np.zeros(n, bool))))
        fields = pa.StructArray.from_arrays(columns, fields=list(fields_type))
    index = np.arange(n, dtype=np.int64)
    return pa.RecordBatch.from_arrays([
        pa.repeat(pa.scalar(topic, pa.string()), n), pa.array(np.full(n, part, np.int32)),
        pa.array(np.full(n, off, np.int64)), pa.array((np.int64(off) << BLOCK_SHIFT) + index),
        pa.array(np.full(n, arrival, np.int64)), ts, ok, fields], schema=out)


def decode_ring_dead_letters(raw: DataFrame, job: JobSettings) -> DataFrame:
    """topic, partition, record_offset, reason of each dead letter and `dts`: null when it
    stands for its whole input record, else an event time of the tuples it holds (a block
    record's late tuples are dead-lettered as a block of just those; tuples of one record
    with one event time share their fate, so the event time names them exactly). With
    several dead letters for one block record, its tuples take the least of their reasons."""
    h = F.col("headers")
    named = raw.select(h[H_TOPIC].alias("topic"), h[H_PARTITION].cast("int").alias("partition"),
                       h[H_OFFSET].cast("long").alias("offset"), h[H_REASON].alias("reason"), "timestamp_ms", "value")
    # A udf-error dead letter reports a record whose probe met a failing UDF: the record
    # itself was joined (only the failing pairs were not), so it stays an input.
    named = named.filter(F.col("reason") != F.lit(UDF_ERROR))
    blocks = [s for s in job.streams if s.format == "blocks"]
    whole = named.filter(~F.col("topic").isin([job.topic_of(s) for s in blocks])).select(
        "topic", "partition", F.col("offset").alias("record_offset"), "reason", F.lit(None).cast("long").alias("dts"))
    reasons = named.select("topic", "partition", F.col("offset").alias("record_offset"), "reason")
    held = [_block_tuples(named.filter(F.col("topic") == job.topic_of(s)), s)
            .select("topic", "partition", "record_offset", F.when(F.col("ok"), F.col("ts")).alias("dts"))
            .join(reasons, ["topic", "partition", "record_offset"]) for s in blocks]
    return reduce(DataFrame.unionByName, [whole, *held])


def mark_dead(decoded: DataFrame, dead: DataFrame) -> DataFrame:
    """decoded + `reason`: that of the dead letter standing for the tuple (null: none)."""
    hits = (decoded.select("topic", "partition", "record_offset", "offset", "ts")
            .join(dead, ["topic", "partition", "record_offset"])
            .filter(F.col("dts").isNull() | (F.col("dts") == F.col("ts")))
            .groupBy("topic", "partition", "offset").agg(F.min("reason").alias("reason")))
    return decoded.join(hits, ["topic", "partition", "offset"], "left")


# ---------------------------------------------------------------- comparing


def compare(expected: DataFrame, actual: DataFrame, m: int) -> dict[str, int]:
    """missing / extra (distinct combinations) and duplicates (extra copies) between
    expected refs and produced refs, both as p<i>, o<i> columns."""
    refs = _refs(m)
    produced = actual.groupBy(*refs).agg(F.count(F.lit(1)).alias("copies"))
    both = expected.select(*refs, F.lit(True).alias("wanted")).join(produced, refs, "full")
    row = both.agg(
        F.count_if(F.col("wanted") & F.col("copies").isNull()).alias("missing"),
        F.count_if(F.col("wanted").isNull()).alias("extra"),
        F.coalesce(F.sum(F.greatest(F.col("copies") - 1, F.lit(0))), F.lit(0)).alias("duplicates"),
        F.count_if(F.col("wanted")).alias("expected"),
    ).first()
    return {k: int(row[k]) for k in ("missing", "extra", "duplicates", "expected")}


def production_delays(actual: DataFrame, arrivals: Sequence[DataFrame]) -> DataFrame:
    """produced_ms and delay = produced_ms - latest Kafka timestamp among the result's inputs.

    `actual`: p<i>, o<i>, produced_ms; `arrivals[i]`: stream i's partition, offset, arrival.
    An absent member (refs ABSENT) meets no arrival: greatest() skips its null, so the
    delay is from the present members' arrivals."""
    out = actual
    for i, a in enumerate(arrivals):
        out = out.join(a.select(F.col("partition").alias(_p(i)), F.col("offset").alias(_o(i)),
                                F.col("arrival").alias(f"a{i}")), [_p(i), _o(i)], "left")
    latest = F.greatest(*[F.col(f"a{i}") for i in range(len(arrivals))])
    return out.select(PRODUCED_MS, (F.col(PRODUCED_MS) - latest).alias("delay")).filter(F.col("delay").isNotNull())


def unmatched_delays(actual: DataFrame, decoded: Sequence[DataFrame], job: JobSettings) -> DataFrame:
    """produced_ms and delay = produced_ms - deadline for each produced row alone (outer and
    anti joins): the deadline is its ts + its stream's RANGE window + join.allowed_lateness_ms,
    the event time at which the watermark decides it.

    `actual`: p<i>, o<i>, produced_ms (absent members ABSENT); `decoded[i]`: stream i's
    partition, offset, ts; `job`: a join whose decided streams all have time windows (a
    count-window row has no deadline in time)."""
    parts = []
    for side in DECIDED[job.join.type]:
        window = job.streams[side].window.range_ms
        assert window is not None, f"stream {side} counts rows: its rows have no deadline in time"
        alone = actual.filter((F.col(_p(1 - side)) == ABSENT) & (F.col(_p(side)) != ABSENT))
        ts = decoded[side].select(F.col("partition").alias(_p(side)), F.col("offset").alias(_o(side)), "ts")
        deadline = F.col("ts") + F.lit(window + job.join.allowed_lateness_ms)
        parts.append(alone.join(ts, [_p(side), _o(side)]).select(
            PRODUCED_MS, (F.col(PRODUCED_MS) - deadline).alias("delay")))
    # A result naming an input that did not decode has no ts: it is extra, not late.
    return reduce(DataFrame.unionByName, parts).filter(F.col("delay").isNotNull())


def _unmatched_fields(job: JobSettings, expected: DataFrame, actual: DataFrame,
                      decoded: Sequence[DataFrame]) -> dict:
    """join_type; unmatched: expected results of rows no partner joined (left/right/full rows
    alone, anti rows; semi rows matched, so 0 as for inner); unmatched_delay_ms: percentiles of
    unmatched_delays, when every decided stream has a time window. Parameters as _outcome's."""
    fields: dict[str, object] = {"join_type": job.join.type, "unmatched": 0}
    if job.join.type in ("inner", "semi"):
        return fields
    absent = reduce(lambda a, b: a | b, [F.col(_p(i)) == ABSENT for i in range(len(job.streams))])
    fields["unmatched"] = expected.filter(absent).count()
    if all(job.streams[s].window.range_ms is not None for s in DECIDED[job.join.type]):
        fields["unmatched_delay_ms"] = _percentiles(unmatched_delays(actual, decoded, job))
    return fields


def _percentiles(delays: DataFrame) -> dict[str, float | None]:
    row = delays.agg(F.percentile("delay", [0.5, 0.95, 0.99]).alias("q"), F.avg("delay").alias("mean")).first()
    q = row["q"] or [None] * 3
    return {"p50": q[0], "p95": q[1], "p99": q[2], "mean": row["mean"]}


def plot_delays(delays: DataFrame, stats: dict, title: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = delays.count()
    sample = delays if n <= _PLOT_POINTS else delays.sample(fraction=_PLOT_POINTS / n, seed=1)
    pts = sample.toPandas()
    fig, ax = plt.subplots(figsize=(10, 4.5))
    if len(pts):
        t0 = pts[PRODUCED_MS].min()
        ax.scatter((pts[PRODUCED_MS] - t0) / 1000, pts["delay"], s=2, alpha=0.4, label="result")
        for key, style in (("p50", "--"), ("p99", ":")):
            ax.axhline(stats[key], color="red", linestyle=style, label=f"{key} = {stats[key]:.0f} ms")
        ax.legend(loc="upper right")
    ax.set_xlabel("produced at (s since first result)")
    ax.set_ylabel("production delay (ms)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _stream_info(job: JobSettings) -> list[dict]:
    return [{"name": s.name, "topic": job.topic_of(s), "format": s.format, "key_fields": s.key_fields,
             "time_field": s.time_field, "window": s.window.model_dump(exclude_none=True)} for s in job.streams]


def _input_summary(names: list[str], decoded: list[DataFrame], dead_records: int) -> dict:
    """Input counts per stream, the dead-lettered ones by reason, and the lost ones
    (unparsable, yet never dead-lettered)."""
    counts = [d.agg(F.count(F.lit(1)).alias("n"),
                    F.count_if(F.col("reason").isNotNull()).alias("dead"),
                    F.count_if(~F.col("ok") & F.col("reason").isNull()).alias("lost")).first() for d in decoded]
    by_reason = (reduce(DataFrame.unionByName, [d.filter(F.col("reason").isNotNull()).select("reason")
                                                for d in decoded]).groupBy("reason").count().collect())
    per_stream = {n: int(c["n"]) for n, c in zip(names, counts)}
    return {
        "inputs": {"per_stream": per_stream, "total": sum(per_stream.values())},
        "dead_letter": {"count": sum(int(c["dead"]) for c in counts),
                        "by_reason": {r["reason"]: int(r["count"]) for r in by_reason},
                        "records": dead_records},
        "lost": sum(int(c["lost"]) for c in counts),
    }


def _groups_without_results(accepted: list[DataFrame], watermarks: DataFrame) -> int:
    """Groups with input but not one batch commit: never processed. Count windows
    expect nothing of them (nothing is final there), so the report says so."""
    groups = reduce(DataFrame.unionByName, [a.select("group") for a in accepted]).distinct()
    return groups.join(watermarks, "group", "left_anti").count()


def _actual_refs(results: DataFrame, names: list[str]) -> DataFrame:
    """Decoded results as p<i>, o<i> ref columns and produced_ms."""
    refs = [c for i, n in enumerate(names)
            for c in (_q(ref_columns(n)[0]).alias(_p(i)), _q(ref_columns(n)[1]).alias(_o(i)))]
    return results.select(*refs, PRODUCED_MS)


def _outcome(job: JobSettings, expected: DataFrame, raw_results: DataFrame,
             decoded: list[DataFrame]) -> tuple[dict, DataFrame]:
    """Produced results against the expected ones: the report's result fields, and the delays.
    `bad_records` counts result records that do not decode (they are no result: not compared);
    `bad_ids` decoded results whose id is not the one their refs give; join_type, unmatched and
    unmatched_delay_ms as _unmatched_fields says. `decoded[i]`: stream i's inputs (partition,
    offset, ts, arrival)."""
    names = [s.name for s in job.streams]
    results = decode_results(raw_results, job).localCheckpoint()
    actual = _actual_refs(results.filter(F.col(RECORD_OK)), names)
    diff = compare(expected, actual, len(names))
    totals = results.agg(F.count_if(F.col(RECORD_OK)).alias("n"), F.count_if(~F.col(RECORD_OK)).alias("bad_records"),
                         F.count_if(F.col(RECORD_OK) & ~F.col(ID_OK)).alias("bad_ids")).first()
    delays = production_delays(actual, decoded).localCheckpoint()
    return {"results": int(totals["n"]), "result_records": raw_results.count(), **diff,
            "bad_records": int(totals["bad_records"]), "bad_ids": int(totals["bad_ids"]),
            "delay_ms": _percentiles(delays), **_unmatched_fields(job, expected, actual, decoded)}, delays


def hash_inputs(raw: DataFrame, job: JobSettings) -> tuple[list[DataFrame], DataFrame]:
    """Hash mode: per stream, its input records decoded (decode_inputs) with their `group`
    (key_groups) and `reason`, that of the dead letter standing for the record (null: none);
    and the dead letters. Whatever the reason (malformed, late, oversize, misrouted, ...), a
    dead-lettered record was not joined."""
    dead = decode_dead_letters(raw.filter(F.col("topic") == job.dead_letter_topic)).localCheckpoint()
    decoded = [key_groups(decode_inputs(raw.filter(F.col("topic") == job.topic_of(s)), s), s, job.partitions)
               .join(dead, ["topic", "partition", "offset"], "left") for s in job.streams]
    return decoded, dead


def accepted_inputs(decoded: DataFrame) -> DataFrame:
    """The tuples the join takes: decoded whole and not dead-lettered."""
    return decoded.filter(F.col("ok") & F.col("reason").isNull())


def _verify_hash(job: JobSettings, raw: DataFrame) -> tuple[dict, DataFrame]:
    names = [s.name for s in job.streams]
    decoded, dead = hash_inputs(raw, job)
    raw_results = raw.filter(F.col("topic") == job.results_topic)
    accepted = [accepted_inputs(d) for d in decoded]

    watermarks = final_watermarks(raw.filter(F.col("topic") == job.commits_topic)).localCheckpoint()
    expected = expected_results(accepted, [s.window for s in job.streams], job.join.type,
                                watermarks).localCheckpoint()
    outcome, delays = _outcome(job, expected, raw_results, decoded)
    return {
        **_input_summary(names, decoded, dead.count()),
        **outcome,
        "watermark_bounded": job.emits_on_watermark,
        "groups_without_results": _groups_without_results(accepted, watermarks),
    }, delays


def _verify_ring(job: JobSettings, raw: DataFrame) -> tuple[dict, DataFrame]:
    """Accepted inputs: decoded, not dead-lettered, and released (ts below the final release watermark)."""
    names = [s.name for s in job.streams]
    raw_dead = raw.filter(F.col("topic") == job.dead_letter_topic)
    dead = decode_ring_dead_letters(raw_dead, job).localCheckpoint()
    raw_results = raw.filter(F.col("topic") == job.results_topic)
    # SplitJoin's scale and tick marks ride in the source partitions; they carry no tuple.
    tuples = raw.filter(F.col("headers").getItem(MARK_HEADER).isNull())
    decoded = [mark_dead(decode_tuples(tuples.filter(F.col("topic") == job.topic_of(s)), s), dead).localCheckpoint()
               for s in job.streams]
    release = release_watermark(raw.filter(F.col("topic") == job.commits_topic))
    released = F.col("ts") < F.lit(release) if release is not None else F.lit(False)
    valid = [accepted_inputs(d) for d in decoded]
    terms = compile_terms(names, list(job.join.predicate), job.join.udfs)
    expected = expected_theta_join([v.filter(released) for v in valid], [s.window for s in job.streams],
                                   terms).localCheckpoint()
    outcome, delays = _outcome(job, expected, raw_results, decoded)
    return {
        **_input_summary(names, decoded, raw_dead.count()),
        **outcome,
        "release_watermark": release,
        "unreleased": sum(v.filter(~released).count() for v in valid),
    }, delays


def _check_formats(job: JobSettings) -> None:
    readable = ("json", "blocks") if job.join.mode != "hash" else ("json",)
    unsupported = [s.name for s in job.streams if s.format not in readable]
    if unsupported:
        raise ValueError(f"verify decodes {' and '.join(readable)} inputs in {job.join.mode} mode; "
                         f"streams {unsupported} use another format")


# Report fields any of which, when not 0, means the output is not the exact join.
_MUST_BE_ZERO = ("missing", "extra", "duplicates", "bad_records", "bad_ids", "lost")


def run_verify(job: JobSettings, cluster: Cluster, report_path: Path | None = None,
               plot_path: Path | None = None) -> dict:
    """Verify the job's results topic against the exact join of its inputs; returns the report."""
    _check_formats(job)
    spark = local_session("streamjoin-verify")
    raw = _read(spark, cluster, [*job.input_topics, job.results_topic, job.commits_topic, job.dead_letter_topic])
    checked, delays = (_verify_hash if job.join.mode == "hash" else _verify_ring)(job, raw)
    report = {"job": job.job, "streams": _stream_info(job), **checked}
    report["verified"] = all(report[k] == 0 for k in _MUST_BE_ZERO)
    if report_path is not None:
        report_path.parent.mkdir(parents=True, exist_ok=True)
        report_path.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    if plot_path is not None:
        plot_delays(delays, report["delay_ms"], f"{job.job}: production delay of {report['results']} results "
                                                f"({'verified' if report['verified'] else 'NOT verified'})",
                    plot_path)
    return report
