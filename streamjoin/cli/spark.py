"""The Spark jobs (the `spark` extra): the sources that write a job's workload, the exact
verification of its results, and the end-to-end demo that runs both around a local fleet.
Spark is imported inside each command, so the CLI starts where the extra is not installed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from streamjoin import logs
from streamjoin.cli.common import BootstrapOpt, JobOpt, cluster_of, console, job_settings, require_extra


def _name_spark_log() -> None:
    """Spark's own output is in a file, not on the terminal: say which."""
    from streamjoin.services.spark.session import spark_log_path

    console.print(f"Spark logs: {spark_log_path()}")


def sources(job: JobOpt = None, bootstrap: BootstrapOpt = None,
            seconds: Annotated[Optional[float],
                               typer.Option(min=0.1, help="how long the sources write (default workload.seconds)")]
            = None,
            rate: Annotated[Optional[float], typer.Option(min=0.1, help="tuples/s per stream")] = None) -> None:
    """Spark Structured Streaming job writing the job's workload (equijoin, band or images) into its input topics."""
    require_extra("spark")
    from streamjoin.services.spark.sources import run_sources

    s = job_settings(job, bootstrap=bootstrap)
    print(json.dumps(run_sources(s, cluster_of(s), seconds=seconds, rate=rate), indent=2))
    _name_spark_log()


def verify(job: JobOpt = None, bootstrap: BootstrapOpt = None,
           report: Annotated[Optional[Path], typer.Option(help="write the report JSON here")] = None,
           plot: Annotated[Optional[Path], typer.Option(help="write the delay plot PNG here")] = None) -> None:
    """Spark job: exact expected join vs. the results topic; exits 1 on any mismatch."""
    require_extra("spark")
    from streamjoin.services.spark.verify import run_verify

    s = job_settings(job, bootstrap=bootstrap)
    result = run_verify(s, cluster_of(s), report_path=report, plot_path=plot)
    print(json.dumps(result, indent=2))
    _name_spark_log()
    raise typer.Exit(0 if result["verified"] else 1)


def demo(
    seconds: Annotated[float, typer.Option(min=1, help="how long the sources write")] = 30,
    workers: Annotated[int, typer.Option(min=1, max=16, help="join worker processes")] = 2,
    report: Annotated[Path, typer.Option(help="report JSON path")] = Path("out/report.json"),
    job: JobOpt = None, bootstrap: BootstrapOpt = None,
    rate: Annotated[Optional[float], typer.Option(min=0.1, help="tuples/s per stream")] = None,
    partitions: Annotated[Optional[int], typer.Option(min=1, max=1000, help="partitions of every topic (partition "
                                                      "groups); default: the job's")] = None,
) -> None:
    """End to end: broker, coordinator, workers, Spark sources, drain, Spark verify, report.

    SIGTERM or Ctrl-C stops every process it started (broker included) and exits 0, no report."""
    require_extra("spark")
    from streamjoin.demo import run_demo
    from streamjoin.services.shutdown import Stopped, raise_on_signals

    s = job_settings(job, bootstrap=bootstrap, partitions=partitions)
    logs.configure("demo", level="WARNING")
    raise_on_signals()
    try:
        result = run_demo(s, seconds=seconds, workers=workers, report_path=report, rate=rate)
    except Stopped:
        console.print("demo stopped; its services and broker are stopped too")
        return
    keys = ("verified", "inputs", "results", "missing", "extra", "duplicates", "dead_letter", "delay_ms", "logs")
    print(json.dumps({k: result.get(k) for k in keys} | {"report": str(report)}, indent=2))
    raise typer.Exit(0 if result["verified"] else 1)
