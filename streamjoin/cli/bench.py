"""`streamjoin bench WORKLOAD` (the `bench` extra): its options checked before anything starts
(a bad one exits 2), the run, its JSON and its exit code. The benchmark modules are imported
only here, inside the command, so the CLI starts where the extra is not installed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from streamjoin.cli.common import console, extra_needed, require_extra

MAX_SKEW_WORKERS = 8  # skew's runs are for a few workers: each one is a process of its own


def bench(
    workload: Annotated[str, typer.Argument(
        help="equijoin | band | psp | adapt (groups that move: migration, failover, skew, rate ramp) | "
             "delay (production delay at 5,000 tuples/s per stream, 2 workers, per partition count) | "
             "spill (state spill policies and disk/distributed adaptation, in-process, no broker) | "
             "splitjoin (k SplitJoin cores and the merger against the PSP ring, order and precision) | "
             "reuse (N airline continuous queries with operator sharing off, exact-only and relaxed) | "
             "asof (orders joined with the customer row valid at their time, beside Quix Streams and PyFlink) | "
             "nexmark (Nexmark's join queries q3, q8 and q20 beside PyFlink and Spark, and Flink's published "
             "figures) | "
             "skew (a hot key split over workers against the same job unsplit, beside Spark and PyFlink) | "
             "window (a tumbling-window join beside Spark's windowed stream-stream join and PyFlink's window join)")],
    quick: Annotated[bool, typer.Option("--quick", help="small enough for CI (a minute or two)")] = False,
    json_path: Annotated[Optional[Path], typer.Option("--json", help="write the result JSON here")] = None,
    plot: Annotated[Optional[Path], typer.Option("--plot", help="write the curve PNG here")] = None,
    nodes: Annotated[Optional[str], typer.Option(
        "--nodes", help="band only: ring sizes as a comma list (e.g. 1,2,4), run as a scaling curve on the time "
                        "window; the JSON's `scaling` gives each N's sustained tuples/s and its ratio to N=1")] = None,
    durability: Annotated[bool, typer.Option(
        "--durability", help="band only: every run again with ring.recovery off; the JSON's `durability` gives "
                             "both rates and what crash recovery costs")] = False,
    scale: Annotated[Optional[str], typer.Option(
        "--scale", help="equijoin only: worker counts as a comma list (e.g. 1,2,4,8,12), run instead of the sweep "
                        "as a scale-out curve: one backlog preloaded without Spark, drained with each count; the "
                        "JSON gives tuples/s, speedup, CPU of workers and broker, and the raw-consume limit")] = None,
    workers: Annotated[Optional[int], typer.Option(
        "--workers", help="skew only: workers per run, 2-4 on a small machine (default 3; --quick: 2)")] = None,
    headline: Annotated[bool, typer.Option(
        "--headline", help="skew only: the headline case alone (one key at 40% of the input), not the sweep")] = False,
) -> None:
    """Benchmark a workload against its peers, measured in the same run; exits 1 if our output is not exact.

    SIGTERM or Ctrl-C stops every process it started (broker included) and exits 0, no report."""
    require_extra("bench", "psutil", "matplotlib")  # pyspark: only the workloads that run Spark import it
    from streamjoin.services.shutdown import Stopped, raise_on_signals

    raise_on_signals()
    try:
        with extra_needed("bench"):
            _bench(workload, quick, json_path, plot, nodes, durability, scale, workers, headline)
    except Stopped:
        console.print("bench stopped; its services and broker are stopped too")


def _bench(workload: str, quick: bool, json_path: Path | None, plot: Path | None, nodes: str | None,
           durability: bool, scale: str | None, skew_workers: int | None = None, headline: bool = False) -> None:
    """`bench` past its signal handling: the run, its JSON and its exit code."""
    from streamjoin.bench import WORKLOADS, run_bench

    options = _bench_options(workload, nodes, durability) | _skew_options(workload, skew_workers, headline)
    workers = _scale_option(workload, scale, quick)
    if workers is not None:
        from streamjoin.bench import scale as scale_bench

        options = {"runner": scale_bench.run, "worker_counts": workers}
    elif workload == "spill":  # in-process workers on simulated time: no broker, no Spark
        from streamjoin.bench import report, spill

        result = spill.run(quick, plot)
        if json_path is not None:
            report.write_json(json_path, result)
        print(json.dumps(result, indent=2))
        raise typer.Exit(0 if result.get("exact") else 1)
    if workload not in WORKLOADS:
        console.print(f"[red]error:[/red] unknown workload {workload!r}: choose one of {', '.join(sorted([*WORKLOADS, 'spill']))}")
        raise typer.Exit(2)
    result = run_bench(workload, quick=quick, json_path=json_path, plot_path=plot, **options)
    print(json.dumps(result, indent=2))
    raise typer.Exit(0 if result.get("exact") else 1)


def _bench_options(workload: str, nodes: str | None, durability: bool = False) -> dict:
    """The workload's own keywords from the bench options (nodes: --nodes as typed; durability:
    --durability); a bad value, or an option the workload does not take, exits 2 before anything starts."""
    if nodes is None and not durability:
        return {}
    if workload != "band":
        console.print(f"[red]error:[/red] --nodes and --durability are for `bench band` only, not {workload!r}")
        raise typer.Exit(2)
    from streamjoin.bench.band_workload import parse_nodes

    try:
        return ({"nodes": parse_nodes(nodes)} if nodes is not None else {}) | ({"durability": True} if durability else {})
    except ValueError as e:
        console.print(f"[red]error:[/red] {e}")
        raise typer.Exit(2) from None


def _skew_options(workload: str, workers: int | None, headline: bool) -> dict:
    """--workers and --headline as skew's keywords (none when not given); a count outside 1..8, or
    a workload other than skew, exits 2 before anything starts."""
    if workers is None and not headline:
        return {}
    if workload != "skew":
        console.print(f"[red]error:[/red] --workers and --headline are for `bench skew` only, not {workload!r}")
        raise typer.Exit(2)
    if workers is not None and not 1 <= workers <= MAX_SKEW_WORKERS:
        console.print(f"[red]error:[/red] --workers must lie in 1..{MAX_SKEW_WORKERS}, got {workers}")
        raise typer.Exit(2)
    return ({"workers": workers} if workers is not None else {}) | ({"headline": True} if headline else {})


def _scale_option(workload: str, scale: str | None, quick: bool) -> tuple[int, ...] | None:
    """--scale as worker counts (None when not given); a bad value, or a workload other than
    equijoin, exits 2 before anything starts."""
    if scale is None:
        return None
    if workload != "equijoin":
        console.print(f"[red]error:[/red] --scale is for `bench equijoin` only, not {workload!r}")
        raise typer.Exit(2)
    from streamjoin.bench import scale as scale_bench

    try:
        return scale_bench.parse_workers(scale, scale_bench.plan_for(quick).partitions)
    except ValueError as e:
        console.print(f"[red]error:[/red] {e}")
        raise typer.Exit(2) from None
