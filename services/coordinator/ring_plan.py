"""`streamjoin plan ring`: the PSP paper's cost model (engine/psp/cost_model.py) fed
with Table 1's terms measured here and now, on this machine, with the job's
own workload and predicate; and the ring size the coordinator starts with
when `ring.nodes: auto`.

What `calibrate` measures:
  S    per probing step of every arriving stream's join order: pairs passing /
       pairs tried, on random candidate pairs of generated samples
       (services.workloads.sample). Steps chain: a step's inputs are the partial
       results that passed the step before, so correlated terms are measured,
       not assumed independent.
  T_j  the time those evaluations took per pair (the compiled terms, cheap terms
       first and UDFs on survivors, as engine/psp/probe.py does), weighted into
       one T_j by each step's share of equation 1's candidate pairs.
  T_i  concatenating one round's arrivals onto a sample-sized slice, per tuple
       inserted (engine/psp/slices.StreamSlice.insert copies the slice).
  T_p  boolean-filtering one round's oldest tuples out of it, per tuple purged.
  T_s  schemas.codecs.encode_block + decode_block of a sample block, per tuple
       (a hop record is a block, so the client's per-record cost is shared by
       many tuples and left out).
  T_n  with a cluster: the median produce -> consume trip of one small record
       through the broker on a throwaway one-partition topic (a ring hop);
       without: DEFAULT_T_N, and the plan says `T_n_source: default`.
  lambda_i, W_i  workload.rate and each stream's window (rows / rate for counts).

Evaluations run in doubling chunks until STEP_BUDGET_S or MAX_PAIRS_PER_STEP,
so an expensive UDF costs a bounded time, not a fixed number of pairs.
"""

from __future__ import annotations

import statistics
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import structlog
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from rich.console import Console
from rich.table import Table

from streamjoin.engine.block import TS, Block, concat, system_block
from streamjoin.engine.predicates import Term, compile_terms, terms_between
from streamjoin.engine.psp import cost_model
from streamjoin.engine.psp.cost_model import Measurements
from streamjoin.schemas.codecs import decode_block, encode_block
from streamjoin.services import workloads
from streamjoin.services.io import kafka
from streamjoin.settings import JobSettings

log = structlog.get_logger("streamjoin.coordinator.ring_plan")

SAMPLE_ROWS = 512  # tuples generated per stream: selectivity is a property of values, not of window size
STEP_BUDGET_S = 0.25  # evaluation time per probing step (the first chunk always runs)
MAX_PAIRS_PER_STEP = 1 << 18
FIRST_CHUNK = 64
CHUNK_BYTES = 32 << 20  # gathered pair values per chunk, so wide tuples (images) keep memory flat
TIMING_REPEATS = 5
HOP_TRIPS, HOP_WARMUP, HOP_TIMEOUT_S = 20, 3, 10.0
# Trips start after a random pause up to this long: a ring record reaches the consumer at any
# phase of its fetch cycle (fetch.wait.max.ms = 20), while back-to-back trips lock onto one phase
# (measured on Tansu: ~12 ms back to back, 0.7-9 ms at random phases).
HOP_JITTER_S = 0.025
# One hop (produce + flush -> consume) with services/io/kafka.py's client settings on the
# embedded broker over loopback: medians of 4.6-5.3 ms in six calibrations on the development
# machine. A LAN hop to a real cluster adds its round trip; pass --bootstrap to measure it.
DEFAULT_T_N = 0.005

Samples = list[dict[str, np.ndarray]]
Partial = dict[int, np.ndarray]  # member stream -> its sample rows, aligned


# ------------------------------------------------------------ calibration

def calibrate(job: JobSettings, cluster: kafka.Cluster | None, *, sample_rows: int = SAMPLE_ROWS,
              step_budget_s: float = STEP_BUDGET_S) -> Measurements:
    """Table 1's terms for `job` on this machine (see the module docstring for how)."""
    names = [s.name for s in job.streams]
    terms = compile_terms(names, job.join.predicate, job.join.udfs)
    rates = tuple(float(job.workload.rate) for _ in job.streams)
    windows = tuple(_window_seconds(job, i, rates[i]) for i in range(len(names)))
    samples = [workloads.sample(job, i, sample_rows, job.workload.random_state) for i in range(len(names))]
    rng = np.random.default_rng(job.workload.random_state)
    pair_sel = pair_selectivities(samples, terms, rng, step_budget_s)
    orders = _orders(job, cost_model.default_join_order(rates, windows, pair_sel))
    chains = [_chain(samples, a, orders[a], terms, rng, step_budget_s) for a in range(len(names))]
    sels = tuple(tuple(s.selectivity for s in chain) for chain in chains)
    blocks = [_sample_block(job, i, samples[i]) for i in range(len(names))]
    weights = np.asarray(rates) / sum(rates)
    t_i, t_p = (weights @ np.array([_slice_costs(job, b, r) for b, r in zip(blocks, rates)])).tolist()
    t_s, tuple_bytes = (weights @ np.array([_codec_costs(b) for b in blocks])).tolist()
    t_n = _hop_latency(job, cluster, encode_block(blocks[0].take(np.arange(1)))) if cluster else DEFAULT_T_N
    return Measurements(
        T_j=_weighted_t_j(rates, windows, orders, sels, chains), T_p=t_p, T_i=t_i, T_s=t_s, T_n=t_n,
        rates=rates, windows=windows, orders=orders, selectivities=sels, tuple_bytes=tuple_bytes)


def _window_seconds(job: JobSettings, i: int, rate: float) -> float:
    w = job.streams[i].window
    return w.range_ms / 1000 if w.range_ms is not None else w.rows / rate  # type: ignore[operator]


def _orders(job: JobSettings, default: tuple[tuple[int, ...], ...]) -> tuple[tuple[int, ...], ...]:
    """join.order where the job gives one, else section 5.4's default."""
    index = {s.name: i for i, s in enumerate(job.streams)}
    given = {index[a]: tuple(index[n] for n in order) for a, order in job.join.order.items()}
    return tuple(given.get(a, default[a]) for a in range(len(job.streams)))


@dataclass(frozen=True)
class StepSample:
    """One probing step evaluated on sample pairs."""

    pairs: int
    passed: int
    seconds: float
    survivors: Partial  # the next step's inputs

    @property
    def selectivity(self) -> float:
        # No match in the sample: count half a match, not none, which would claim
        # that every later step of this order is free.
        return max(self.passed, 0.5) / self.pairs


def pair_selectivities(samples: Samples, terms: tuple[Term, ...], rng: np.random.Generator,
                       budget_s: float) -> dict[tuple[int, int], float]:
    """S of every pair of streams that a predicate term relates (the join graph's edges)."""
    out = {}
    for i in range(len(samples)):
        for j in range(i + 1, len(samples)):
            between = terms_between(terms, j, frozenset({i}))
            if between:
                start = {i: np.arange(_rows(samples[i]))}
                out[(i, j)] = probe_step(samples, start, j, between, rng, budget_s).selectivity
    return out


def _chain(samples: Samples, arriving: int, order: tuple[int, ...], terms: tuple[Term, ...],
           rng: np.random.Generator, budget_s: float) -> list[StepSample]:
    partial: Partial = {arriving: np.arange(_rows(samples[arriving]))}
    steps = []
    for j in order:
        step = probe_step(samples, partial, j, terms_between(terms, j, frozenset(partial)), rng, budget_s)
        steps.append(step)
        partial = step.survivors
    return steps


def probe_step(samples: Samples, partial: Partial, stream: int, terms: list[Term], rng: np.random.Generator,
               budget_s: float) -> StepSample:
    """Evaluate `terms` on random (partial row, `stream` row) pairs in doubling chunks
    until all are done (at most MAX_PAIRS_PER_STEP) or `budget_s` is spent."""
    rows, n = len(next(iter(partial.values()))), _rows(samples[stream])
    total = min(rows * n, MAX_PAIRS_PER_STEP)
    p, r = rng.integers(rows, size=total), rng.integers(n, size=total)
    chunk_cap = max(FIRST_CHUNK, CHUNK_BYTES // _pair_bytes(samples, terms))
    keep = np.zeros(total, dtype=bool)
    done, seconds, size = 0, 0.0, FIRST_CHUNK
    while done < total and (done == 0 or seconds < budget_s):
        hi = min(total, done + size)
        started = time.perf_counter()
        keep[done:hi] = _matches(samples, partial, p[done:hi], stream, r[done:hi], terms)
        seconds += time.perf_counter() - started
        done, size = hi, min(2 * size, chunk_cap)
    p, r, keep = p[:done], r[:done], keep[:done]
    passed = int(keep.sum())
    if not passed:
        keep[:] = True  # nothing passed: later steps are estimated on unconditioned pairs (independence)
    survivors = {s: rows_of[p[keep]] for s, rows_of in partial.items()} | {stream: r[keep]}
    return StepSample(done, passed, seconds, survivors)


def _matches(samples: Samples, partial: Partial, p: np.ndarray, stream: int, r: np.ndarray,
             terms: list[Term]) -> np.ndarray:
    mask = np.ones(len(p), dtype=bool)
    for t in sorted(terms, key=lambda t: t.kind == "udf"):  # as the engine: cheap terms first
        live = np.flatnonzero(mask)
        values = {s: samples[s][t.side(s)][r[live] if s == stream else partial[s][p[live]]] for s in t.streams}
        mask[live] = t.evaluate(values)
    return mask


def _pair_bytes(samples: Samples, terms: list[Term]) -> int:
    return max(1, sum(samples[s][t.side(s)].dtype.itemsize for t in terms for s in t.streams))


def _rows(sample: dict[str, np.ndarray]) -> int:
    return len(next(iter(sample.values())))


def _weighted_t_j(rates: tuple[float, ...], windows: tuple[float, ...], orders: tuple[tuple[int, ...], ...],
                  sels: tuple[tuple[float, ...], ...], chains: list[list[StepSample]]) -> float:
    """One T_j for equation 1: each step's measured cost per pair, weighted by the pairs
    equation 1 expects of that step (times its arriving stream's rate), so that
    T_j x sum(pairs) equals the sum of per-step costs."""
    weights, costs = [], []
    for a, order in enumerate(orders):
        pairs = cost_model.probe_pairs([rates[i] for i in order], [windows[i] for i in order], sels[a])
        weights += (pairs * rates[a]).tolist()
        costs += [s.seconds / s.pairs for s in chains[a]]
    return float(np.average(costs, weights=weights))


def _sample_block(job: JobSettings, i: int, sample: dict[str, np.ndarray]) -> Block:
    """A sample as the ring moves it: payload beside the system columns."""
    n, ts = _rows(sample), sample[job.streams[i].time_field]
    return system_block(np.zeros(n), ts, np.zeros(n), np.arange(n), ts, sample)


def _timed(fn: Callable[[], Any]) -> float:
    runs = []
    for _ in range(TIMING_REPEATS):
        started = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - started)
    return statistics.median(runs)


def _slice_costs(job: JobSettings, block: Block, rate: float) -> tuple[float, float]:
    """(T_i, T_p): one round's arrivals concatenated onto, and its oldest tuples
    filtered out of, a slice the size of the sample; per tuple inserted or purged."""
    batch = int(np.clip(round(rate * job.ring.round_ms / 1000), 1, max(1, len(block) // 2)))
    arrivals = block.take(np.arange(batch))
    cut = np.sort(block[TS])[batch]
    purged = max(1, int((block[TS] < cut).sum()))
    return (_timed(lambda: concat([block, arrivals])) / batch,
            _timed(lambda: block.filter(block[TS] >= cut)) / purged)


def _codec_costs(block: Block) -> tuple[float, float]:
    """(T_s, encoded bytes per tuple) of a hop record holding `block`."""
    data = encode_block(block)
    return ((_timed(lambda: encode_block(block)) + _timed(lambda: decode_block(data))) / len(block),
            len(data) / len(block))


def _hop_latency(job: JobSettings, cluster: kafka.Cluster, payload: bytes) -> float:
    """Median produce -> consume trip on a throwaway one-partition topic: one ring hop."""
    topic = f"{job.job}.ring.calibrate-{uuid.uuid4().hex[:8]}"
    admin = cluster.admin()
    admin.create_topics([NewTopic(topic, 1, 1)], operation_timeout=HOP_TIMEOUT_S)[topic].result(HOP_TIMEOUT_S)
    producer = cluster.producer()
    consumer = cluster.consumer(f"{job.consumer_group}-calibrate")
    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        pauses = np.random.default_rng(job.workload.random_state).uniform(0, HOP_JITTER_S, HOP_WARMUP + HOP_TRIPS)
        trips = [_trip(producer, consumer, topic, payload, pause) for pause in pauses]
        return statistics.median(trips[HOP_WARMUP:])
    finally:
        consumer.close()
        _drop_topic(admin, topic)


def _trip(producer: Producer, consumer: Consumer, topic: str, payload: bytes, pause: float) -> float:
    time.sleep(pause)
    started = time.perf_counter()
    producer.produce(topic, payload, partition=0)
    producer.flush(HOP_TIMEOUT_S)  # a node flushes its sends once per round
    while time.perf_counter() - started < HOP_TIMEOUT_S:
        msg = consumer.poll(0.05)
        if msg is not None and msg.error() is None:
            return time.perf_counter() - started
    raise RuntimeError(f"calibration record did not come back from {topic} within {HOP_TIMEOUT_S} s")


def _drop_topic(admin: AdminClient, topic: str) -> None:
    try:
        admin.delete_topics([topic], operation_timeout=HOP_TIMEOUT_S)[topic].result(HOP_TIMEOUT_S)
    except Exception as e:  # a leftover one-record topic is harmless; say so and go on
        log.warning("could not delete calibration topic", topic=topic, error=str(e))


# ------------------------------------------------------------ the plan

def choose_ring_size(job: JobSettings, measurements: Measurements) -> int:
    """Ring size at start for `ring.nodes: auto`: the least-latency N in 1..ring.max_nodes
    that keeps up with the offered load (cost_model.best_ring_size)."""
    return cost_model.best_ring_size(cost_model.size_table(measurements, job.ring.max_nodes))


def plan_ring(job: JobSettings, cluster: kafka.Cluster | None) -> dict[str, Any]:
    """Calibrate, then equations 1-6 for N = 1..ring.max_nodes, as a JSON-able dict."""
    m = calibrate(job, cluster)
    names = [s.name for s in job.streams]
    rows = cost_model.size_table(m, job.ring.max_nodes)
    pt = cost_model.per_tuple(m)
    size = cost_model.optimal_ring_size(m.m, m.T_n, pt.l_c, m.T_s * pt.transfers, job.ring.max_nodes)
    return {
        "job": job.job,
        "measurements": _measurements_json(m, names, "measured" if cluster else "default"),
        "join_order": {names[a]: [names[i] for i in order] for a, order in enumerate(m.orders)},
        "per_tuple": {"L_C_s": pt.l_c, "hop_tuples": pt.transfers, "results": pt.results},
        "offered_load": sum(m.rates),
        "rows": [{"N": r.n, "service_rate": r.service_rate, "capacity": r.capacity, "latency_s": r.latency,
                  "output_rate": r.output_rate, "bandwidth_bytes_s": r.bandwidth, "keeps_up": r.keeps_up}
                 for r in rows],
        "best_N": cost_model.best_ring_size(rows),
        "latency_argmin_N": size.argmin,
        "best_N_closed_form": size.closed_form,
        "closed_form": {"N1": size.n1, "N2": size.n2},
    }


def _measurements_json(m: Measurements, names: list[str], t_n_source: str) -> dict[str, Any]:
    return {
        "T_j": m.T_j, "T_p": m.T_p, "T_i": m.T_i, "T_s": m.T_s, "T_n": m.T_n, "T_n_source": t_n_source,
        "rates": dict(zip(names, m.rates)), "windows_s": dict(zip(names, m.windows)),
        "selectivities": {names[a]: list(s) for a, s in enumerate(m.selectivities)},
        "tuple_bytes": m.tuple_bytes,
    }


def render_plan(plan: dict[str, Any], console: Console) -> None:
    """The plan as a table (one row per N, the chosen one marked) and the measurements."""
    table = Table(title=f"PSP ring plan: {plan['job']}, offered load {plan['offered_load']:g} tuples/s")
    for col in ("N", "mu /s", "N*mu /s", "keeps up", "latency ms", "output /s", "hop MB/s", ""):
        table.add_column(col, justify="right")
    for r in plan["rows"]:
        table.add_row(str(r["N"]), f"{r['service_rate']:.4g}", f"{r['capacity']:.4g}",
                      "yes" if r["keeps_up"] else "no", f"{r['latency_s'] * 1e3:.4g}", f"{r['output_rate']:.4g}",
                      f"{r['bandwidth_bytes_s'] / 1e6:.3g}", "best" if r["N"] == plan["best_N"] else "")
    console.print(table)
    m, cf = plan["measurements"], plan["closed_form"]
    console.print(f"least latency (eq. 5) at N={plan['latency_argmin_N']}; section 5.2 closed form "
                  f"N={plan['best_N_closed_form']} (N1 {cf['N1']:.3g}, N2 {cf['N2']:.3g}); "
                  f"L_C {plan['per_tuple']['L_C_s'] * 1e3:.4g} ms per tuple")
    console.print(f"T_j {m['T_j'] * 1e6:.4g} us/pair, T_i {m['T_i'] * 1e6:.4g} us, T_p {m['T_p'] * 1e6:.4g} us, "
                  f"T_s {m['T_s'] * 1e6:.4g} us, T_n {m['T_n'] * 1e3:.4g} ms ({m['T_n_source']}), "
                  f"{m['tuple_bytes']:.0f} B/tuple")
    for stream, order in plan["join_order"].items():
        sels = ", ".join(f"{s:.3g}" for s in m["selectivities"][stream])
        console.print(f"{stream} probes {' -> '.join(order)} (S per step: {sels})")
