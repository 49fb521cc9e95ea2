"""The long-running services: the embedded broker, a join worker (hash-partitioned, PSP ring
node or SplitJoin core, dispatched on the job's join.mode), the SplitJoin merger, the
coordinator and the continuous-query service."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from streamjoin import logs
from streamjoin.cli.common import (BootstrapOpt, JobOpt, PortOpt, cluster_of, console, job_settings,
                                   need_splitjoin)
from streamjoin.settings import JobSettings


def _check_ring_job(settings: JobSettings) -> None:
    """UDFs are imported at start: an unknown or unimportable one fails fast with exit code 2."""
    from streamjoin.engine.predicates import PredicateError, compile_terms

    try:
        compile_terms([st.name for st in settings.streams], settings.join.predicate, settings.join.udfs)
    except PredicateError as e:
        console.print(f"[red]error:[/red] {e}")
        raise typer.Exit(2) from e


def broker(port: Annotated[int, typer.Option(help="loopback port (0 = any free port)")] = 0) -> None:
    """Start the embedded Kafka-compatible broker (Tansu, memory only) and wait.

    SIGTERM or Ctrl-C stops it and its Tansu child (which dies with this process even on
    SIGKILL: services/broker.py); exits 0 then, 1 if Tansu ended on its own."""
    from streamjoin.services import broker as embedded
    from streamjoin.services.shutdown import Stopped, raise_on_signals

    raise_on_signals()
    try:
        with embedded.start(port or None) as b:  # a stop while it starts: Tansu's death signal ends it
            print(b.bootstrap, flush=True)
            console.print(f"broker ready at {b.bootstrap}; Ctrl-C stops it (its records go with it)")
            code = b.process.wait()
    except Stopped:
        console.print("broker stopped")
        return
    console.print(f"[red]error:[/red] the broker exited on its own with code {code}")
    raise typer.Exit(1)


def worker(
    worker_id: Annotated[str, typer.Option("--worker-id", help="stable id; keeps its RocksDB state across restarts")],
    job: JobOpt = None, bootstrap: BootstrapOpt = None, metrics_port: PortOpt = None,
    core: Annotated[Optional[int], typer.Option("--core", help="splitjoin mode: this core's position (0..max_cores-1)")]
    = None,
) -> None:
    """Run a join worker (hash-partitioned, PSP ring node or SplitJoin core, as the job says)."""
    s = job_settings(job, bootstrap=bootstrap)
    logs.configure("worker", worker=worker_id)
    if s.join.mode == "splitjoin":
        if core is None or not 0 <= core < s.splitjoin.max_cores:
            console.print(f"[red]error:[/red] --core: a splitjoin worker needs its position 0..{s.splitjoin.max_cores - 1} "
                          f"(splitjoin.max_cores), got {core}")
            raise typer.Exit(2)
        _check_ring_job(s)
        from streamjoin.services.splitjoin.core import run_core

        run_core(s, cluster_of(s), core, worker_id, metrics_port)
    elif s.join.mode == "ring":
        from streamjoin.services.ring.node import run_ring_worker

        _check_ring_job(s)
        run_ring_worker(s, cluster_of(s), worker_id, metrics_port)
    else:
        from streamjoin.services.hash.main import run_worker

        run_worker(s, cluster_of(s), worker_id, metrics_port)


def queries(job: JobOpt = None, bootstrap: BootstrapOpt = None,
            work_dir: Annotated[Path, typer.Option(help="operator versions' job files and logs")] = Path("out/queries"),
            port: Annotated[Optional[int], typer.Option(help="the HTTP API's port (default queries.port)")] = None,
            ) -> None:
    """Run the continuous-query service: the HTTP API, the planner, the router; it runs each
    shared operator's versions as local hash-mode fleets."""
    s = job_settings(job, bootstrap=bootstrap, queries={"port": port} if port is not None else {})
    logs.configure("queries")
    from streamjoin.launcher import FleetDeployer
    from streamjoin.services.queries.main import serve

    cluster = cluster_of(s)
    serve(s, cluster, FleetDeployer(cluster.bootstrap, work_dir))


def merger(job: JobOpt = None, bootstrap: BootstrapOpt = None, metrics_port: PortOpt = None) -> None:
    """Run the SplitJoin merger: the cores' results into the results topic, in input order."""
    s = job_settings(job, bootstrap=bootstrap)
    need_splitjoin(s, "merger")
    from streamjoin.services.splitjoin.merger import run_merger

    logs.configure("merger")
    run_merger(s, cluster_of(s), metrics_port)


def coordinator(job: JobOpt = None, bootstrap: BootstrapOpt = None, metrics_port: PortOpt = None) -> None:
    """Run the coordinator: placement, heartbeats, assignments."""
    from streamjoin.services.coordinator.main import run_coordinator

    s = job_settings(job, bootstrap=bootstrap)
    logs.configure("coordinator")
    run_coordinator(s, cluster_of(s), metrics_port)
