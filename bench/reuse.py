"""`streamjoin bench reuse`: the operator-sharing paper's method on its airline workload (the Delta
OIS example), N continuous queries planned three ways and run in the same process on the
same data:

  none   one operator per query, what Flink, Kafka Streams and Spark deploy (the peer);
  exact  share an operator only when it answers a query unchanged (containment);
  relax  the paper's: widen an operator and compensate, by the network-usage cost model.

Spark `sources` writes the airline workload (streamjoin/jobs/airline.yaml) into the run's
embedded broker; it is read back once. For each N and strategy the N template queries
(bench/query_templates.py) are registered one by one with topology/reuse/planner.py,
its statistics measured on the produced data. Then the final operator set runs in steady
state: every operator's join over the whole input with the workers' engine, each query's
compensation on its operator's results (bench/reuse_exec.py). Measured:

  operators     deployed at the end; deployments = fresh operators + relaxations (each
                relaxation starts a new operator version);
  Kafka bytes   each operator reads its sources' whole topics (keys and values);
  network       bytes crossing regions: every source topic an operator pulls from the
                source's region into its own, and every query's compensated results (its
                sink records, compact JSON) from the operator's region to the sink's;
                unweighted (bytes between different regions) and weighted (bytes x the
                latency matrix, the diagonal included: the paper's network usage);
  join CPU      process CPU seconds of the operators' batches (source filter, join) and
                of the compensations; decoding is counted apart: the measured CPU
                seconds to decode each topic once, times the operators reading it;
  planning      wall ms of Planner.plan per query (median, p99), again with 10,000
                synthetic operators registered (probing with the same queries, nothing
                recorded); time to deploy = the planning of all N queries plus the
                deployments, each at the measured cost of creating an operator
                version's topics on the broker (starting its worker is the same for
                every deployment and not measured here);
  exactness     for a sample of each strategy's queries, its compensated output against
                the query joined alone (its own operator, same engine): missing, extra,
                duplicate results and differing projected values must all be 0; and for
                every query, its result count and an order-independent checksum of its
                results (ids and projected values) against "none", which runs each query
                on its own operator.

Steady state: the figures above count only the event time after `warmup_s` (the full
run's is the longest RANGE, 10 minutes, so every window is full; --quick has none), per
second of it. The data spans `seconds` of event time, shorter than the queries' lifetimes,
so every query covers it whole; registration happens before the first tuple (no backfill), so the
figures are the final plan's steady state, not the switches on the way to it. The engine
is deterministic: an operator whose definition and queries an earlier run (another
strategy, or N = 100, whose queries are N = 1000's first) already had is not run again,
its measured figures count again (`operator_runs_reused` says how many).
`--quick`: N = 100 on 5 s of a denser workload (160 check-ins/s: about the tuples of 20 s at
40/s, since Spark's start-up, not the event time, is most of its wall time) and fewer synthetic
operators.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from streamjoin.bench import report
from streamjoin.bench.env import BenchEnv
from streamjoin.bench.reuse_exec import (Inputs, KeyCache, compare, compensate, digest, measure_statistics,
                                         read_inputs, run_operator, sink_bytes)
from streamjoin.bench.reuse_plan import (SEED, STRATEGIES, Planned, operator_deploy_seconds, plan_all,
                                         planning_at_scale, planning_figures, registrations)
from streamjoin.engine.block import Block
from streamjoin.engine.result_ids import EVENT_TIME
from streamjoin.job_files import job_file
from streamjoin.schemas.query import Registration
from streamjoin.services.queries.router import sink_layout
from streamjoin.settings import JobSettings, load
from streamjoin.topology import topics
from streamjoin.topology.reuse.compensation import compensation
from streamjoin.topology.reuse.cost import Statistics
from streamjoin.topology.reuse.operator import OperatorDef, for_query
from streamjoin.topology.reuse.planner import Planner

JOB_FILE = job_file("airline.yaml")
PAPER_CLAIMS = {"network_reduction": 0.96, "cpu_factor": 10.0}


@dataclass(frozen=True)
class Setup:
    seconds: float  # event time the sources write
    rate: float  # workload.rate (check-ins/s; the other streams scale by rate_factors)
    flights_per_carrier: int  # fewer flights: more tuples per flight and window, so a short run joins
    counts: tuple[int, ...]  # N: queries per run
    partitions: int
    sample: int  # queries per strategy checked exact
    batch_ms: int  # event time per engine batch
    synthetic: int  # operators registered for the planning-at-scale figure
    warmup_s: float  # event time before the measured part: the longest RANGE fills the windows

    def __post_init__(self) -> None:
        if not 0 <= self.warmup_s < self.seconds:
            raise ValueError(f"warmup_s ({self.warmup_s}) must lie in [0, seconds={self.seconds}): "
                             "something must be left to measure")


# Every operator pays the engine's per-batch cost; the full run's 2 s batches keep 1,000 operators
# within reach of this machine and, if anything, flatter "none" (fewer batches per operator).
FULL = Setup(seconds=840.0, rate=50.0, flights_per_carrier=200, counts=(100, 1000), partitions=12, sample=25,
             batch_ms=2000, synthetic=10_000, warmup_s=600.0)
QUICK = Setup(seconds=5.0, rate=160.0, flights_per_carrier=20, counts=(100,), partitions=4, sample=10, batch_ms=1000,
              synthetic=200, warmup_s=0.0)


def airline_job(setup: Setup) -> JobSettings:
    """airline.yaml with the setup's partitions, rate, flights and span."""
    job = load(JOB_FILE)
    workload = job.workload.model_copy(update={"rate": setup.rate, "seconds": setup.seconds,
                                               "flights_per_carrier": setup.flights_per_carrier})
    return job.model_copy(update={"partitions": setup.partitions, "workload": workload})


def run(env: BenchEnv, quick: bool, plot_path: Path | None) -> dict:
    from streamjoin.services.spark.sources import run_sources

    setup = QUICK if quick else FULL
    job = airline_job(setup)
    topics.ensure(env.cluster.admin(), job)
    with env.phase(f"Spark sources: {setup.seconds:g}s of the airline workload"):
        produced = run_sources(job, env.cluster, seconds=setup.seconds, rate=setup.rate)
    with env.phase("reading the input back"):
        inputs = read_inputs(job, env.cluster)
    stats = measure_statistics(job, inputs)
    deploy_s = operator_deploy_seconds(env, job)
    keys = KeyCache(inputs, {s.name: s for s in job.streams})
    cache = RunCache()
    runs = {n: run_count(env, job, setup, inputs, keys, stats, n, deploy_s, cache) for n in setup.counts}
    with env.phase(f"planning against {setup.synthetic} synthetic operators"):
        at_scale = planning_at_scale(job, stats, setup.synthetic, setup.counts[0], inputs.t0_ms)
    result = assemble(job, setup, quick, produced, inputs, deploy_s, runs, at_scale)
    if plot_path is not None:
        plot(result, plot_path)
        result["plot"] = str(plot_path)
    return result


# ---------------------------------------------------------------- running


def run_count(env: BenchEnv, job: JobSettings, setup: Setup, inputs: Inputs, keys: KeyCache, stats: Statistics,
              n: int, deploy_s: float, cache: RunCache) -> dict:
    """Every strategy for N = n: planned, run (operators `cache` holds are not run again),
    measured and checked for exactness."""
    regs = registrations(job, n, SEED, inputs.t0_ms)
    sample = sampled(regs, setup.sample)
    with env.phase(f"N={n}: each sampled query joined alone"):
        alone = {reg.id: standalone(job, reg, inputs, keys, setup.batch_ms) for reg in sample}
    run = Run(job, setup, inputs, keys, {r.id: r for r in regs}, frozenset(r.id for r in sample), cache)
    span_s = (inputs.t1_ms - run.measured_from_ms) / 1000.0
    tallies, figures = {}, {}
    for strategy in STRATEGIES:
        with env.phase(f"N={n}: planning with reuse={strategy}"):
            planned = plan_all(job, strategy, regs, stats)
        tallies[strategy] = execute(env, run, planned, f"N={n} {strategy}")
        figures[strategy] = tallies[strategy].figures(len(planned.planner.operators()), span_s)
        figures[strategy] |= planning_figures(planned, deploy_s)
    # "none" runs every query on its own operator: its outputs are each query's standalone join.
    for strategy, tally in tallies.items():
        figures[strategy]["exactness"] = exactness(tally.sampled, alone, sample) | {
            "all_queries": digest_check(tally.digests, tallies["none"].digests)}
    return {"queries": n, "strategies": figures, "ratios": count_ratios(figures)}


def sampled(regs: Sequence[Registration], count: int) -> list[Registration]:
    """`count` registrations spread evenly over `regs` (every template shows up)."""
    step = max(1, len(regs) // max(count, 1))
    return list(regs[::step][:count])


def standalone(job: JobSettings, reg: Registration, inputs: Inputs, keys: KeyCache, batch_ms: int) -> Block:
    """`reg`'s query joined alone: its own operator (its own filters and windows), same engine."""
    op = for_query(reg, reg.region)
    results = run_operator(job, f"alone-{reg.id}", op, inputs, keys, batch_ms).results
    return compensate(results, compensation(op, reg), reg.start_ms, reg.end_ms)


@dataclass
class Tally:
    """What a strategy's operators cost and produced, summed as they run: bytes read from Kafka,
    bytes crossing regions (pulled sources, query results) and weighted by the latency matrix
    (byte x ms), CPU seconds, tuples and results; each query's `digest`, and the outputs of the
    sampled queries."""

    kafka_bytes: int = 0
    crossing_pull: int = 0
    crossing_results: int = 0
    weighted: float = 0.0
    join_s: float = 0.0
    compensation_s: float = 0.0
    decode_s: float = 0.0
    operator_inputs: int = 0
    operator_results: int = 0
    query_results: int = 0
    reused_runs: int = 0
    digests: dict[str, tuple[int, int]] = field(default_factory=dict)
    sampled: dict[str, Block] = field(default_factory=dict)

    def hop(self, size: int, source: str, target: str, latency: float, pulled: bool) -> None:
        """`size` bytes from region `source` to `target` (a source pull or results)."""
        self.weighted += size * latency
        if source != target:
            if pulled:
                self.crossing_pull += size
            else:
                self.crossing_results += size

    def figures(self, operators: int, span_s: float) -> dict:
        """The strategy's report figures (rates per second of event time)."""
        crossing = self.crossing_pull + self.crossing_results
        return {
            "operators": operators,
            "kafka_bytes": self.kafka_bytes,
            "network": {"crossing_bytes": crossing, "crossing_bytes_source_pull": self.crossing_pull,
                        "crossing_bytes_results": self.crossing_results, "crossing_bytes_per_s": crossing / span_s,
                        "weighted_byte_ms": self.weighted, "weighted_byte_ms_per_s": self.weighted / span_s},
            "cpu": {"join_s": round(self.join_s, 4), "compensation_s": round(self.compensation_s, 4),
                    "join_and_compensation_s": round(self.join_s + self.compensation_s, 4),
                    "decode_s_estimate": round(self.decode_s, 4)},
            "operator_input_tuples": self.operator_inputs, "operator_results": self.operator_results,
            "query_results": self.query_results,
            "operator_runs_reused": self.reused_runs,
        }


@dataclass(frozen=True)
class Joined:
    """An operator run's figures: CPU seconds, input tuples past its source filter, results."""

    cpu_s: float
    input_tuples: int
    results: int


@dataclass(frozen=True)
class Served:
    """One query's compensated output on an operator as the report counts it: results, sink
    bytes, `digest`, compensation CPU seconds, and the output itself when it was sampled."""

    results: int
    sink_bytes: int
    digest: tuple[int, int]
    compensation_s: float
    output: Block | None


@dataclass
class RunCache:
    """Operators already run, by definition, and what they served each query. The engine is
    deterministic, so an operator with the same definition and queries (another strategy's or
    a smaller N's: N = 100's queries are N = 1000's first) is not run again; its measured
    figures count again."""

    joined: dict[OperatorDef, Joined] = field(default_factory=dict)
    served: dict[tuple[OperatorDef, str], Served] = field(default_factory=dict)

    def holds(self, op: OperatorDef, queries: Sequence[str], sample: frozenset[str]) -> bool:
        """Whether `op` ran with every one of `queries`, keeping the outputs of those in `sample`."""
        return op in self.joined and all(
            (op, q) in self.served and (q not in sample or self.served[(op, q)].output is not None) for q in queries)


@dataclass(frozen=True)
class Run:
    """What one strategy's execution reads: the job, the setup, the input and its keys, the
    registrations by id, the ids whose outputs are kept for the sample check, and the runs so far."""

    job: JobSettings
    setup: Setup
    inputs: Inputs
    keys: KeyCache
    regs: dict[str, Registration]
    sample: frozenset[str]
    cache: RunCache

    @property
    def measured_from_ms(self) -> int:
        """Where the measured (steady) part of the input starts."""
        return self.inputs.t0_ms + int(self.setup.warmup_s * 1000)


def execute(env: BenchEnv, run: Run, planned: Planned, label: str) -> Tally:
    """Run every operator of `planned` over the input and compensate for each of its queries."""
    tally = Tally()
    operators = planned.planner.operators()
    with Progress(TextColumn(f"[bold cyan]bench reuse[/] {label}: operators"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=env.console) as progress:
        task = progress.add_task(label, total=len(operators))
        for op_id, state in operators.items():
            if run.cache.holds(state.definition, state.queries, run.sample):
                tally.reused_runs += 1
            else:
                join_and_serve(run, planned.planner, op_id, state.definition, state.queries)
            count(run, state.definition, state.queries, tally)
            progress.advance(task)
    return tally


def join_and_serve(run: Run, planner: Planner, op_id: str, op: OperatorDef, queries: Sequence[str]) -> None:
    """Run operator `op_id` (definition `op`) and compensate its results for each of its
    `queries`, recording both in the run's cache."""
    joined = run_operator(run.job, op_id, op, run.inputs, run.keys, run.setup.batch_ms, run.measured_from_ms)
    steady = joined.results.filter(joined.results[EVENT_TIME] >= run.measured_from_ms)
    run.cache.joined[op] = Joined(joined.cpu_s, joined.input_tuples, len(steady))
    for query_id in queries:
        reg = run.regs[query_id]
        began = time.process_time()
        measured = compensate(steady, planner.compensation(query_id), reg.start_ms, reg.end_ms)
        spent = time.process_time() - began
        # Exactness covers every result, the warm-up's too.
        out = compensate(joined.results, planner.compensation(query_id), reg.start_ms, reg.end_ms)
        run.cache.served[(op, query_id)] = Served(
            len(measured), sink_bytes(sink_layout(run.job, reg.query, reg.id), measured),
            digest(out, [str(c) for c in reg.query.columns]), spent, out if query_id in run.sample else None)


def count(run: Run, op: OperatorDef, queries: Sequence[str], tally: Tally) -> None:
    """Add operator `op`'s run, its source pulls and its queries' outputs to `tally`."""
    spec = run.job.queries
    joined = run.cache.joined[op]
    tally.join_s += joined.cpu_s
    tally.operator_results += joined.results
    tally.operator_inputs += joined.input_tuples
    for stream in op.sources:
        size = run.inputs.bytes_from(stream, run.measured_from_ms)
        tally.kafka_bytes += size
        tally.decode_s += run.inputs.decode_cpu_s[stream] * size / max(run.inputs.topic_bytes[stream], 1)
        source = spec.source_regions.get(stream, spec.regions[0])
        tally.hop(size, source, op.region, spec.latency(source, op.region), pulled=True)
    for query_id in queries:
        reg, served = run.regs[query_id], run.cache.served[(op, query_id)]
        tally.compensation_s += served.compensation_s
        tally.query_results += served.results
        tally.hop(served.sink_bytes, op.region, reg.region, spec.latency(op.region, reg.region), pulled=False)
        tally.digests[query_id] = served.digest
        if query_id in run.sample:
            tally.sampled[query_id] = served.output


def digest_check(found: dict[str, tuple[int, int]], alone: dict[str, tuple[int, int]]) -> dict:
    """Every query's (results, checksum) against its standalone join's: how many queries differ."""
    return {"queries_checked": len(alone),
            "count_mismatches": sum(found[q][0] != alone[q][0] for q in alone),
            "checksum_mismatches": sum(found[q] != alone[q] for q in alone)}


def exactness(shared: dict[str, Block], alone: dict[str, Block], sample: Sequence[Registration]) -> dict:
    """Each sampled query's compensated output against its standalone join, summed."""
    totals = {"queries_checked": len(sample), "results": 0, "missing": 0, "extra": 0, "duplicates": 0,
              "alone_duplicates": 0, "differing_values": 0}
    for reg in sample:
        verdict = compare(shared[reg.id], alone[reg.id], [str(c) for c in reg.query.columns])
        for key, value in verdict.items():
            totals[key] += value
    return totals


# ---------------------------------------------------------------- report


def count_ratios(figures: dict) -> dict:
    """relax/none and exact/none for network use, Kafka reads, CPU and operators."""
    out = {}
    peer = figures["none"]
    for ours in ("relax", "exact"):
        mine = figures[ours]
        out[f"{ours}_vs_none"] = {
            "network_weighted": report.ratio(mine["network"]["weighted_byte_ms"], peer["network"]["weighted_byte_ms"],
                                             "network usage, bytes x latency", "byte*ms"),
            "network_crossing": report.ratio(mine["network"]["crossing_bytes"], peer["network"]["crossing_bytes"],
                                             "bytes crossing regions", "bytes"),
            "kafka_bytes": report.ratio(mine["kafka_bytes"], peer["kafka_bytes"], "bytes read from Kafka", "bytes"),
            "join_cpu": report.ratio(mine["cpu"]["join_and_compensation_s"], peer["cpu"]["join_and_compensation_s"],
                                     "join + compensation CPU", "s"),
            "cpu_with_decoding": report.ratio(
                mine["cpu"]["join_and_compensation_s"] + mine["cpu"]["decode_s_estimate"],
                peer["cpu"]["join_and_compensation_s"] + peer["cpu"]["decode_s_estimate"],
                "join + compensation + decoding CPU", "s"),
            "operators": report.ratio(mine["operators"], peer["operators"], "deployed operators", "operators"),
        }
    return out


def paper_comparison(runs: dict) -> dict:
    """Per N, relax's network reduction and CPU factor against the operator-sharing paper's claims."""
    out = {}
    for n, r in runs.items():
        ratios = r["ratios"]["relax_vs_none"]
        reduction = 1 - ratios["network_weighted"]["ratio"] if ratios["network_weighted"]["ratio"] is not None else None
        factor = 1 / ratios["join_cpu"]["ratio"] if ratios["join_cpu"]["ratio"] else None
        out[str(n)] = {"network_reduction": reduction, "cpu_factor": factor,
                       "beats_network_claim": reduction is not None and reduction > PAPER_CLAIMS["network_reduction"],
                       "beats_cpu_claim": factor is not None and factor > PAPER_CLAIMS["cpu_factor"]}
    return out


def all_exact(runs: dict) -> bool:
    """No strategy lost, added, duplicated or changed a result of any query checked."""
    return all(f["exactness"][k] == 0 and f["exactness"]["all_queries"]["checksum_mismatches"] == 0
               for r in runs.values() for f in r["strategies"].values()
               for k in ("missing", "extra", "duplicates", "differing_values"))


def parameters(job: JobSettings, setup: Setup, quick: bool, produced: dict, inputs: Inputs, deploy_s: float) -> dict:
    w = job.workload
    return {
        "mode": "quick" if quick else "full", "setup": setup.__dict__, "random_state": SEED,
        "streams": [s.name for s in job.streams], "source_regions": job.queries.source_regions,
        "regions": job.queries.regions, "latency_ms": job.queries.latency_ms,
        "workload": {"rate": w.rate, "rate_factors": w.rate_factors, "carriers": w.carriers,
                     "carrier_skew": w.carrier_skew, "flights_per_carrier": w.flights_per_carrier,
                     "terminals": w.terminals, "cities": w.cities},
        "produced": produced, "tuples": inputs.tuples, "topic_bytes": inputs.topic_bytes,
        "event_time_span_s": (inputs.t1_ms - inputs.t0_ms) / 1000.0,
        "measured_span_s": (inputs.t1_ms - inputs.t0_ms) / 1000.0 - setup.warmup_s,
        "operator_deploy_s": deploy_s,
        "generator": "Spark sources (services/spark/sources.py), read back once",
    }


def assemble(job: JobSettings, setup: Setup, quick: bool, produced: dict, inputs: Inputs, deploy_s: float,
             runs: dict, at_scale: dict) -> dict:
    """The report: relax and exact as ours, none as the peer, ratios per N."""
    by_n = {str(n): r for n, r in runs.items()}
    return {
        "workload": "reuse",
        "exact": all_exact(runs),
        "parameters": parameters(job, setup, quick, produced, inputs, deploy_s),
        "ours": {n: {s: r["strategies"][s] for s in ("relax", "exact")} for n, r in by_n.items()},
        "peers": {n: {"none": r["strategies"]["none"]} for n, r in by_n.items()},
        "ratios": {n: r["ratios"] for n, r in by_n.items()},
        "paper_claims": PAPER_CLAIMS,
        "against_paper_claims": paper_comparison(runs),
        "planning_at_scale": {"synthetic_operators": setup.synthetic, "probe_queries": setup.counts[0],
                              "strategies": at_scale},
    }


PANELS = (("operators", lambda f: f["operators"], "deployed operators", None),
          ("network", lambda f: f["network"]["weighted_byte_ms"], "network usage (bytes x latency)",
           1 - PAPER_CLAIMS["network_reduction"]),
          ("crossing", lambda f: f["network"]["crossing_bytes"], "bytes crossing regions", None),
          ("kafka", lambda f: f["kafka_bytes"], "bytes read from Kafka", None),
          ("cpu", lambda f: f["cpu"]["join_and_compensation_s"], "join + compensation CPU",
           1 / PAPER_CLAIMS["cpu_factor"]))


def plot(result: dict, path: Path) -> None:
    """Per figure, each strategy's value as a share of none's (log scale, labelled), per N;
    the operator-sharing paper's claims (96% less network use, 10x less computation) as dashed lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    counts = list(result["ours"])
    fig, axes = plt.subplots(1, len(PANELS), figsize=(16, 4.4), sharey=True)
    width = 0.8 / len(STRATEGIES)
    for ax, (_, value, label, claim) in zip(axes, PANELS):
        for i, strategy in enumerate(STRATEGIES):
            shares = [value(_strategy(result, n, strategy)) / max(value(_strategy(result, n, "none")), 1e-12)
                      for n in counts]
            bars = ax.bar(np.arange(len(counts)) + i * width, shares, width, label=strategy, color=f"C{i}")
            ax.bar_label(bars, [f"{v:.3g}" for v in shares], fontsize=7)
        if claim is not None:
            ax.axhline(claim, color="red", linestyle="--", linewidth=1, label="the paper's claim")
        ax.set_xticks(np.arange(len(counts)) + width, [f"N={n}" for n in counts])
        ax.set_yscale("log")
        ax.set_ylim(1e-3, 2)
        ax.set_title(label, fontsize=10)
        ax.grid(alpha=0.3, axis="y")
    axes[0].set_ylabel("share of none (one operator per query)")
    axes[1].legend(fontsize=8, loc="lower left")
    p = result["parameters"]
    fig.suptitle(f"operator sharing, airline workload ({p['mode']}): {p['measured_span_s']:.0f}s measured after "
                 f"{p['setup']['warmup_s']:.0f}s of warm-up, "
                 f"{len(p['regions'])} regions; lower is better", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _strategy(result: dict, n: str, strategy: str) -> dict:
    return result["peers"][n]["none"] if strategy == "none" else result["ours"][n][strategy]
