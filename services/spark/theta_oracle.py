"""`verify`'s oracle for ring and splitjoin modes: the exact multi-way theta
join (`expected_theta_join`) of predicate terms (equality, band and UDF terms),
computed with Spark SQL. SplitJoin's merger writes the same release records as
the ring head, so one oracle serves both.

Contract: engine/reference.py reference_theta_join. A result is a
combination, one tuple per stream, with every predicate term true on its
pair and every member inside its window at the trigger t, the combination's
newest member in the global order (ts, stream, partition, offset); T = ts(t).
Each member gets two exclusive bounds, so one rule covers both window kinds
and any number of streams:
  RANGE W:  T - ts < W                                   <=>  T < ut = ts + W
  ROWS  N:  fewer than N tuples of its stream after it, not after t
                                                         <=>  g(t) < ug = g of its stream's N-th next tuple
where g is a tuple's rank in the global order over every stream's accepted
tuples (no bound: NO_BOUND). A combination is a result when
max ts < min ut and max g < min ug over its members (the trigger is the
member of greatest g, and has the greatest ts). Both maxima only grow as
streams join, so partial combinations are pruned at every step.

No nested loops where a key will do: equality terms are join keys; band
terms (and, when no term relates a stream to those joined, the time band
max(W_i, W_j) that two RANGE windows imply) are bucket keys whose new side
is spread over the neighbouring buckets. A UDF term runs once per candidate
pair of its two streams, into a pair table the multi-way join then meets on
refs: the two streams are co-grouped by the same keys (Spark's Arrow
cogroup) and each group's pairs checked in NumPy with Term.evaluate, i.e.
the callable engine.predicates.load_udf registered, on the arrays the
engine would pass it.
"""

from __future__ import annotations

from functools import reduce
from typing import Callable, Sequence

import numpy as np
import pyarrow as pa
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import IntegerType, LongType, StructField, StructType

from streamjoin.engine.predicates import Term, evaluate_isolated, terms_between
from streamjoin.schemas.columns import fixed_width_array
from streamjoin.schemas.results import EVENT_TIME
from streamjoin.services.spark.join_columns import NO_BOUND, all_of, o_ref, p_ref, ref_names
from streamjoin.settings import WindowSpec

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
        ut = F.col("ts") + F.lit(window.range_ms) if window.range_ms is not None else F.lit(NO_BOUND)
        ug = (F.coalesce(F.lead("g", window.rows).over(Window.orderBy("g")), F.lit(NO_BOUND))
              if window.rows is not None else F.lit(NO_BOUND))
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
    schema = StructType([StructField(p_ref(a), IntegerType()), StructField(o_ref(a), LongType()),
                         StructField(p_ref(b), IntegerType()), StructField(o_ref(b), LongType())])
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
        return pa.table([lcols[p_ref(a)][ii], lcols[o_ref(a)][ii], rcols[p_ref(b)][jj], rcols[o_ref(b)][jj]],
                        schema=out)

    return match


def _spans(n: int, step: int) -> list[tuple[int, int]]:
    step = max(1, step)
    return [(lo, min(n, lo + step)) for lo in range(0, n, step)]


def _pairs_passing(term: Term, plain: list[Term], lcols: dict[str, np.ndarray], rcols: dict[str, np.ndarray],
                   lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    """Left rows lo..hi against every right row: windows and plain terms first, then the UDF."""
    a, b = term.left[0], term.right[0]
    nr = len(rcols[p_ref(b)])
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
        acc = acc.join(pairs[first], [p_ref(j), o_ref(j)]).join(side, [p_ref(new), o_ref(new)])
        for n in rest:
            refs = [p_ref(terms[n].left[0]), o_ref(terms[n].left[0]),
                    p_ref(terms[n].right[0]), o_ref(terms[n].right[0])]
            acc = acc.join(pairs[n], refs, "leftsemi")
    else:
        acc = _blocked_join(acc, side, _keys(plain, new, members, windows))
    return acc.filter(all_of([_inside([*members, new]), *[_holds(t) for t in plain]]))


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
    return acc.select(*ref_names(m), _greatest([F.col(f"ts{i}") for i in range(m)]).alias(EVENT_TIME))
