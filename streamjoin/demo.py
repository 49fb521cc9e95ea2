"""`streamjoin demo`: the main job end to end on one machine.

Broker (embedded unless --bootstrap) -> topics -> coordinator + K workers as
processes (Spark's JVM starts while they do) -> Spark `sources` for N seconds
-> wait until the workers have committed every input -> Spark `verify` ->
report (JSON + delay plot).
The terminal shows progress and the report; Spark's own output goes to
`<report folder>/logs/spark.log`, the services' to `<report folder>/logs/<name>.log`,
and the report names both under "logs".
"""

from __future__ import annotations

import json
import tempfile
from contextlib import ExitStack
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from streamjoin.services import broker as embedded
from streamjoin.services.io import kafka
from streamjoin.launcher import Fleet, wait_drained, write_job
from streamjoin.settings import JobSettings
from streamjoin.topology import topics

console = Console(stderr=True, soft_wrap=True)  # soft wrap: paths stay whole on one line


def run_demo(job: JobSettings, seconds: float, workers: int, report_path: Path, rate: float | None = None) -> dict:
    from streamjoin.services.spark.sources import run_sources
    from streamjoin.services.spark.verify import run_verify

    report_path.parent.mkdir(parents=True, exist_ok=True)
    log_dir = report_path.parent / "logs"
    with ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="streamjoin-demo-")))
        bootstrap = job.bootstrap
        if not bootstrap:
            console.print("starting the embedded broker (Tansu)")
            b = embedded.start(log_path=workdir / "broker.log")
            stack.callback(b.stop)
            bootstrap = b.bootstrap
        job = job.model_copy(update={
            "bootstrap": bootstrap,
            "worker": job.worker.model_copy(update={"state_dir": workdir / "state"}),
            "coordinator": job.coordinator.model_copy(update={"expected_workers": workers}),
        })
        cluster = kafka.Cluster.of(job)
        topics.ensure(cluster.admin(), job)
        fleet = Fleet(job, write_job(job, workdir / "job.yaml"), bootstrap, log_dir)
        stack.callback(fleet.stop_all)
        ids = [f"worker-{i}" for i in range(workers)]
        fleet.start_coordinator()  # the services start while Spark does: each takes seconds
        for w in ids:
            fleet.start_worker(w)
        spark_log = _start_spark(log_dir / "spark.log")
        with console.status(f"starting coordinator and {workers} worker(s)"):
            fleet.wait_assigned(ids)
        console.print(f"running Spark sources for {seconds:.0f}s")
        produced = run_sources(job, cluster, seconds=seconds, rate=rate)
        with Progress(SpinnerColumn(), TextColumn("draining"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                      TimeElapsedColumn(), console=console) as progress:
            task = progress.add_task("drain", total=None)
            wait_drained(job, bootstrap, fleet, on_progress=lambda d, t: progress.update(task, completed=d, total=t))
        fleet.assert_running()
        console.print("running Spark verify")
        result = run_verify(job, cluster, report_path=report_path, plot_path=report_path.with_suffix(".png"))
        result["sources"] = produced
        result["logs"] = {"spark": str(spark_log) if spark_log else None, "services": str(log_dir.resolve())}
        report_path.write_text(json.dumps(result, indent=2))
        return result


def _start_spark(log_path: Path) -> Path | None:
    """Starts Spark, its output in `log_path`; returns the file it really logs to (another,
    when a Spark was already running in this process)."""
    from streamjoin.services.spark.kafka_source import local_session
    from streamjoin.services.spark.session import spark_log_path

    with console.status("starting Spark"):
        local_session("streamjoin-demo", log_path)
    where = spark_log_path()
    console.print(f"Spark logs: {where}")
    return where
